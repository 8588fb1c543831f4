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
-- KEYS[1] config  hash: version, state (the fleet's state document, JSON),
--                       id (names this life of the store), seeded_at (ms)
-- KEYS[2] members hash: instance -> "lastseen_ms epoch seq lease_ms"
-- KEYS[3] entries hash: bucket.."|"..instance ->
--                         "cap weight res hard cum reserved_limit hard_limit";
--                       "|"..instance (the free pool) -> "cap weight fp free_pool"
-- KEYS[4] usage   hash: bucket -> units used by the whole fleet, ever
--
-- ARGV: instance, epoch, seq, lease_ms, known_token, hint_instances,
--       free_pool, fp_cap, fp_weight, nbuckets,
--       then per bucket: name, reserved, hard, cum, cap, weight.
-- A limit or cap of -1 means unlimited. cum is the caller's own running
-- total of units used in that bucket since its epoch began. known_token is
-- "id:version" of the state document the caller has ("" for none);
-- hint_instances the number of live instances it last knew of.
--
-- Reply: {status, now_ms, live_instances, token, state_or_empty,
--         fp_grant, name, res_grant, hard_grant, fleet_units, ...}
-- status: "ok"; "stale" (seq not newer than one already recorded: nothing
-- changed, nothing else returned); "seed" (the store holds no state yet);
-- "conflict" (another live instance reports under the same name).
--
-- Records that do not parse (written by something else) are dropped or
-- ignored, never trusted: a member record is deleted, an entry counts as
-- absent, a version that is not a number means "no state".

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local inst, epoch = ARGV[1], ARGV[2]
local seq, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local known, hint = ARGV[5], tonumber(ARGV[6]) or 1
local forget = 3600000

local cfg = redis.call('HMGET', KEYS[1], 'version', 'id', 'seeded_at')
local version = tonumber(cfg[1])
if not version then
  return {'seed', now}
end
local token = (cfg[2] or '') .. ':' .. cfg[1]
local seededAt = tonumber(cfg[3]) or 0

-- fields parses a record of n numbers; nil when it is not one.
local function fields(s, n)
  local out = {}
  for w in string.gmatch(s, '%S+') do
    local v = tonumber(w)
    if v == nil then return nil end
    out[#out + 1] = v
  end
  if #out < n then return nil end
  return out
end

local function forgetMember(name)
  redis.call('HDEL', KEYS[2], name)
  local suffix = '|' .. name
  local keys = redis.call('HKEYS', KEYS[3])
  for _, k in ipairs(keys) do
    if string.sub(k, -#suffix) == suffix then redis.call('HDEL', KEYS[3], k) end
  end
end

-- Members: who is alive, is the caller's report new, is its name its own?
local others = {}
local fresh = true
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  local name, rec = raw[i], raw[i + 1]
  local lastseen, ep, sq, ls = string.match(rec, '^(%d+) (%S+) (%d+) (%d+)$')
  lastseen, sq, ls = tonumber(lastseen), tonumber(sq), tonumber(ls)
  if not (lastseen and sq and ls) then
    redis.call('HDEL', KEYS[2], name)
  elseif name == inst then
    if ep == epoch then
      if sq >= seq then
        return {'stale', now}
      end
      fresh = false
    elseif lastseen + ls >= now and seq > 1 then
      -- A different run of this name is alive, and the caller is no
      -- newly started instance taking its name back: two instances share
      -- one name.
      return {'conflict', now}
    end
  elseif lastseen + ls >= now then
    others[#others + 1] = name
  elseif lastseen + forget < now then
    -- Gone for long: forget the instance and its entries. (An instance
    -- whose lease merely ran out keeps them, so that its running totals
    -- count once if it comes back; its shares count for nothing.)
    forgetMember(name)
  end
end
redis.call('HSET', KEYS[2], inst, string.format('%.0f', now) .. ' ' .. epoch .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])

-- Instances the caller knew of that have not called since the store was
-- seeded: for one lease after seeding each may still hold its share from
-- the store's earlier life, a hint-th of each limit.
local phantoms = 0
if now - seededAt < lease and hint > #others + 1 then
  phantoms = hint - #others - 1
end

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
-- the other live instances (prefix .. name), each of at least n numbers;
-- it returns the caller's parsed entry (or nil) and the others' (missing
-- and malformed ones left out).
local function entries(self, prefix, n)
  local fs = {self}
  for j, name in ipairs(others) do fs[j + 1] = prefix .. name end
  local vals = redis.call('HMGET', KEYS[3], unpack(fs))
  local mine = vals[1] and fields(vals[1], n)
  local theirs = {}
  for j = 2, #vals do
    local e = vals[j] and fields(vals[j], n)
    if e then theirs[#theirs + 1] = e end
  end
  return mine, theirs
end

-- grant computes and clamps the caller's share of limit among the others'
-- entries ({cap, weight, ...}, the share each holds of this limit at
-- position grantAt, the limit as each has it at limitAt); cur is the
-- caller's share so far (-1: none).
--
-- The limit is the lowest any live instance has: instances whose
-- configurations disagree (a file changed on one, a change on its way)
-- never add up to more than the lowest. A saturated caller whose new share
-- would be lower than its share so far by at most a tenth keeps it: demand
-- measured from waiting callers is noisy, and every share that moves is
-- unused for up to a period (the instance giving it up lowers at once, the
-- one taking it raises at its next call).
local function grant(limit, cap, weight, theirs, grantAt, limitAt, cur)
  for _, e in ipairs(theirs) do
    local l = e[limitAt]
    if l and l >= 0 and (limit < 0 or l < limit) then limit = l end
  end
  if limit < 0 then return -1, -1 end
  local caps, ws = {cap}, {weight}
  local held = phantoms * math.floor(limit / hint)
  for _, e in ipairs(theirs) do
    caps[#caps + 1] = e[1]
    ws[#ws + 1] = math.max(e[2], 0.001)
    if e[grantAt] > 0 then held = held + e[grantAt] end
  end
  local g = math.floor(share(limit, caps, ws))
  if cap < 0 and g < cur and g >= cur - cur / 10 then g = cur end
  local room = limit - held
  if g > room then g = room end
  if g < 0 then g = 0 end
  return g, limit
end

local function weight(w)
  w = tonumber(w)
  if w < 0.001 then return 0.001 end
  return w
end

local reply = {'ok', now, #others + 1, token, '', 0}
if token ~= known then
  reply[5] = redis.call('HGET', KEYS[1], 'state') or ''
end

local nb = tonumber(ARGV[10])
local a = 11
for _ = 1, nb do
  local name = ARGV[a]
  local reserved, hard = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cum, cap, w = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), weight(ARGV[a + 5])
  a = a + 6
  local self = name .. '|' .. inst
  local used = cum
  local curRes, curHard = -1, -1
  local mine, theirs = entries(self, name .. '|', 7)
  if mine then
    curRes, curHard = mine[3], mine[4]
    if not fresh and cum >= mine[5] then used = cum - mine[5] end
  end
  local total = redis.call('HINCRBY', KEYS[4], name, used)
  local res = grant(reserved, cap, w, theirs, 3, 6, curRes)
  local hrd = grant(hard, cap, w, theirs, 4, 7, curHard)
  if hrd >= 0 and (res < 0 or res > hrd) then res = hrd end
  redis.call('HSET', KEYS[3], self,
    string.format('%.0f %.3f %.0f %.0f %.0f %.0f %.0f', cap, w, res, hrd, cum, reserved, hard))
  reply[#reply + 1] = name
  reply[#reply + 1] = res
  reply[#reply + 1] = hrd
  reply[#reply + 1] = total
end

local freePool, fpCap, fpW = tonumber(ARGV[7]), tonumber(ARGV[8]), weight(ARGV[9])
local curFp = -1
local mineFp, theirsFp = entries('|' .. inst, '|', 4)
if mineFp then curFp = mineFp[3] end
local fp = grant(freePool, fpCap, fpW, theirsFp, 3, 4, curFp)
redis.call('HSET', KEYS[3], '|' .. inst, string.format('%.0f %.3f %.0f %.0f', fpCap, fpW, fp, freePool))
reply[6] = fp
return reply
