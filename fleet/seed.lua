-- kvthrottle fleet seed: make ARGV[1] the fleet's state document if the
-- store holds none. The version starts at Redis's clock in ms, so that no
-- instance's remembered version from an earlier life of the store matches.
-- KEYS[1] config hash. Reply: the version in force, and 1 if seeded here.
local v = redis.call('HGET', KEYS[1], 'version')
if v then return {tonumber(v), 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', string.format('%.0f', now))
return {now, 1}
