local function holder_of(raw)
  if not raw then return nil, 0 end
  local at = string.find(raw, '#', 1, true)
  if not at then return raw, 0 end
  return string.sub(raw, 1, at - 1), tonumber(string.sub(raw, at + 1)) or 0
end
