local function count(counts, facet, d)
  local tab = string.find(facet, '\t', 1, true)
  local r, t = string.sub(facet, 1, tab - 1), string.sub(facet, tab + 1)
  local fields = {'all', 'reason:' .. r, 'rt:' .. facet}
  if t ~= '' then table.insert(fields, 'tool:' .. t) end
  for _, f in ipairs(fields) do
    if redis.call('HINCRBY', counts, f, d) <= 0 then redis.call('HDEL', counts, f) end
  end
end
