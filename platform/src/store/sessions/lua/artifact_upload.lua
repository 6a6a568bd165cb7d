-- KEYS: artifacts (hash: id -> record), history, history_seq, history_bytes, then the events
-- stream (publish_many's, at KEYS[K]). ARGV[1]: ttl, ARGV[2]: the history entry (a JSON object
-- without its seq), ARGV[3]: how many records follow as id, record pairs; then publish_many's
-- arguments from ARGV[E + 1]. One script: the records, the note the model reads and the event
-- land together or not at all, so an upload's note is never lost or doubled.
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[4 + 2 * i], ARGV[5 + 2 * i])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
local seq = redis.call('INCR', KEYS[3])
local entry = '{"seq":' .. seq .. ',' .. string.sub(ARGV[2], 2)
redis.call('RPUSH', KEYS[2], entry)
redis.call('INCRBY', KEYS[4], string.len(entry))
for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ARGV[1]) end
local K, E = 5, 3 + 2 * n
