-- Stop counting sessions ARGV of a tenant. KEYS: its live sessions, its session bytes.
for _, sid in ipairs(ARGV) do
  redis.call('ZREM', KEYS[1], sid)
  uncount(KEYS[2], sid)
end
return 0
