--[[
  load: read a run's whole state in one atomic step (for open_run and cache resyncs); the
  event log is not read.

  KEYS[1..10] the run's keys (see includes/common.lua)
  ARGV    none

  Reply:  0 when the run does not exist, else
          {run HGETALL, phases HGETALL, results HGETALL, sessions HGETALL, started HGETALL,
           findings HGETALL, findings_order LRANGE}
  Errors: LUFT_CORRUPT <key> type ... when a key of the run holds the wrong type
]]
local KINDS = {'hash', 'stream', 'hash', 'hash', 'hash', 'hash', 'hash', 'list'}
for i = 1, #KINDS do
  local found = redis.call('TYPE', KEYS[i])
  if type(found) == 'table' then found = found['ok'] end
  if found ~= 'none' and found ~= KINDS[i] then
    return redis.error_reply('LUFT_CORRUPT ' .. KEYS[i] .. ' type is ' .. tostring(found) ..
      ', not a ' .. KINDS[i])
  end
end
local run = redis.call('HGETALL', KEYS[1])
if #run == 0 then return 0 end
return {
  run,
  redis.call('HGETALL', KEYS[3]),
  redis.call('HGETALL', KEYS[4]),
  redis.call('HGETALL', KEYS[5]),
  redis.call('HGETALL', KEYS[6]),
  redis.call('HGETALL', KEYS[7]),
  redis.call('LRANGE', KEYS[8], 0, -1),
}
