-- kvthrottle fleet resolve: did the update with change id ARGV[2], made
-- against token ARGV[1], happen? Called when its reply was lost.
-- KEYS[1] config hash. Reply: {1, token in force} if it did (its id is
-- among the changes applied); {0, token in force} if it did not, and then
-- it never will: a token still ARGV[1] is moved on (the version raised,
-- the document unchanged), so that the update, were it still on its way
-- to the server, finds the document moved on.
local cfg = redis.call('HMGET', KEYS[1], 'version', 'id', 'changes')
if not tonumber(cfg[1]) then return {0, ''} end
for w in string.gmatch(cfg[3] or '', '%S+') do
  if w == ARGV[2] then return {1, (cfg[2] or '') .. ':' .. cfg[1]} end
end
local tok = (cfg[2] or '') .. ':' .. cfg[1]
if tok == ARGV[1] then
  local nv = redis.call('HINCRBY', KEYS[1], 'version', 1)
  tok = (cfg[2] or '') .. ':' .. string.format('%.0f', nv)
end
return {0, tok}
