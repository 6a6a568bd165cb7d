-- Publishing after logging a message: the events' keys start at KEYS[4], their values after
-- the log's four arguments.
local K, E = 4, 4
