-- token_bucket (token_bucket.rs): whole tokens, refilled at one per `interval` ns up to `burst`.
--
-- One branch of src/store/redis.lua's per-counter decision, pasted in by the Redis store
-- (`algorithm == CODE`). It reads `raw` (the key's value, '' when missing), `es`, `en` (the
-- decision time: seconds, nanoseconds), `cost`, `charge` (0 admitted, 1 always, 2 refund),
-- `rpu`, `unit` (the window, seconds: unit x unit_multiplier), `burst`, `interval` (ns per token) and MARGIN_MS; it sets
-- `admitted = false` when the check is denied, and `state` (the value to write) and `ttl`
-- (milliseconds) when the counter changes. The helpers `plus`, `fmod`, `floor`, `min`,
-- `pack`, `unpack` and `E9` (10^9) are the script's.
local tokens, ls, ln = burst, es, en
if raw ~= '' then
  local _, _, t, s, n = unpack('<ddddd', raw)
  tokens, ls, ln = min(t, burst), s, n
  if ls > es or (ls == es and ln > en) then
    ls, ln = es, en
  end
end
-- Full again at last + burst * interval.
local fs, fn = plus(ls, ln, burst * interval)
if not (fs > es or (fs == es and fn > en)) then
  tokens, ls, ln = burst, es, en
else
  local diff = (es - ls) * E9 + (en - ln)
  local earned = (diff - fmod(diff, interval)) / interval
  if tokens + earned >= burst then
    tokens, ls, ln = burst, es, en
  else
    tokens = tokens + earned
    ls, ln = plus(ls, ln, earned * interval)
  end
end
local write = true
if charge == 2 then
  tokens = min(burst, tokens + cost)
  if tokens == burst then
    -- Full: its clock restarts now, as a full bucket's does.
    ls, ln = es, en
  end
elseif cost > tokens then
  admitted = false
  -- Counting a rejected check: it takes every token left.
  write = charge == 1
  tokens = 0
else
  tokens = tokens - cost
end
if write then
  local refill = (burst - tokens) * interval - ((es - ls) * E9 + (en - ln))
  state = pack('<ddddd', es, en, tokens, ls, ln)
  ttl = floor(refill / 1000000) + 1 + MARGIN_MS
end
