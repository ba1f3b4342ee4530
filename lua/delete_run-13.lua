--[[
  delete_run: delete every key of a run (its state, its event log, its writers, its agent tasks) and tell the
  processes watching it; exactly once per writer operation.

  KEYS[1..12] the run's keys (see includes/call.lua)
  KEYS[13]    the run's tombstone hash: <writer id> -> "<op seq> <reply>", expiring after
              ARGS[1] seconds (a retried delete whose reply was lost gets its first answer)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] tombstone TTL in seconds

  Reply:  1 when the run existed, 0 when it did not (any leftovers are deleted all the same);
          a retry of the same operation gets the first attempt's reply and changes nothing
  Notice: (only when it existed) a delta header with op "delete" from the run's last
          (incarnation, version), no records: subscribers learn that this incarnation is gone
  Errors: LUFT_BAD_ARG. Keys of the wrong type are deleted like the rest (delete is the way
          to clear a damaged run).
]]
--- @include "includes/call"
--- @include "includes/args"
--- @include "includes/delta"
--- @include "includes/commit"
--- @include "includes/tombstone"

local K_TOMBSTONE = KEYS[13]

local function main()
  local ttl = arg_uint(ARGS[1], 'tombstone ttl')
  local first = tombstone_reply(K_TOMBSTONE)
  if first ~= nil then return first end
  local run = redis.pcall('HMGET', K_RUN, 'version', 'incarnation')
  local existed = redis.call('EXISTS', K_RUN)
  redis.call('DEL', K_RUN, K_EVENTS, K_PHASES, K_RESULTS, K_SESSIONS, K_STARTED, K_FINDINGS,
    K_FINDINGS_ORDER, K_WRITERS, K_TASKS, K_QUEUE, K_HISTORY)
  if existed == 1 then
    local version, inc = '0', ''
    if type(run) == 'table' and not run.err then
      version = run[1] or '0'
      inc = run[2] or ''
    end
    notify(delta_bytes(inc, version, inc, version, 'delete'))
  end
  tombstone_keep(K_TOMBSTONE, existed, ttl)
  return existed
end

--- @include "includes/main"
