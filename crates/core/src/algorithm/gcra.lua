-- gcra (gcra.rs): the theoretical arrival time, `interval` ns per hit, `burst` at once.
--
-- One branch of src/store/redis.lua's per-counter decision, pasted in by the Redis store
-- (`algorithm == CODE`). It reads `raw` (the key's value, '' when missing), `es`, `en` (the
-- decision time: seconds, nanoseconds), `cost`, `charge` (0 admitted, 1 always, 2 refund),
-- `rpu`, `unit` (the window, seconds: unit x unit_multiplier), `burst`, `interval` (ns per token) and MARGIN_MS; it sets
-- `admitted = false` when the check is denied, and `state` (the value to write) and `ttl`
-- (milliseconds) when the counter changes. The helpers `plus`, `fmod`, `floor`, `min`,
-- `pack`, `unpack` and `E9` (10^9) are the script's.
local ts, tn = es, en
if raw ~= '' then
  local _, _, s, n = unpack('<dddd', raw)
  if s > es or (s == es and n > en) then
    ts, tn = s, n
  end
end
local ahead0 = (ts - es) * E9 + (tn - en)
local ahead = ahead0 + interval * cost
local ns, nn = nil, nil
if charge == 2 then
  -- Back to `es` at most; cost * interval is exact below burst * interval.
  local back = ahead0
  if cost < burst then
    back = min(cost * interval, ahead0)
  end
  ahead = ahead0 - back
  ns, nn = plus(es, en, ahead)
elseif cost > burst or ahead > interval * burst then
  admitted = false
  if charge == 1 then
    -- Counting a rejected check: it takes the whole intervals left.
    local room = interval * burst - ahead0
    if room < 0 then
      room = 0
    end
    ahead = ahead0 + (room - fmod(room, interval))
    ns, nn = plus(es, en, ahead)
  end
else
  ns, nn = plus(ts, tn, interval * cost)
end
if ns then
  state = pack('<dddd', es, en, ns, nn)
  ttl = floor(ahead / 1000000) + 1 + MARGIN_MS
end
