-- kvthrottle fleet sync: one call per instance per grant period.
--
-- The caller reports its usage and demand per bucket; the script records
-- them, ignores instances whose lease ran out, and gives the caller its
-- shares of every fleet limit. A share is computed by weighted max-min
-- (water-filling) over the demands of the live instances, then clamped so
-- that the shares held by all live instances never add up to more than the
-- limit: a share given to one instance is taken back from another only when
-- that one calls and lowers its own. Time is Redis's (TIME), in ms, unless
-- the caller passes its own (now_ms; tests whose instances share one fake
-- clock: Store.SetClock).
--
-- KEYS[1] config  hash: version, state (the fleet's state document, JSON),
--                       id (names this life of the store), seeded_at (ms),
--                       back_at (ms: the first call after a silence),
--                       expect (instances the callers since back_at knew of)
-- KEYS[2] members hash: instance -> "lastseen_ms epoch seq lease_ms"
-- KEYS[3] entries hash: bucket.."|"..instance ->
--                         "cap weight res hard cum reserved_limit hard_limit
--                          pool_cap pool_grant" (the last two in fair mode);
--                       "||"..instance -> the buckets it reported last,
--                         one per line;
--                       "|"..instance (the free pool) -> "cap weight fp free_pool"
-- KEYS[4] usage   hash: bucket -> units used by the whole fleet, ever
--
-- ARGV: instance, epoch, seq, lease_ms, known_token, hint_instances,
--       free_pool, fp_cap, fp_weight, nbuckets, fair, now_ms ("": TIME),
--       then per bucket: name, reserved, hard, cum, cap, weight,
--       pool_cap, bucket_weight.
-- fair is "1" when the caller shares the free pool fairly (free_pool =
-- "fair"): its free pool share is then the sum of its buckets' pool
-- shares, each bucket's share of the fleet's free pool computed by
-- weighted max-min over the buckets (bucket_weight, demand the sum of the
-- live instances' pool_cap) and split among the instances by their
-- pool_cap. pool_cap is what the caller wants of the free pool for the
-- bucket (-1: all it can get).
-- A limit or cap of -1 means unlimited. cum is the caller's own running
-- total of units used in that bucket since its epoch began. known_token is
-- "id:version" of the state document the caller has ("" for none);
-- hint_instances the number of live instances it last knew of.
--
-- Reply: {status, now_ms, live_instances, token, state_or_empty,
--         fp_grant, name, res_grant, hard_grant, fleet_units, pool_grant, cut, ...}
-- pool_grant is the caller's share of the free pool for the bucket in fair
-- mode, -1 otherwise. cut is 1 when the other live instances' holdings cut
-- the caller's hard share by more than a fifth of its computed part (it may
-- ask again before its period: fleet/move.go), else 0.
-- status: "ok"; "stale" (seq not newer than one already recorded: nothing
-- changed, nothing else returned); "seed" (the store holds no state yet);
-- "conflict" (another live instance reports under the same name).
--
-- Records that do not parse (written by something else) are dropped or
-- ignored, never trusted: a member record is deleted, an entry counts as
-- absent, a version that is not a number means "no state".

local now = tonumber(ARGV[12])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local inst, epoch = ARGV[1], ARGV[2]
local seq, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local known, hint = ARGV[5], tonumber(ARGV[6]) or 1
local forget = 3600000

local cfg = redis.call('HMGET', KEYS[1], 'version', 'id', 'back_at', 'expect')
local version = tonumber(cfg[1])
if not version then
  return {'seed', now}
end
local token = (cfg[2] or '') .. ':' .. cfg[1]
local backAt, expect = tonumber(cfg[3]) or 0, tonumber(cfg[4]) or 1

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
local selfLive = false
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  local name, rec = raw[i], raw[i + 1]
  local lastseen, ep, sq, ls = string.match(rec, '^(%d+) (%S+) (%d+) (%d+)$')
  lastseen, sq, ls = tonumber(lastseen), tonumber(sq), tonumber(ls)
  if not (lastseen and sq and ls) then
    redis.call('HDEL', KEYS[2], name)
  elseif name == inst then
    if lastseen + ls >= now then selfLive = true end
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

-- A return after a silence: no instance has called within its lease (the
-- whole fleet lost the store, or it is new or was emptied). The instances
-- the callers knew of may still hold shares from before it (their last
-- grants, or their parts of a fallback) until each calls again, which it
-- does within a period of the store's return: for one lease from the
-- first call after the silence, each instance not back yet (phantoms)
-- holds an expect-th of each limit, expect being the most instances any
-- caller since that first one knew of. The store keeps it: a caller's own
-- count drops to the instances back so far at its first good call.
if #others == 0 and not selfLive then
  backAt, expect = now, math.max(hint, 1)
  redis.call('HSET', KEYS[1], 'back_at', string.format('%.0f', now), 'expect', expect)
elseif now - backAt < lease and hint > expect then
  expect = hint
  redis.call('HSET', KEYS[1], 'expect', expect)
end
local phantoms = 0
if now - backAt < lease and expect > #others + 1 then
  phantoms = expect - #others - 1
end

-- waterfill returns every claimant's part of limit (caps -1: unlimited,
-- ws the weights) by weighted max-min: a demand that is satisfied below
-- the common level keeps what it asks and the rest is split by weight;
-- what nobody asks for is split by weight among all, so that a claimant
-- whose load grows has room at once.
local function waterfill(limit, caps, ws)
  local n = #caps
  local out, order, wsum = {}, {}, 0
  for k = 1, n do
    order[k], out[k] = k, 0
    wsum = wsum + ws[k]
  end
  local function ratio(k)
    if caps[k] < 0 then return math.huge end
    return caps[k] / ws[k]
  end
  table.sort(order, function(x, y) return ratio(x) < ratio(y) end)
  local rem, wrem = limit, wsum
  for i, k in ipairs(order) do
    if caps[k] < 0 or caps[k] > rem * ws[k] / wrem then
      for j = i, n do
        local kk = order[j]
        out[kk] = rem * ws[kk] / wrem
      end
      return out
    end
    out[k] = caps[k]
    rem = rem - caps[k]
    wrem = wrem - ws[k]
  end
  for k = 1, n do out[k] = out[k] + rem * ws[k] / wsum end
  return out
