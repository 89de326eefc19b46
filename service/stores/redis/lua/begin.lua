-- Take a session's call lock and read its meta in one step; false while another caller holds it.
-- A session that does not exist leaves no lock behind.
-- KEYS: the lock, then the session's kept keys (meta first). ARGV: the lock's token, its lease (ms),
-- the store's idle TTL (ms), the bases' TTL (ms), ``touch`` ('1': refresh the bases here).
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local meta = redis.call('HGETALL', KEYS[2])
if #meta == 0 then
  redis.call('DEL', KEYS[1])
  return meta
end
local ttl = session_ttl(KEYS[2], ARGV[3])
for i = 2, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
if ARGV[5] == '1' then touch_bases(KEYS[2], ARGV[4]) end
return meta
