-- A tenant's live sessions are a sorted set of ids scored by when each was last known to expire; a
-- read refreshes a session's keys but not that score. So an id whose score has passed is settled:
-- the store looks up when its session really expires (ARGV from 5 on: n pairs of an id and that
-- time in ms, 0 when it is gone), and an id whose session lives on is scored again; the others
-- leave the set with their bytes. The tenant's keys do not expire by themselves (a TTL that reads
-- do not refresh would drop sessions that are alive from the count): they go when they count
-- nothing. KEYS: the live sessions, the session bytes. ARGV: now, limit, the new ids' expiry, n,
-- the n pairs, the new ids.
local function settle(live, counts, now, n)
  for i = 5, 4 + 2 * n, 2 do
    local until_ = tonumber(ARGV[i + 1])
    if until_ > now then
      redis.call('ZADD', live, 'XX', until_, ARGV[i])
    elseif redis.call('ZREM', live, ARGV[i]) == 1 then
      uncount(counts, ARGV[i])
    end
  end
  redis.call('PERSIST', live)  -- (a set an older version left with a TTL)
  redis.call('PERSIST', counts)
end
settle(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[4]))
