--[[
  gc_run: delete a finished run when it is still finished and still old enough (luft-redis gc,
  luft_redis.retention.collect_garbage). The check and the delete are one atomic step, so a
  run resumed or updated after gc found it is never deleted.

  KEYS[1..11] the run's keys (see includes/common.lua)
  ARGV[1] the run's change channel (see includes/common.lua)
  ARGV[2] the statuses to delete, comma separated (of completed, failed, cancelled)
  ARGV[3] minimum age in seconds: the run's updated_at must be <= server time - ARGV[3]

  Reply:  1 when the run was deleted, 0 when it is gone, running, of another status or newer
  Notice: (only when deleted) the delete notice of delete_run-12.lua: a delta header with op
          "delete" from the run's last (incarnation, version), no records
  Errors: LUFT_BAD_ARG when the age is not a decimal number
]]
local age = ARGV[3]
if age == nil or string.find(age, '^%d+$') == nil or #age > 15 then
  return redis.error_reply('LUFT_BAD_ARG minimum age is not a decimal number of seconds')
end
local wanted = {}
for status in string.gmatch(ARGV[2] or '', '[^,]+') do
  if status == 'running' then return redis.error_reply('LUFT_BAD_ARG gc never deletes running runs') end
  wanted[status] = true
end
local run = redis.call('HMGET', KEYS[1], 'status', 'updated_at', 'version', 'incarnation')
if not run[1] or not wanted[run[1]] then return 0 end
if not run[2] or string.find(run[2], '^%d+$') == nil then return 0 end
local now = tonumber(redis.call('TIME')[1])
if tonumber(run[2]) > now - tonumber(age) then return 0 end
redis.call('DEL', unpack(KEYS))
local parts = {'L3', run[4] or '', run[3] or '0', run[4] or '', run[3] or '0', 'delete'}
local out = {}
for i = 1, #parts do out[#out + 1] = #parts[i] .. ':' .. parts[i] end
redis.call('SPUBLISH', ARGV[1], table.concat(out))
return 1
