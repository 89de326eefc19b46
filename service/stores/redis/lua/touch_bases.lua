-- Refresh the bases a session's meta names (``state_base``, ``initial_base``) for ``ttl`` ms, so a base
-- outlives every session that reads it. Not on a cluster: bases live on the tenant's slot there.
local function touch_bases(meta, ttl)
  for _, name in ipairs(redis.call('HMGET', meta, 'state_base', 'initial_base')) do
    if name then redis.call('PEXPIRE', name, ttl) end
  end
end
