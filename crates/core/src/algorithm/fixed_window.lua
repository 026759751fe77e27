-- fixed_window (fixed_window.rs): `used` hits in the window `es` falls in.
--
-- One branch of src/store/redis.lua's per-counter decision, pasted in by the Redis store
-- (`algorithm == CODE`). It reads `raw` (the key's value, '' when missing), `es`, `en` (the
-- decision time: seconds, nanoseconds), `cost`, `charge` (0 admitted, 1 always, 2 refund),
-- `rpu`, `unit` (the window, seconds: unit x unit_multiplier), `burst`, `interval` (ns per token) and MARGIN_MS; it sets
-- `admitted = false` when the check is denied, and `state` (the value to write) and `ttl`
-- (milliseconds) when the counter changes. The helpers `plus`, `fmod`, `floor`, `min`,
-- `pack`, `unpack` and `E9` (10^9) are the script's.
local w = (es - fmod(es, unit)) / unit
local used = 0
if raw ~= '' then
  local ts, _, stored = unpack('<ddd', raw)
  if (ts - fmod(ts, unit)) / unit == w then
    used = stored
  end
end
local c = cost
if charge == 2 then
  c = -min(cost, used)
elseif used + cost > rpu then
  admitted = false
  c = nil
  if charge == 1 and used < rpu then
    c = rpu - used
  elseif charge == 1 then
    c = 0
  end
end
if c then
  state = pack('<ddd', es, en, used + c)
  ttl = floor((((w + 1) * unit - es) * E9 - en) / 1000000) + 1 + MARGIN_MS
end
