local function drop(index, facets, counts, record, id)
  local existed = redis.call('DEL', record)
  redis.call('ZREM', index, id)
  local facet = redis.call('HGET', facets, id)
  if facet then
    redis.call('HDEL', facets, id)
    count(counts, facet, -1)
  end
  return existed
end
