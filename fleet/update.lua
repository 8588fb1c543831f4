-- kvthrottle fleet update: replace the fleet's state document with ARGV[2]
-- if its version is still ARGV[1] (compare and set).
-- KEYS[1] config hash. Reply: the new version, or -1 when the version moved
-- on (the caller reads the state again and retries).
local v = redis.call('HGET', KEYS[1], 'version')
if v ~= ARGV[1] then return -1 end
local nv = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return nv
