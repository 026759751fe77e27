-- sliding_window (sliding_window.rs): the previous window's count weighted by its overlap,
-- plus the current one's.
--
-- One branch of src/store/redis.lua's per-counter decision, pasted in by the Redis store
-- (`algorithm == CODE`). It reads `raw` (the key's value, '' when missing), `es`, `en` (the
-- decision time: seconds, nanoseconds), `cost`, `charge` (0 admitted, 1 always, 2 refund),
-- `rpu`, `unit` (the window, seconds: unit x unit_multiplier), `burst`, `interval` (ns per token) and MARGIN_MS; it sets
-- `admitted = false` when the check is denied, and `state` (the value to write) and `ttl`
-- (milliseconds) when the counter changes. The helpers `plus`, `fmod`, `floor`, `min`,
-- `pack`, `unpack` and `E9` (10^9) are the script's.
local w = (es - fmod(es, unit)) / unit
local prev, cur = 0, 0
if raw ~= '' then
  local ts, _, p, c = unpack('<dddd', raw)
  local stored = (ts - fmod(ts, unit)) / unit
  if stored == w then
    prev, cur = p, c
  elseif stored + 1 == w then
    prev = c
  end
end
local room = rpu - cur - cost
-- The previous window's weight: ceil(prev * left / len), left = len - elapsed.
local r = fmod(es, unit)
local lh, ll = unit - r, 0
if en > 0 then
  lh, ll = unit - r - 1, E9 - en
end
local x = prev * ll
local xr = fmod(x, E9)
local y = prev * lh + (x - xr) / E9
local yr = fmod(y, unit)
local weight = (y - yr) / unit
if yr > 0 or xr > 0 then
  weight = weight + 1
end
local c = cost
if charge == 2 then
  c = -min(cost, cur)
elseif room < 0 or weight > room then
  admitted = false
  c = nil
  if charge == 1 then
    -- What is left: the limit less the current count and the previous one's weight.
    c = rpu - cur - weight
    if c < 0 then
      c = 0
    end
  end
end
if c then
  state = pack('<dddd', es, en, prev, cur + c)
  ttl = floor((lh * E9 + ll) / 1000000) + 1 + MARGIN_MS + unit * 1000
end
