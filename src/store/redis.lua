-- ratekeeper: decides the checks of one request atomically (see src/store/redis.rs).
--
-- ARGV: now_s, now_n (the caller's clock: Unix seconds and nanoseconds), then per check:
--   cost, counters, then per counter: algorithm (0 fixed_window, 1 sliding_window,
--   2 token_bucket, 3 gcra), requests_per_unit, unit (seconds), burst, interval (ns per
--   token, buckets only).
-- KEYS: one per counter, in the same order.
--
-- A key holds "t_s t_n x y z": the time it was last written (never going backwards) and
-- the algorithm's state (fixed: used; sliding: previous current; token bucket: tokens
-- last_s last_n; gcra: tat_s tat_n). A check is decided at the latest of the caller's
-- clock and its keys' times, so a node whose clock is behind cannot rewind a counter.
--
-- The answer, per check: admitted (1/0), then per counter: present (1/0) and the five
-- stored numbers as read (before this check). The caller re-derives every decision from
-- those with the same Rust code as the in-memory store; this script only has to agree
-- on "admitted" and write the consumed state.
--
-- Arithmetic is exact: Lua numbers are doubles, so times stay split in seconds and
-- nanoseconds, and every product and difference is kept below 2^53 by the limits the
-- store refuses at load (sliding windows up to 9,007,199 per unit, buckets refilling
-- within 2^53 ns). math.fmod is exact; `%` is not.

local E9 = 1000000000
local MARGIN_MS = 1000
local fmod, floor = math.fmod, math.floor

local function later(as, an, bs, bn)
  return as > bs or (as == bs and an > bn)
end

-- (s, n) + d nanoseconds, 0 <= d < 2^53.
local function plus(s, n, d)
  local dn = fmod(d, E9)
  s = s + (d - dn) / E9
  n = n + dn
  if n >= E9 then
    return s + 1, n - E9
  end
  return s, n
end

-- a - b in nanoseconds, for a >= b less than 2^53 apart.
local function minus(as, an, bs, bn)
  return (as - bs) * E9 + (an - bn)
end

local function ms(nanos)
  return floor(nanos / 1000000) + 1 + MARGIN_MS
end

local function window(s, unit)
  return (s - fmod(s, unit)) / unit
end

-- Each returns admitted, then (when admitted) the state to store and its TTL in ms.
local decide = {}

decide[0] = function(c, f, es, en, cost)
  local w = window(es, c.unit)
  local used = 0
  if f and window(f[1], c.unit) == w then
    used = f[3]
  end
  if used + cost > c.rpu then
    return false
  end
  local left = ((w + 1) * c.unit - es) * E9 - en
  return true, string.format('%d %d %d', es, en, used + cost), ms(left)
end

decide[1] = function(c, f, es, en, cost)
  local w = window(es, c.unit)
  local prev, cur = 0, 0
  if f then
    local stored = window(f[1], c.unit)
    if stored == w then
      prev, cur = f[3], f[4]
    elseif stored + 1 == w then
      prev = f[4]
    end
  end
  local room = c.rpu - cur - cost
  if room < 0 then
    return false
  end
  -- The previous window's weight: ceil(prev * left / len), left = len - elapsed, all split.
  local r = fmod(es, c.unit)
  local lh, ll = c.unit - r, 0
  if en > 0 then
    lh, ll = c.unit - r - 1, E9 - en
  end
  local x = prev * ll
  local xr = fmod(x, E9)
  local y = prev * lh + (x - xr) / E9
  local yr = fmod(y, c.unit)
  local weight = (y - yr) / c.unit
  if yr > 0 or xr > 0 then
    weight = weight + 1
  end
  if weight > room then
    return false
  end
  local ttl = ms(lh * E9 + ll) + c.unit * 1000
  return true, string.format('%d %d %d %d', es, en, prev, cur + cost), ttl
end

decide[2] = function(c, f, es, en, cost)
  local tokens, ls, ln = c.burst, es, en
  if f then
    tokens, ls, ln = math.min(f[3], c.burst), f[4], f[5]
    if later(ls, ln, es, en) then
      ls, ln = es, en
    end
  end
  local full_s, full_n = plus(ls, ln, c.burst * c.interval)
  if not later(full_s, full_n, es, en) then
    tokens, ls, ln = c.burst, es, en
  else
    local diff = minus(es, en, ls, ln)
    local earned = (diff - fmod(diff, c.interval)) / c.interval
    if tokens + earned >= c.burst then
      tokens, ls, ln = c.burst, es, en
    else
      tokens = tokens + earned
      ls, ln = plus(ls, ln, earned * c.interval)
    end
  end
  if cost > tokens then
    return false
  end
  tokens = tokens - cost
  local refill = (c.burst - tokens) * c.interval - minus(es, en, ls, ln)
  return true, string.format('%d %d %d %d %d', es, en, tokens, ls, ln), ms(refill)
end

decide[3] = function(c, f, es, en, cost)
  local ts, tn = es, en
  if f and later(f[3], f[4], es, en) then
    ts, tn = f[3], f[4]
  end
  if cost > c.burst then
    return false
  end
  local ahead = minus(ts, tn, es, en) + c.interval * cost
  if ahead > c.interval * c.burst then
    return false
  end
  local ns, nn = plus(ts, tn, c.interval * cost)
  return true, string.format('%d %d %d %d', es, en, ns, nn), ms(ahead)
end

local now_s, now_n = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local arg, key = 3, 1
while arg <= #ARGV do
  local cost, count = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1])
  arg = arg + 2
  local counters = {}
  local es, en = now_s, now_n
  for i = 1, count do
    local c = {
      algorithm = tonumber(ARGV[arg]),
      rpu = tonumber(ARGV[arg + 1]),
      unit = tonumber(ARGV[arg + 2]),
      burst = tonumber(ARGV[arg + 3]),
      interval = tonumber(ARGV[arg + 4]),
      key = KEYS[key],
    }
    arg, key = arg + 5, key + 1
    local raw = redis.call('GET', c.key)
    if raw then
      local f = {}
      for number in string.gmatch(raw, '%S+') do
        f[#f + 1] = tonumber(number)
      end
      for j = #f + 1, 5 do
        f[j] = 0
      end
      c.f = f
      if later(f[1], f[2], es, en) then
        es, en = f[1], f[2]
      end
    end
    counters[i] = c
  end
  local admitted = true
  for _, c in ipairs(counters) do
    local ok, state, ttl = false, nil, nil
    if c.rpu > 0 then
      ok, state, ttl = decide[c.algorithm](c, c.f, es, en, cost)
    end
    c.state, c.ttl = state, ttl
    admitted = admitted and ok
  end
  if admitted and cost > 0 then
    for _, c in ipairs(counters) do
      redis.call('SET', c.key, c.state, 'PX', c.ttl)
    end
  end
  out[#out + 1] = admitted and 1 or 0
  for _, c in ipairs(counters) do
    local f = c.f
    if f then
      out[#out + 1] = 1
      for j = 1, 5 do
        out[#out + 1] = f[j]
      end
    else
      for _ = 1, 6 do
        out[#out + 1] = 0
      end
    end
  end
end
return out
