--[[
  gc_run: delete a finished run when it is still finished and still old enough (luft-redis gc,
  luft_redis.retention.collect_garbage). The check and the delete are one atomic step, so a
  run resumed or updated after gc found it is never deleted; exactly once per writer operation.

  KEYS[1..12] the run's keys (see includes/call.lua)
  KEYS[13]    the run's tombstone hash (includes/tombstone.lua): a retried gc whose reply was
              lost gets its first answer
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] the statuses to delete, comma separated (of completed, failed, cancelled)
  ARGS[2] minimum age in seconds: the run's updated_at must be <= server time - ARGS[2]
  ARGS[3] tombstone TTL in seconds

  Reply:  1 when the run was deleted, 0 when it is gone, running, of another status or newer;
          a retry of the same operation gets the first attempt's reply and changes nothing
  Notice: (only when deleted) the delete notice of delete_run-13.lua: a delta header with op
          "delete" from the run's last (incarnation, version), no records
  Errors: LUFT_BAD_ARG when the age or the TTL is not a decimal number, or a status is
          "running"
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/args"
--- @include "includes/delta"
--- @include "includes/commit"
--- @include "includes/tombstone"

local K_TOMBSTONE = KEYS[13]

local function main()
  local age = ARGS[2]
  if age == nil or string.find(age, '^%d+$') == nil or #age > 15 then
    fail('BAD_ARG', 'minimum age is not a decimal number of seconds')
  end
  local ttl = arg_uint(ARGS[3], 'tombstone ttl')
  local wanted = {}
  for status in string.gmatch(ARGS[1] or '', '[^,]+') do
    if status == 'running' then fail('BAD_ARG', 'gc never deletes running runs') end
    wanted[status] = true
  end
  local first = tombstone_reply(K_TOMBSTONE)
  if first ~= nil then return first end
  local run = redis.call('HMGET', K_RUN, 'status', 'updated_at', 'version', 'incarnation')
  if not run[1] or not wanted[run[1]] then return 0 end
  if not run[2] or string.find(run[2], '^%d+$') == nil then return 0 end
  local now = tonumber(redis.call('TIME')[1])
  if tonumber(run[2]) > now - tonumber(age) then return 0 end
  redis.call('DEL', K_RUN, K_EVENTS, K_PHASES, K_RESULTS, K_SESSIONS, K_STARTED, K_FINDINGS,
    K_FINDINGS_ORDER, K_WRITERS, K_TASKS, K_QUEUE, K_HISTORY)
  notify(delta_bytes(run[4] or '', run[3] or '0', run[4] or '', run[3] or '0', 'delete'))
  tombstone_keep(K_TOMBSTONE, 1, ttl)
  return 1
end

--- @include "includes/main"
