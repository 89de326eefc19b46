-- Store a catalog record unless its key is taken (then the value there is returned), refused past
-- ARGV[3] records (-1: no limit). KEYS: the records' hash. ARGV: the key, the value, the limit.
local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then return existing end
if tonumber(ARGV[3]) >= 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return {err = 'record limit'} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return false
