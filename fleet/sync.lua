-- kvthrottle fleet sync: one call per instance per grant period.
--
-- The caller reports its usage and demand per bucket; the script records
-- them, ignores instances whose lease ran out, and gives the caller its
-- shares of every fleet limit. A share is computed by weighted max-min
-- (water-filling) over the demands of the live instances, then clamped so
-- that the shares held by all live instances never add up to more than the
-- limit: a share given to one instance is taken back from another only when
-- that one calls and lowers its own. Time is Redis's (TIME), in ms.
--
-- KEYS[1] config  hash: version, state (the fleet's state document, JSON)
-- KEYS[2] members hash: instance -> "lastseen_ms epoch seq lease_ms"
-- KEYS[3] entries hash: bucket.."|"..instance -> "cap weight res hard cum";
--                       "|"..instance (the free pool) -> "cap weight fp"
-- KEYS[4] usage   hash: bucket -> units used by the whole fleet, ever
--
-- ARGV: instance, epoch, seq, lease_ms, known_version,
--       free_pool, fp_cap, fp_weight, nbuckets,
--       then per bucket: name, reserved, hard, cum, cap, weight.
-- A limit or cap of -1 means unlimited. cum is the caller's own running
-- total of units used in that bucket since its epoch began.
--
-- Reply: {status, now_ms, live_instances, version, state_or_empty,
--         fp_grant, name, res_grant, hard_grant, fleet_units, ...}
-- status: "ok"; "stale" (seq not newer than one already recorded: nothing
-- changed, nothing else returned); "seed" (the store holds no state yet).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local inst, epoch = ARGV[1], ARGV[2]
local seq, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local forget = 3600000
local known = ARGV[5]

local version = redis.call('HGET', KEYS[1], 'version')
if not version then
  return {'seed', now}
end

local function fields(s)
  local out = {}
  for w in string.gmatch(s, '%S+') do out[#out + 1] = tonumber(w) end
  return out
end

-- Members: who is alive, is the caller's report new?
local others = {}
local fresh = true
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  local name, rec = raw[i], raw[i + 1]
  local lastseen, ep, sq, ls = string.match(rec, '^(%S+) (%S+) (%S+) ?(%S*)$')
  local itsLease = tonumber(ls) or lease
  if name == inst then
    if ep == epoch then
      if tonumber(sq) >= seq then
        return {'stale', now}
      end
      fresh = false
    end
  elseif tonumber(lastseen) + itsLease >= now then
    others[#others + 1] = name
  elseif tonumber(lastseen) + forget < now then
    -- Gone for long: forget the instance and its entries. (An instance
    -- whose lease merely ran out keeps them, so that its running totals
    -- count once if it comes back; its shares count for nothing.)
    redis.call('HDEL', KEYS[2], name)
    local suffix = '|' .. name
    local keys = redis.call('HKEYS', KEYS[3])
    for _, k in ipairs(keys) do
      if string.sub(k, -#suffix) == suffix then redis.call('HDEL', KEYS[3], k) end
    end
  end
end
redis.call('HSET', KEYS[2], inst, string.format('%.0f', now) .. ' ' .. epoch .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])

-- share returns the caller's part of limit among the demands (caps[1],
-- ws[1] are the caller's): weighted max-min, where a demand that is
-- satisfied below the common level keeps what it asks and the rest is
-- split by weight; what nobody asks for is split by weight among all.
local function share(limit, caps, ws)
  local n = #caps
  local order, wsum = {}, 0
  for k = 1, n do
    order[k] = k
    wsum = wsum + ws[k]
  end
  local function ratio(k)
    if caps[k] < 0 then return math.huge end
    return caps[k] / ws[k]
  end
  table.sort(order, function(a, b) return ratio(a) < ratio(b) end)
  local rem, wrem = limit, wsum
  local mine
  for _, k in ipairs(order) do
    if caps[k] < 0 or caps[k] > rem * ws[k] / wrem then
      -- This demand and all after it exceed the common level: they share
      -- what is left by weight.
      if mine == nil then mine = rem * ws[1] / wrem end
      return mine
    end
    rem = rem - caps[k]
    wrem = wrem - ws[k]
    if k == 1 then mine = caps[1] end
  end
  -- Every demand met: hand out the rest by weight, so that an instance
  -- whose load grows has room at once.
  return mine + rem * ws[1] / wsum
end

-- entries reads, in one command, the caller's entry (self) and those of
-- the other live instances (prefix .. name); it returns the caller's
-- parsed entry (or nil) and the others' (missing ones left out).
local function entries(self, prefix)
  local fs = {self}
  for j, name in ipairs(others) do fs[j + 1] = prefix .. name end
  local vals = redis.call('HMGET', KEYS[3], unpack(fs))
  local mine = vals[1] and fields(vals[1])
  local theirs = {}
  for j = 2, #vals do
    if vals[j] then theirs[#theirs + 1] = fields(vals[j]) end
  end
  return mine, theirs
end

-- grant computes and clamps the caller's share of limit among the others'
-- entries ({cap, weight, ...}, the share each holds of this limit at
-- position grantAt); cur is the caller's share so far (-1: none). A
-- saturated caller whose new share would be lower than its share so far
-- by at most a tenth keeps it: demand measured from waiting callers is
-- noisy, and every share that moves is unused for up to a period (the
-- instance giving it up lowers at once, the one taking it raises at its
-- next call).
local function grant(limit, cap, weight, theirs, grantAt, cur)
  if limit < 0 then return -1 end
  local caps, ws = {cap}, {weight}
  local held = 0
  for _, e in ipairs(theirs) do
    caps[#caps + 1] = e[1]
    ws[#ws + 1] = e[2]
    if e[grantAt] > 0 then held = held + e[grantAt] end
  end
  local g = math.floor(share(limit, caps, ws))
  if cap < 0 and g < cur and g >= cur - cur / 10 then g = cur end
  local room = limit - held
  if g > room then g = room end
  if g < 0 then g = 0 end
  return g
end

local function weight(w)
  w = tonumber(w)
  if w < 0.001 then return 0.001 end
  return w
end

local reply = {'ok', now, #others + 1, tonumber(version), '', 0}
if version ~= known then
  reply[5] = redis.call('HGET', KEYS[1], 'state') or ''
end

local nb = tonumber(ARGV[9])
local a = 10
for _ = 1, nb do
  local name = ARGV[a]
  local reserved, hard = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cum, cap, w = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), weight(ARGV[a + 5])
  a = a + 6
  local self = name .. '|' .. inst
  local used = cum
  local curRes, curHard = -1, -1
  local mine, theirs = entries(self, name .. '|')
  if mine then
    curRes, curHard = mine[3], mine[4]
    if not fresh and cum >= mine[5] then used = cum - mine[5] end
  end
  local total = redis.call('HINCRBY', KEYS[4], name, used)
  local res = grant(reserved, cap, w, theirs, 3, curRes)
  local hrd = grant(hard, cap, w, theirs, 4, curHard)
  if hrd >= 0 and res > hrd then res = hrd end
  redis.call('HSET', KEYS[3], self, string.format('%.0f %.3f %.0f %.0f %.0f', cap, w, res, hrd, cum))
  reply[#reply + 1] = name
  reply[#reply + 1] = res
  reply[#reply + 1] = hrd
  reply[#reply + 1] = total
end

local fpCap, fpW = tonumber(ARGV[7]), weight(ARGV[8])
local curFp = -1
local mineFp, theirsFp = entries('|' .. inst, '|')
if mineFp then curFp = mineFp[3] end
local fp = grant(tonumber(ARGV[6]), fpCap, fpW, theirsFp, 3, curFp)
redis.call('HSET', KEYS[3], '|' .. inst, string.format('%.0f %.3f %.0f', fpCap, fpW, fp))
reply[6] = fp
return reply
