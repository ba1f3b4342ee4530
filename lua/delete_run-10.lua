--[[
  delete_run: delete every key of a run (its state, its event log, its writers) and tell the
  processes watching it.

  KEYS[1..10] the run's keys (see includes/common.lua)
  ARGV    none

  Reply:  1 when the run existed, 0 when it did not (any leftovers are deleted all the same)
  Notice: op "d" (subscribers learn that the run is gone)
  Errors: none
]]
local existed = redis.call('EXISTS', KEYS[1])
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7],
  KEYS[8], KEYS[9])
if existed == 1 then
  local now = redis.call('TIME')[1]
  local parts = {'0', now, 'd'}
  local out = {}
  for i = 1, #parts do out[#out + 1] = #parts[i] .. ':' .. parts[i] end
  redis.call('SPUBLISH', KEYS[10], table.concat(out))
end
return existed
