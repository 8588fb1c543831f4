-- kvthrottle fleet seed: make ARGV[1] the fleet's state document if the
-- store holds none (or none with a numeric version), naming this life of
-- the store ARGV[2]. The version starts at the store's time in ms: ARGV[3]
-- when given (Store.SetClock), else Redis's clock.
-- KEYS[1] config hash. Reply: {token "id:version" in force, 1 if seeded here}.
local cfg = redis.call('HMGET', KEYS[1], 'version', 'id')
if tonumber(cfg[1]) then return {(cfg[2] or '') .. ':' .. cfg[1], 0} end
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
now = string.format('%.0f', now)
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', now, 'id', ARGV[2], 'seeded_at', now)
return {ARGV[2] .. ':' .. now, 1}
