--[[
  save_checkpoint: replace the run's whole state (not its event log) atomically
  (contract §4). updated_at becomes the server time; run_dir and the event log are kept.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[#ARGV - 1], ARGV[#ARGV] the fence and retention option slots, always there, taken off
          first (includes/options.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] task   ARGS[2] status   ARGS[3] current_phase   ARGS[4] total_tokens
  ARGS[5] created_at   ARGS[6] workflow_meta (opt msgpack)
  then five counted groups, each "<count>" followed by count * width arguments:
    phases    phase_id, label, planned, ok, failed, then PHASE_OPTIONAL (description, role)
    results   agent_id, phase_id, status, tokens, completed_at, then RESULT_OPTIONAL (output,
              findings, cache_key_hash, description, role)
    sessions  agent_id, SESSION_OPTIONAL (backend_id, protocol_session_id), session_id,
              status, updated_at, resumable
              (the optional ones: includes/entities.lua; each "(opt)")
    started   width 1: agent_id (in order)
    findings  width 2: segment id, msgpack list of findings (in order)

  The run field agents is set to the number of distinct agent ids among the results and
  the started agents, agents_ok and agents_failed to the results with status ok and with
  another status (the state is replaced wholesale: counted, not added to).

  Reply and notice: the delta, op "save": a Z record with the whole new state
  Errors: LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG, LUFT_STALE; nothing is written on error.
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/args"
--- @include "includes/time"
--- @include "includes/hset_flat"
--- @include "includes/run"
--- @include "includes/commit"
--- @include "includes/entities"
--- @include "includes/retention"

-- (the optional attributes: includes/entities; a null one is simply not stored: the hashes
-- are emptied before they are written, so optional_fields' drop list is unused)

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run()
  if not VALID_STATUS[ARGS[2]] then fail('BAD_ARG', 'status is not a checkpoint status') end
  local run_fields = {
    'task', ARGS[1], 'status', ARGS[2], 'current_phase', arg_uint(ARGS[3], 'current_phase'),
    'total_tokens', arg_uint(ARGS[4], 'total_tokens'),
    'created_at', arg_uint(ARGS[5], 'created_at'),
  }
  local meta = opt(ARGS[6], 'workflow_meta')
  local pos = 7

  local function group(width)
    local count = tonumber(arg_uint(ARGS[pos], 'group count'))
    local first = pos + 1
    pos = first + count * width
    if pos - 1 > #ARGS then fail('BAD_ARG', 'argument list is short') end
    return first, count
  end

  local phases = {}
  local width = 5 + #PHASE_OPTIONAL -- the arguments of one phase
  local first, count = group(width)
  for i = 0, count - 1 do
    local a = first + i * width
    local p = arg_uint(ARGS[a], 'phase_id') .. ':'
    local f = {p .. 'seq', tostring(i + 1), p .. 'label', ARGS[a + 1],
      p .. 'planned', arg_uint(ARGS[a + 2], 'planned'), p .. 'ok', arg_uint(ARGS[a + 3], 'ok'),
      p .. 'failed', arg_uint(ARGS[a + 4], 'failed')}
    optional_fields(f, {}, p, PHASE_OPTIONAL, a + 5)
    for j = 1, #f do phases[#phases + 1] = f[j] end
  end
  run_fields[#run_fields + 1] = 'phases'
  run_fields[#run_fields + 1] = tostring(count)

  local results = {}
  local agents, agent_count = {}, 0 -- distinct agents with a result or started
  local ok_count, failed_count = 0, 0 -- run fields agents_ok, agents_failed
  width = 5 + #RESULT_OPTIONAL
  first, count = group(width)
  for i = 0, count - 1 do
    local a = first + i * width
    if not agents[ARGS[a]] then
      agents[ARGS[a]] = true
      agent_count = agent_count + 1
    end
    if ARGS[a + 2] == 'ok' then ok_count = ok_count + 1 else failed_count = failed_count + 1 end
    local p = ARGS[a] .. ':'
    local f = {p .. 'phase_id', arg_uint(ARGS[a + 1], 'phase_id'), p .. 'status', ARGS[a + 2],
      p .. 'tokens', arg_uint(ARGS[a + 3], 'tokens'),
      p .. 'completed_at', arg_uint(ARGS[a + 4], 'completed_at')}
    optional_fields(f, {}, p, RESULT_OPTIONAL, a + 5)
    for j = 1, #f do results[#results + 1] = f[j] end
  end

  local sessions = {}
  width = 5 + #SESSION_OPTIONAL
  first, count = group(width)
  for i = 0, count - 1 do
    local a = first + i * width
    local p = ARGS[a] .. ':'
    local o = a + #SESSION_OPTIONAL -- (the optional ones come first, after the agent id)
    local f = {p .. 'session_id', ARGS[o + 1], p .. 'status', ARGS[o + 2],
      p .. 'updated_at', arg_uint(ARGS[o + 3], 'updated_at'), p .. 'resumable', ARGS[o + 4]}
    optional_fields(f, {}, p, SESSION_OPTIONAL, a + 1)
    for j = 1, #f do sessions[#sessions + 1] = f[j] end
  end

  -- started agents keep the phase their agent_started event gave, when one was seen
  local old_started = redis.call('HGETALL', K_STARTED)
  local old_phase = {}
  for i = 1, #old_started, 2 do
    local phase = string.match(old_started[i + 1], '^%d+ (%d+)$')
    if not phase then
      fail('CORRUPT', K_STARTED .. ' ' .. old_started[i] .. ' is not "<seq> <phase>"')
    end
    old_phase[old_started[i]] = phase
  end
  local started = {}
  first, count = group(1)
  for i = 0, count - 1 do
    local aid = ARGS[first + i]
    if not agents[aid] then
      agents[aid] = true
      agent_count = agent_count + 1
    end
    started[#started + 1] = aid
    started[#started + 1] = tostring(i + 1) .. ' ' .. (old_phase[aid] or '0')
  end

  local findings, order = {}, {}
  first, count = group(2)
  for i = 0, count - 1 do
    local a = first + i * 2
    findings[#findings + 1] = ARGS[a]
    findings[#findings + 1] = ARGS[a + 1]
    order[#order + 1] = ARGS[a]
  end
  if pos - 1 ~= #ARGS then fail('BAD_ARG', 'argument list is too long') end
  run_fields[#run_fields + 1] = 'agents'
  run_fields[#run_fields + 1] = tostring(agent_count)
  for _, v in ipairs({'agents_ok', tostring(ok_count), 'agents_failed', tostring(failed_count)}) do
    run_fields[#run_fields + 1] = v
  end
  local now = now_seconds()

  redis.call('DEL', K_PHASES, K_RESULTS, K_SESSIONS, K_STARTED, K_FINDINGS, K_FINDINGS_ORDER)
  if meta then
    run_fields[#run_fields + 1] = 'workflow_meta'
    run_fields[#run_fields + 1] = meta
  else
    redis.call('HDEL', K_RUN, 'workflow_meta')
  end
  hset_flat(K_PHASES, phases)
  hset_flat(K_RESULTS, results)
  hset_flat(K_SESSIONS, sessions)
  hset_flat(K_STARTED, started)
  hset_flat(K_FINDINGS, findings)
  local i = 1
  while i <= #order do
    local j = math.min(i + 3999, #order)
    redis.call('RPUSH', K_FINDINGS_ORDER, unpack(order, i, j))
    i = j + 1
  end
  return retained(commit(run, now, 'save', run_fields, true), ARGS[2])
end

--- @include "includes/main"
