-- kvthrottle fleet leave: an instance stopping forgets its member record
-- and its entries, so that its shares go to the others at once.
-- KEYS[2] members hash, KEYS[3] entries hash; ARGV[1] the instance,
-- ARGV[2] its epoch (a record of another run of the name is left alone).
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if not rec then return 0 end
local _, ep = string.match(rec, '^(%S+) (%S+)')
if ep ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
local suffix = '|' .. ARGV[1]
for _, k in ipairs(redis.call('HKEYS', KEYS[3])) do
  if string.sub(k, -#suffix) == suffix then redis.call('HDEL', KEYS[3], k) end
end
return 1
