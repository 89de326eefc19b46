-- Count bytes for a tenant unless that would pass its quota (then nothing is counted and the bytes
-- used are returned). KEYS: its session bytes, its record bytes. ARGV: quota (-1: none), then pairs
-- of a session id (or '#records') and its bytes (negative to give bytes back).
local need = 0
for i = 2, #ARGV, 2 do need = need + tonumber(ARGV[i + 1]) end
local quota = tonumber(ARGV[1])
if quota >= 0 and need > 0 then
  local used = tonumber(redis.call('HGET', KEYS[1], '#total') or '0') + tonumber(redis.call('GET', KEYS[2]) or '0')
  if used + need > quota then return used end
end
for i = 2, #ARGV, 2 do
  if ARGV[i] == '#records' then
    redis.call('INCRBY', KEYS[2], ARGV[i + 1])
  else
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
    redis.call('HINCRBY', KEYS[1], '#total', ARGV[i + 1])
  end
end
return -1
