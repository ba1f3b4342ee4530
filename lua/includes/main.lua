--[[
  Runs the script's main() and turns a fail() into an error reply "LUFT_<CODE> message".
  Errors raised by redis.call pass through unchanged.
]]
local ok, result = pcall(main)
if ok then return result end
if type(result) == 'table' then return result end
return redis.error_reply(tostring(result))
