-- Copy a session server-side into fresh ids (a fork): nothing crosses to the API but the ids.
-- KEYS: the source's meta, state, initial, trajectory and delta; then each copy's six kept keys
-- (``SessionKeys.kept``). ARGV: the store's idle TTL (ms), the copies' created_at, the source's id,
-- the bases' TTL (ms), then the copies' ids.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
touch_bases(KEYS[1], ARGV[4])
local from = {1, 2, 3, 4, 6}  -- the source's meta, state, initial, trajectory, delta: where each goes
for i = 1, #ARGV - 4 do
  local base = 5 + (i - 1) * 6
  for j = 1, 6 do redis.call('DEL', KEYS[base + j]) end
  for j = 1, 5 do
    if redis.call('EXISTS', KEYS[j]) == 1 then redis.call('COPY', KEYS[j], KEYS[base + from[j]]) end
  end
  redis.call('HSET', KEYS[base + 1], 'session_id', ARGV[4 + i], 'created_at', ARGV[2], 'parent_id', ARGV[3])
  local ttl = session_ttl(KEYS[base + 1], ARGV[1])  -- (the copy keeps its source's idle TTL)
  for j = 1, 6 do redis.call('PEXPIRE', KEYS[base + j], ttl) end
end
return 1
