-- ratekeeper: decides the checks of one request atomically (see src/store/redis.rs).
--
-- ARGV: now_s, now_n (the caller's clock: Unix seconds and nanoseconds), margin_ms (how long
-- a key outlives the moment its state stops mattering: --store-ttl-margin), then the checks
-- packed in one string of little-endian doubles: per check: cost, charge, counters, then per
-- counter: algorithm (its code: 0 fixed_window, 1 sliding_window, 2 token_bucket, 3 gcra),
-- requests_per_unit, unit (the window in seconds: unit x unit_multiplier), burst, interval (ns per token, buckets only).
--
-- The charge says what deciding the check does (src/algorithm.rs, `Charge`): 0, admitted
-- hits are counted and a rejected check writes nothing; 1, a rejected check is counted
-- too: each counter takes what it has left, up to the cost (`remaining` below; the limit
-- ends exhausted, never in debt); 2, a refund: each counter gives the cost back, never
-- below zero used nor above its capacity, and the check is admitted.
-- KEYS: one per counter, in the same order.
--
-- A key holds little-endian doubles (struct.pack '<d...'): the time it was last written
-- (seconds, nanoseconds; never going backwards) and the algorithm's state: fixed: used;
-- sliding: previous, current; token bucket: tokens, last_s, last_n; gcra: tat_s, tat_n.
-- A check is decided at the latest of the caller's clock and its keys' times, so a node
-- whose clock is behind cannot rewind a counter.
--
-- The answer is one string: per check, one byte admitted (1) or not (0), then per counter
-- one byte, the length of the key's value as read (before this check; 0 when missing), and
-- that value. The caller re-derives every decision from those with the same Rust code as
-- the in-memory store; this script only has to agree on "admitted" and write the consumed
-- state.
--
-- Arithmetic is exact: Lua numbers are doubles, so times stay split in seconds and
-- nanoseconds, and every product and difference is kept below 2^53 by the limits the
-- store refuses at load (sliding windows up to 9,007,199 per unit, buckets refilling
-- within 2^53 ns). math.fmod is exact; `%` is not.
--
-- No partial effects: every check of the batch is decided before anything is written (a key
-- named again later in the batch reads what an earlier check would write), so an error
-- anywhere in the script writes nothing, and the whole batch, answered by the failure
-- policy, has consumed nothing.
--
-- Written for speed: it runs once per batch of requests, so it defines one function, builds
-- no table per counter read and converts no number from text but the first three.

local E9 = 1000000000
local fmod, floor, min = math.fmod, math.floor, math.min
local pack, unpack = struct.pack, struct.unpack
local char = string.char
local call = redis.call

-- (s, n) + d nanoseconds, 0 <= d < 2^53.
local function plus(s, n, d)
  local dn = fmod(d, E9)
  s, n = s + (d - dn) / E9, n + dn
  if n >= E9 then
    return s + 1, n - E9
  end
  return s, n
end

local now_s, now_n = tonumber(ARGV[1]), tonumber(ARGV[2])
local MARGIN_MS = tonumber(ARGV[3])
local checks = ARGV[4]
local out, o = {}, 0
local raws, states, ttls = {}, {}, {}
-- The writes, made once every check is decided: key -> state and TTL.
local pending, pending_ttl = {}, {}
local at, key = 1, 1
local size = #checks
while at <= size do
  local cost, charge, count
  cost, charge, count, at = unpack('<ddd', checks, at)
  if charge ~= 0 and charge ~= 1 and charge ~= 2 then
    return redis.error_reply('ratekeeper: unknown charge code ' .. charge)
  end
  -- Read every counter of the check; decide at the latest time among them and now.
  local es, en = now_s, now_n
  for i = 1, count do
    local name = KEYS[key + i - 1]
    local raw = pending[name]
    if raw == nil then
      raw = call('GET', name)
    end
    if raw then
      local ts, tn = unpack('<dd', raw)
      if ts > es or (ts == es and tn > en) then
        es, en = ts, tn
      end
    else
      raw = ''
    end
    raws[i] = raw
  end
  local admitted = true
  for i = 1, count do
    local algorithm, rpu, unit, burst, interval
    algorithm, rpu, unit, burst, interval, at = unpack('<ddddd', checks, at)
    local raw = raws[i]
    local state, ttl = nil, nil
    if rpu <= 0 then
      -- Denies everything; a refund is admitted and has nothing to give back.
      if charge ~= 2 then
        admitted = false
      end
    -- ALGORITHMS: one `elseif algorithm == CODE then` branch per algorithm, from
    -- crates/core/src/algorithm/NAME.lua (see `algorithm::lua_branches`).
    else
      -- A code this script does not know (a newer ratekeeper's algorithm): refuse the call
      -- before anything is written, never decide it as another algorithm.
      return redis.error_reply('ratekeeper: unknown algorithm code ' .. algorithm)
    end
    states[i], ttls[i] = state, ttl
  end
  if cost > 0 and (admitted or charge == 1) then
    for i = 1, count do
      local name = KEYS[key + i - 1]
      if states[i] then
        pending[name], pending_ttl[name] = states[i], ttls[i]
      end
    end
  end
  o = o + 1
  out[o] = admitted and '\1' or '\0'
  for i = 1, count do
    local raw = raws[i]
    out[o + 1], out[o + 2] = char(#raw), raw
    o = o + 2
  end
  key = key + count
end
for name, state in pairs(pending) do
  call('SET', name, state, 'PX', pending_ttl[name])
end
return table.concat(out)
