-- Count the new ids as live unless that passes the limit (then the live count is returned).
local live = redis.call('ZCARD', KEYS[1])
local first = 5 + 2 * tonumber(ARGV[4])
if live + #ARGV - first + 1 > tonumber(ARGV[2]) then return live end
for i = first, #ARGV do redis.call('ZADD', KEYS[1], ARGV[3], ARGV[i]) end
return -1
