-- Publishing alone: the events' keys start at KEYS[1], their values at ARGV[1].
local K, E = 1, 0
