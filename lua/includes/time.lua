--[[
  The server's clock (time is frozen while a script runs: every call of a script reads the
  same time).
]]
--- @defines-only

-- Server time in unix seconds, as a decimal string.
local function now_seconds()
  return redis.call('TIME')[1]
end

-- The server's clock in unix milliseconds (a number: exact below 2^53).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
