--[[
  append_event: append one event to the run's log and apply the state rules of contract §5,
  atomically.

  KEYS[1..8] the run's keys (see includes/common.lua)
  ARGV[1] event type (plain text, stored as the entry's "type" field)
  ARGV[2] the stored event (opaque msgpack, the entry's "data" field)
  ARGV[3..] by type:
    agent_started  agent_id, phase_id
    agent_done     agent_id, status (lower case), tokens total, output (opt), findings (opt)
    phase_started  phase_id, label, planned, description (opt), role (opt)
    phase_done     phase_id, ok, failed
    run_done       status, total tokens
    other types    nothing

  Reply:  {version, now, entry id, status, current_phase, total_tokens}
  Errors: LUFT_NO_RUN, LUFT_CORRUPT (a stored field is unreadable), LUFT_OVERFLOW
          (total_tokens would pass 2^64-1), LUFT_BAD_ARG; nothing is written on error.
]]
--- @include "includes/common"

local function main()
  local etype, blob = ARGV[1], ARGV[2]
  local status = run_status()
  local run = redis.call('HMGET', K_RUN, 'current_phase', 'total_tokens')
  local current_phase = stored_uint(K_RUN, 'current_phase', run[1])
  local total = stored_uint(K_RUN, 'total_tokens', run[2])
  local now = now_seconds()
  local run_fields = {}

  local function raise_phase(pid)
    if tonumber(pid) > tonumber(current_phase) then
      current_phase = pid
      run_fields[#run_fields + 1] = 'current_phase'
      run_fields[#run_fields + 1] = pid
    end
  end

  -- 1. checks and reads, computing what to write
  local apply
  if etype == 'agent_started' then
    local aid, pid = ARGV[3], arg_uint(ARGV[4], 'phase_id')
    local seen = redis.call('HGET', K_STARTED, aid)
    local seq
    if seen then
      seq = string.match(seen, '^(%d+) ')
      if not seq then fail('CORRUPT', K_STARTED .. ' ' .. aid .. ' is not "<seq> <phase>"') end
    else
      seq = tostring(redis.call('HLEN', K_STARTED) + 1)
    end
    apply = function() redis.call('HSET', K_STARTED, aid, seq .. ' ' .. pid) end

  elseif etype == 'agent_done' then
    local aid, rstatus, tokens = ARGV[3], ARGV[4], arg_uint(ARGV[5], 'tokens')
    local output, findings = opt(ARGV[6], 'output'), opt(ARGV[7], 'findings')
    local p = aid .. ':'
    local existing = redis.call('HMGET', K_RESULTS, p .. 'status', p .. 'output', p .. 'findings')
    local fields = {p .. 'status', rstatus, p .. 'tokens', tokens}
    if not existing[1] then
      local phase = '0'
      local seen = redis.call('HGET', K_STARTED, aid)
      if seen then
        phase = string.match(seen, '^%d+ (%d+)$')
        if not phase then fail('CORRUPT', K_STARTED .. ' ' .. aid .. ' is not "<seq> <phase>"') end
      end
      fields[#fields + 1] = p .. 'phase_id'
      fields[#fields + 1] = phase
      fields[#fields + 1] = p .. 'completed_at'
      fields[#fields + 1] = now
    end
    if not existing[2] and output then
      fields[#fields + 1] = p .. 'output'
      fields[#fields + 1] = output
    end
    local new_findings = nil
    if not existing[3] and findings then
      fields[#fields + 1] = p .. 'findings'
      fields[#fields + 1] = findings
      new_findings = findings
    end
    total = u64_add(total, tokens, 'total_tokens')
    run_fields[#run_fields + 1] = 'total_tokens'
    run_fields[#run_fields + 1] = total
    apply = function()
      redis.call('HSET', K_RESULTS, unpack(fields))
      if new_findings then set_agent_findings(aid, new_findings) end
    end

  elseif etype == 'phase_started' or etype == 'phase_done' then
    local pid = arg_uint(ARGV[3], 'phase_id')
    local p = pid .. ':'
    local known = redis.call('HEXISTS', K_PHASES, p .. 'label') == 1
    local fields, drop = {}, {}
    if not known then
      local seq = redis.call('HGET', K_RUN, 'phases') or '0'
      seq = u64_add(stored_uint(K_RUN, 'phases', seq), '1', 'phases')
      run_fields[#run_fields + 1] = 'phases'
      run_fields[#run_fields + 1] = seq
      fields = {p .. 'seq', seq}
    end
    local function put(name, value)
      fields[#fields + 1] = p .. name
      fields[#fields + 1] = value
    end
    if etype == 'phase_started' then
      local description, role = opt(ARGV[6], 'description'), opt(ARGV[7], 'role')
      put('label', ARGV[4])
      put('planned', arg_uint(ARGV[5], 'planned'))
      if not known then
        put('ok', '0')
        put('failed', '0')
      end
      if description then put('description', description) else drop[#drop + 1] = p .. 'description' end
      if role then put('role', role) else drop[#drop + 1] = p .. 'role' end
    else
      if not known then
        put('label', '')
        put('planned', '0')
      end
      put('ok', arg_uint(ARGV[4], 'ok'))
      put('failed', arg_uint(ARGV[5], 'failed'))
    end
    raise_phase(pid)
    apply = function()
      if #drop > 0 then redis.call('HDEL', K_PHASES, unpack(drop)) end
      redis.call('HSET', K_PHASES, unpack(fields))
    end

  elseif etype == 'run_done' then
    local reported, reported_total = ARGV[3], arg_uint(ARGV[4], 'total_tokens')
    if reported ~= 'partial' and (not VALID_STATUS[reported] or reported == 'running') then
      fail('BAD_ARG', 'run_done status ' .. tostring(reported) .. ' is not a run status')
    end
    if reported ~= 'partial' and status ~= 'completed' and status ~= 'cancelled' then
      status = reported
      run_fields[#run_fields + 1] = 'status'
      run_fields[#run_fields + 1] = reported
    end
    if reported_total ~= '0' then
      total = reported_total
      run_fields[#run_fields + 1] = 'total_tokens'
      run_fields[#run_fields + 1] = total
    end
  end

  -- 2. writes
  local id = redis.call('XADD', K_EVENTS, '*', 'type', etype, 'data', blob)
  if apply then apply() end
  local version = touch(now, run_fields)
  return {tostring(version), now, id, status, current_phase, total}
end

--- @include "includes/main"
