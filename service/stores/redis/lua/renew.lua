-- Extend a lock's lease to ARGV[2] ms, only if ARGV[1] (its token) still holds it.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
