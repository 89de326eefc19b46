-- A session's idle TTL in ms: its own (``SessionMeta.idle_ttl``, in seconds) or the store's. Every
-- script that refreshes a session's keys asks it, so no refresh can stretch a short-lived session.
local function session_ttl(meta, default)
  local own = redis.call('HGET', meta, 'idle_ttl')
  if own and own ~= '' then return math.floor(tonumber(own) * 1000) end
  return tonumber(default)
end
