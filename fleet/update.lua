-- kvthrottle fleet update: replace the fleet's state document with ARGV[2]
-- if its token ("id:version") is still ARGV[1] (compare and set), and
-- record the change's id ARGV[3] among the last 32 applied (changes), so
-- that a caller whose reply was lost can tell whether it was (resolve.lua).
-- KEYS[1] config hash. Reply: the new token, or "" when the document moved
-- on (the caller reads it again and retries).
local cfg = redis.call('HMGET', KEYS[1], 'version', 'id', 'changes')
if not tonumber(cfg[1]) or (cfg[2] or '') .. ':' .. cfg[1] ~= ARGV[1] then return '' end
local nv = redis.call('HINCRBY', KEYS[1], 'version', 1)
local ids = {}
for w in string.gmatch(cfg[3] or '', '%S+') do ids[#ids + 1] = w end
ids[#ids + 1] = ARGV[3]
while #ids > 32 do table.remove(ids, 1) end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'changes', table.concat(ids, ' '))
return (cfg[2] or '') .. ':' .. string.format('%.0f', nv)
