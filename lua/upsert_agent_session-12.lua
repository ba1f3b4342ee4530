--[[
  upsert_agent_session: insert or replace agent_sessions[agent_id] (contract §4).

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[#ARGV - 1], ARGV[#ARGV] the fence and retention option slots, always there, taken off
          first (includes/options.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] agent_id   ARGS[2] backend_id (opt)   ARGS[3] protocol_session_id (opt)
  ARGS[4] session_id   ARGS[5] status   ARGS[6] updated_at   ARGS[7] resumable ("true"/"false")

  Reply and notice: the delta, op "session": E ses of the agent
  A fenced write (its fence slot, see includes/fence.lua) is applied only while the lease is
  current, else LUFT_LEASE_LOST and nothing is written.
  Errors: LUFT_LEASE_LOST, LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG, LUFT_STALE
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/args"
--- @include "includes/time"
--- @include "includes/run"
--- @include "includes/delta"
--- @include "includes/commit"
--- @include "includes/entities"
--- @include "includes/fence"
--- @include "includes/retention"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run()
  check_fence(run)
  local p = ARGS[1] .. ':'
  if ARGS[7] ~= 'true' and ARGS[7] ~= 'false' then fail('BAD_ARG', 'resumable is not a bool') end
  local fields = {
    p .. 'session_id', ARGS[4], p .. 'status', ARGS[5],
    p .. 'updated_at', arg_uint(ARGS[6], 'updated_at'), p .. 'resumable', ARGS[7],
  }
  local drop = {}
  optional_fields(fields, drop, p, {'backend_id', 'protocol_session_id'}, 2)
  local now = now_seconds()

  if #drop > 0 then redis.call('HDEL', K_SESSIONS, unpack(drop)) end
  redis.call('HSET', K_SESSIONS, unpack(fields))
  rec_entity('ses', K_SESSIONS, ARGS[1], SESSION_ATTRS)
  return retained(commit(run, now, 'session'), run[1])
end

--- @include "includes/main"
