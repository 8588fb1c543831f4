-- kvthrottle fleet update: replace the fleet's state document with ARGV[2]
-- if its token ("id:version") is still ARGV[1] (compare and set).
-- KEYS[1] config hash. Reply: the new token, or "" when the document moved
-- on (the caller reads it again and retries).
local cfg = redis.call('HMGET', KEYS[1], 'version', 'id')
if not tonumber(cfg[1]) or (cfg[2] or '') .. ':' .. cfg[1] ~= ARGV[1] then return '' end
local nv = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return (cfg[2] or '') .. ':' .. string.format('%.0f', nv)
