local out = {}
for i, id in ipairs(ARGV) do
  out[i] = drop(KEYS[1], KEYS[2], KEYS[3], KEYS[3 + i], id)
end
return out
