--[[
  Domain errors: fail(CODE, message) raises the error that reaches the client as the error
  reply "LUFT_<CODE> <message>" (includes/main.lua turns it into one); luft_redis/scripts.py
  maps each code to a typed exception. Errors raised by redis.call pass through unchanged.
]]
--- @defines-only

local function fail(code, message)
  error('LUFT_' .. code .. ' ' .. message, 0)
end
