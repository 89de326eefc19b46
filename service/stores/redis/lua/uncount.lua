-- A tenant's session bytes: a session no longer counted gives its bytes back.
local function uncount(counts, sid)
  local held = redis.call('HGET', counts, sid)
  if held then
    redis.call('HDEL', counts, sid)
    redis.call('HINCRBY', counts, '#total', -tonumber(held))
    if redis.call('HLEN', counts) == 1 then
      redis.call('DEL', counts)  -- only the total is left, and it is 0: a tenant with no sessions holds no key
    end
  end
end