end

-- share returns the caller's part of limit among the demands (caps[1],
-- ws[1] are the caller's), as waterfill.
local function share(limit, caps, ws)
  return waterfill(limit, caps, ws)[1]
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
  local held = phantoms * math.floor(limit / expect)
  for _, e in ipairs(theirs) do
    caps[#caps + 1] = e[1]
    ws[#ws + 1] = math.max(e[2], 0.001)
    if e[grantAt] > 0 then held = held + e[grantAt] end
  end
  local g = math.floor(share(limit, caps, ws))
  -- A caller at the lowest weight reports that its load left (it releases
  -- its share: fleet/move.go): it takes what it asks, none of the surplus,
  -- so that the instance the load moved to finds it free.
  if cap >= 0 and weight <= 0.001 and g > cap then g = cap end
  if cap < 0 and g < cur and g >= cur - cur / 10 then g = cur end
  local room = limit - held
  -- Cut: the other live instances hold more than a fifth of what the
  -- caller should have (not the phantoms: those leave within a lease, and asking
  -- again before they are back would take their room). The caller may
  -- ask again before its period, once they have released it.
  local cut = phantoms == 0 and room < g - g / 5
  if g > room then g = room end
  if g < 0 then g = 0 end
  return g, limit, room, cut
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
local fair = ARGV[11] == '1'
local a = 13
local pool = {} -- per bucket of the caller: its grants, and in fair mode what its pool share needs
for _ = 1, nb do
  local name = ARGV[a]
  local reserved, hard = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cum, cap, w = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), weight(ARGV[a + 5])
  local pcap, bw = tonumber(ARGV[a + 6]), weight(ARGV[a + 7])
  a = a + 8
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
  local hrd, _, _, cut = grant(hard, cap, w, theirs, 4, 7, curHard)
  if hrd >= 0 and (res < 0 or res > hrd) then res = hrd end
  local b = {name = name, self = self, rec = string.format('%.0f %.3f %.0f %.0f %.0f %.0f %.0f', cap, w, res, hrd, cum, reserved, hard),
    res = res, hrd = hrd, total = total, cut = cut, pcap = pcap, w = w, bw = bw, theirs = theirs, held = 0, demand = pcap}
  if fair then
    -- The bucket's demand on the fleet's free pool: the sum of the live
    -- instances' (an entry of an instance sharing first come first served
    -- has no pool_cap: its demand for the bucket stands for it), at most
    -- its hard limit less its reservation; and the shares of the pool the
    -- other instances hold for it.
    for _, e in ipairs(theirs) do
      local pc, pg = e[8] or e[1], e[9]
      if b.demand >= 0 then
        if pc < 0 then b.demand = -1 else b.demand = b.demand + pc end
      end
      if pg and pg > 0 then b.held = b.held + pg end
    end
    if reserved < 0 then
      b.demand = 0 -- unmetered: it never draws on the pool
    elseif hard >= 0 and (b.demand < 0 or b.demand > hard - reserved) then
      b.demand = math.max(hard - reserved, 0)
    end
  end
  pool[#pool + 1] = b
end

local freePool, fpCap, fpW = tonumber(ARGV[7]), tonumber(ARGV[8]), weight(ARGV[9])
local curFp = -1
local mineFp, theirsFp = entries('|' .. inst, '|', 4)
if mineFp then curFp = mineFp[3] end
local fp, fpLimit, fpRoom = grant(freePool, fpCap, fpW, theirsFp, 3, 4, curFp)

if fair and fpLimit >= 0 then
  -- Each bucket's share of the fleet's free pool, by weight; the caller's
  -- part of it by the instances' demands, at most what the other
  -- instances do not hold.
  local caps, ws = {}, {}
  for k, b in ipairs(pool) do
    caps[k], ws[k] = b.demand, b.bw
  end
  local shares = waterfill(fpLimit, caps, ws)
  local sum = 0
  for k, b in ipairs(pool) do
    local icaps, iws = {b.pcap}, {b.w}
    for _, e in ipairs(b.theirs) do
      icaps[#icaps + 1] = e[8] or e[1]
      iws[#iws + 1] = math.max(e[2], 0.001)
    end
    local g = 0
    if shares[k] > 0 then
      g = math.floor(math.min(share(shares[k], icaps, iws), shares[k] - b.held))
    end
    if g < 0 then g = 0 end
    b.pg = g
    sum = sum + g
  end
  fp = math.max(0, math.min(sum, fpRoom))
end

-- The caller's entries for buckets it no longer reports (removed from its
-- configuration) go: left, they would hold their shares for good.
local listKey = '||' .. inst
local reported = {}
for _, b in ipairs(pool) do reported[b.name] = true end
local was = redis.call('HGET', KEYS[3], listKey)
if was then
  for name in string.gmatch(was, '[^\n]+') do
    if not reported[name] then redis.call('HDEL', KEYS[3], name .. '|' .. inst) end
  end
end
local names = {}
for _, b in ipairs(pool) do names[#names + 1] = b.name end
redis.call('HSET', KEYS[3], listKey, table.concat(names, '\n'))

for _, b in ipairs(pool) do
  local rec = b.rec
  if fair then
    rec = rec .. string.format(' %.0f %.0f', b.pcap, b.pg or 0)
  end
  redis.call('HSET', KEYS[3], b.self, rec)
  reply[#reply + 1] = b.name
  reply[#reply + 1] = b.res
  reply[#reply + 1] = b.hrd
  reply[#reply + 1] = b.total
  if fair then
    reply[#reply + 1] = b.pg or -1
  else
    reply[#reply + 1] = -1
  end
  if b.cut then reply[#reply + 1] = 1 else reply[#reply + 1] = 0 end
end

redis.call('HSET', KEYS[3], '|' .. inst, string.format('%.0f %.3f %.0f %.0f', fpCap, fpW, fp, freePool))
reply[6] = fp
return reply
