--[[
  upsert_agent_result: insert or replace agent_results[agent_id] (contract §4); the agent's
  findings replace its earlier ones in the run's finding list. total_tokens is untouched and
  no event is added.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[#ARGV - 1], ARGV[#ARGV] the fence and retention option slots, always there, taken off
          first (includes/options.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] agent_id   ARGS[2] phase_id   ARGS[3] status   ARGS[4] tokens   ARGS[5] completed_at
  ARGS[6] output (opt msgpack)   ARGS[7] findings (opt msgpack, absent when empty)
  ARGS[8..] cache_key_hash (opt), description (opt), role (opt): RESULT_OPTIONAL of
          includes/entities.lua from output on

  History: a P record of the result (what changed), its F record only when the blob changed
          (includes/history.lua).
  Reply and notice: the delta, op "result": E res of the agent, F/X of its finding segments,
          R agents when the agent is new (neither started nor had a result), R agents_ok and
          agents_failed when the agent's status counts change (includes/run.lua)
  A fenced write (its fence slot, see includes/fence.lua) is applied only while the lease is
  current, else LUFT_LEASE_LOST and nothing is written.
  Errors: LUFT_LEASE_LOST, LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG, LUFT_STALE
]]
--- @include "includes/call"
--- @include "includes/args"
--- @include "includes/time"
--- @include "includes/run"
--- @include "includes/delta"
--- @include "includes/commit"
--- @include "includes/findings"
--- @include "includes/entities"
--- @include "includes/fence"
--- @include "includes/retention"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run('agents_ok', 'agents_failed')
  local fenced, fence_state = check_fence(run)
  if fenced then check_fenced_result(fence_state, ARGS[3]) end
  local aid = ARGS[1]
  local p = aid .. ':'
  local fields = {
    p .. 'status', ARGS[3], p .. 'phase_id', arg_uint(ARGS[2], 'phase_id'),
    p .. 'tokens', arg_uint(ARGS[4], 'tokens'),
    p .. 'completed_at', arg_uint(ARGS[5], 'completed_at'),
  }
  local drop = {}
  optional_fields(fields, drop, p, RESULT_OPTIONAL, 6)
  local findings = opt(ARGS[7], 'findings') or EMPTY_LIST
  local now = now_seconds()
  local run_fields = {}
  -- the result and its finding segment as stored: the history records what changed
  local names = {}
  for i = 1, #RESULT_ATTRS do names[i] = p .. RESULT_ATTRS[i] end
  local stored = redis.call('HMGET', K_RESULTS, unpack(names))
  history_before('res', aid, RESULT_ATTRS, stored, redis.call('HGET', K_FINDINGS, aid))
  local before = stored[1] -- (RESULT_ATTRS[1] is status)
  if not before and redis.call('HEXISTS', K_STARTED, aid) == 0 then
    run_fields = {'agents', tostring(stored_agents() + 1)} -- a new agent
  end
  local counted = status_count_fields({{before, ARGS[3]}}, run[4], run[5])
  if counted then for i = 1, 4 do run_fields[#run_fields + 1] = counted[i] end end

  if #drop > 0 then redis.call('HDEL', K_RESULTS, unpack(drop)) end
  redis.call('HSET', K_RESULTS, unpack(fields))
  set_agent_findings(aid, findings)
  -- the result is now exactly `fields` (every optional attribute was set or dropped): its E
  -- record needs no read back
  local out, skip = {}, #p
  for i = 1, #fields, 2 do
    out[#out + 1] = string.sub(fields[i], skip + 1)
    out[#out + 1] = fields[i + 1]
  end
  rec_attrs('res', aid, out)
  return retained(commit(run, now, 'result', run_fields), run[1])
end

--- @include "includes/main"
