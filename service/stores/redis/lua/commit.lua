-- Compare-and-set on the step: a stale caller can never apply a step twice.
-- The idempotency key is written in the same script, so a step and the record of which request
-- made it exist together or not at all.
--
-- KEYS: the session's meta, state, initial, trajectory, idempotency, lock and delta; then, with a
-- tenant (never on a cluster, where the tenant is on another slot), its live sessions, session
-- bytes and record bytes. ARGV as ``Commit.argv`` (commit.py) sends them, named here in order.
local expected_step = tonumber(ARGV[1])
local mode = ARGV[2]  -- '0' the state stays, '1' a new state, '2' a delta, '3' a new base (``text`` names it)
local text = ARGV[3]  -- the new state, or the new base's key
local record = ARGV[4]
local store_ttl = ARGV[5]  -- the store's idle TTL in ms (a session with its own keeps that)
local done = ARGV[6]
local idempotency_key = ARGV[7]
local idempotency_value = ARGV[8]
local token = ARGV[9]  -- the lock's, when the commit releases it ('' else)
local session_id = ARGV[10]
local expires = tonumber(ARGV[11])  -- when the store's TTL would end the session, ms
local quota = tonumber(ARGV[12])  -- -1: none
local base_ttl = ARGV[13]
local touch = ARGV[14]  -- '1': refresh the bases here
local base_size = ARGV[15]  -- the new base's bytes
local unlocked = ARGV[16]
local nset = tonumber(ARGV[17])
-- From ARGV[18]: ``nset`` pairs of a delta field and its new value, then the fields the delta drops.
local first_set, first_unset = 18, 18 + 2 * nset

local result = 1
local grown = 0
local dgrown = 0
local ttl = session_ttl(KEYS[1], store_ttl)
local function state_size()
  if redis.call('EXISTS', KEYS[2]) == 1 then return redis.call('STRLEN', KEYS[2]) end
  return tonumber(redis.call('HGET', KEYS[1], 'base_bytes') or '0') + tonumber(redis.call('HGET', KEYS[1], 'delta_bytes') or '0')
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  result = -1
elseif tonumber(redis.call('HGET', KEYS[1], 'step')) ~= expected_step then
  result = 0
elseif unlocked == '1' and (redis.call('EXISTS', KEYS[6]) == 1
    or (idempotency_key ~= '' and redis.call('HEXISTS', KEYS[5], idempotency_key) == 1)) then
  result = -4  -- a commit made without the lock: another caller holds it, or the key was used
elseif mode == '2' and (redis.call('EXISTS', KEYS[2]) == 1 or not redis.call('HGET', KEYS[1], 'state_base')) then
  result = -3  -- a delta, but the state is the session's own text
else
  grown = #record
  if mode == '1' then
    grown = grown + #text - state_size()
  elseif mode == '3' then
    grown = grown + tonumber(base_size) - state_size()
  elseif mode == '2' then
    for i = first_set, first_unset - 1, 2 do
      local old = -#ARGV[i]
      if redis.call('HEXISTS', KEYS[7], ARGV[i]) == 1 then old = redis.call('HSTRLEN', KEYS[7], ARGV[i]) end
      dgrown = dgrown + #ARGV[i + 1] - old
    end
    for i = first_unset, #ARGV do
      if redis.call('HEXISTS', KEYS[7], ARGV[i]) == 1 then
        dgrown = dgrown - #ARGV[i] - redis.call('HSTRLEN', KEYS[7], ARGV[i])
      end
    end
    grown = grown + dgrown
  end
  if #KEYS == 10 and grown > 0 and quota >= 0 then
    local used = tonumber(redis.call('HGET', KEYS[9], '#total') or '0') + tonumber(redis.call('GET', KEYS[10]) or '0')
    if used + grown > quota then result = -2 end
  end
end
if result == 1 then
  if mode == '1' or mode == '3' then
    redis.call('DEL', KEYS[7])
    redis.call('HDEL', KEYS[1], 'delta_bytes')
  end
  if mode == '1' then
    redis.call('SET', KEYS[2], text)
    redis.call('HDEL', KEYS[1], 'state_base')  -- the state is the session's own from now on
  elseif mode == '3' then
    redis.call('DEL', KEYS[2])
    redis.call('HSET', KEYS[1], 'state_base', text, 'base_bytes', base_size)
  elseif mode == '2' then
    for i = first_set, first_unset - 1, 2 do redis.call('HSET', KEYS[7], ARGV[i], ARGV[i + 1]) end
    for i = first_unset, #ARGV do redis.call('HDEL', KEYS[7], ARGV[i]) end
    redis.call('HINCRBY', KEYS[1], 'delta_bytes', dgrown)
  end
  redis.call('RPUSH', KEYS[4], record)
  redis.call('HINCRBY', KEYS[1], 'step', 1)
  if done == '1' then redis.call('HSET', KEYS[1], 'done', '1') end
  if idempotency_key ~= '' then redis.call('HSET', KEYS[5], idempotency_key, idempotency_value) end
  for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ttl) end
  redis.call('PEXPIRE', KEYS[7], ttl)
  if touch == '1' then touch_bases(KEYS[1], base_ttl) end
  if #KEYS == 10 then
    redis.call('HINCRBY', KEYS[9], session_id, grown)
    redis.call('HINCRBY', KEYS[9], '#total', grown)
  end
end
if token ~= '' and redis.call('GET', KEYS[6]) == token then redis.call('DEL', KEYS[6]) end
-- (``expires`` is when the store's TTL would end it; a session with its own ends sooner or later)
if #KEYS >= 8 then redis.call('ZADD', KEYS[8], 'XX', expires - tonumber(store_ttl) + ttl, session_id) end
return {result, grown, ttl}
