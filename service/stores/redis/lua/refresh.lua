-- A session's meta, its keys' TTL refreshed (and its bases' too, where the script may reach them).
-- KEYS: the session's kept keys (meta first). ARGV: the store's idle TTL (ms), the bases' TTL (ms),
-- ``touch`` ('1': refresh the bases here).
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return meta end
local ttl = session_ttl(KEYS[1], ARGV[1])
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
if ARGV[3] == '1' then touch_bases(KEYS[1], ARGV[2]) end
return meta
