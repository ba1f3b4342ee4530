--[[
  delete_run: delete every key of a run (its state, its event log, its writers) and tell the
  processes watching it.

  KEYS[1..10] the run's keys (see includes/common.lua)
  ARGV    none

  Reply:  1 when the run existed, 0 when it did not (any leftovers are deleted all the same)
  Notice: (only when it existed) a delta header with op "delete" from the run's last
          (incarnation, version), no records: subscribers learn that this incarnation is gone
  Errors: none
]]
local run = redis.pcall('HMGET', KEYS[1], 'version', 'incarnation')
local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
if existed == 1 then
  local version, inc = '0', ''
  if type(run) == 'table' and not run.err then
    version = run[1] or '0'
    inc = run[2] or ''
  end
  local parts = {'L2', inc, version, inc, version, 'delete'}
  local out = {}
  for i = 1, #parts do out[#out + 1] = #parts[i] .. ':' .. parts[i] end
  redis.call('SPUBLISH', KEYS[10], table.concat(out))
end
return existed
