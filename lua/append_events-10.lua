--[[
  append_events: append a batch of events (one or more) to the run's log and apply the state
  rules of contract §5 to each, in order, as one atomic change (one version, one notice).

  KEYS[1..10] the run's keys (see includes/common.lua)
  ARGV[#ARGV] optional "@retention <ttl_ms> <max_events>", taken off first (includes/retention)
              max_events > 0: the log is trimmed to about max_events entries, and the
              first trim sets the run field log_trimmed = 1 (an R record)
  ARGV[1] writer id   ARGV[2] operation sequence   then ARGS (= ARGV[3..]):
  ARGS[1] number of events, then per event:
    type (plain text, the entry's "type" field), stored event (opaque msgpack, the entry's
    "data" field), number of rule arguments, the rule arguments by type:
      agent_started  agent_id, phase_id
      agent_done     agent_id, status (lower case), tokens total, output (opt), findings (opt)
      phase_started  phase_id, label, planned, description (opt), role (opt)
      phase_done     phase_id, ok, failed
      run_done       status, total tokens
      other types    none

  Reply and notice: the delta (see includes/common.lua), op "append": R records of the changed
          run fields, S of started agents, E res/ph of the results and phases written, F/X of
          finding segments.
  Errors: LUFT_NO_RUN, LUFT_CORRUPT (a stored field is unreadable), LUFT_OVERFLOW
          (total_tokens would pass 2^64-1), LUFT_BAD_ARG, LUFT_STALE; nothing is written on
          error, for any event of the batch.
]]
--- @include "includes/retention"
--- @include "includes/common"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run('current_phase', 'total_tokens', 'phases')
  local status = run[1]
  local current_phase = stored_uint(K_RUN, 'current_phase', run[4])
  local total = stored_uint(K_RUN, 'total_tokens', run[5])
  local phase_count = stored_uint(K_RUN, 'phases', run[6])
  local now = now_seconds()

  -- 1. checks and reads, over a simulated state, collecting the writes
  local writes = {}
  local run_changed = {}
  local started, started_len = {}, nil
  local results, phases = {}, {}
  local findings_touched = false
  local touched_results, touched_phases = {}, {} -- ids in order of first touch
  local function touch_id(list, id)
    if not list[id] then
      list[id] = true
      list[#list + 1] = id
    end
  end

  local function started_entry(aid)
    local entry = started[aid]
    if entry == nil then
      local seen = redis.call('HGET', K_STARTED, aid)
      if seen then
        local seq, phase = string.match(seen, '^(%d+) (%d+)$')
        if not seq then fail('CORRUPT', K_STARTED .. ' ' .. aid .. ' is not "<seq> <phase>"') end
        entry = {seq = seq, phase = phase}
      else
        entry = false
      end
      started[aid] = entry
    end
    return entry
  end

  local function result_entry(aid)
    local entry = results[aid]
    if entry == nil then
      local p = aid .. ':'
      local found = redis.call('HMGET', K_RESULTS, p .. 'status', p .. 'output', p .. 'findings')
      entry = {exists = found[1] ~= false, output = found[2] ~= false, findings = found[3] ~= false}
      results[aid] = entry
    end
    return entry
  end

  local function phase_known(pid)
    local known = phases[pid]
    if known == nil then
      known = redis.call('HEXISTS', K_PHASES, pid .. ':label') == 1
      phases[pid] = known
    end
    return known
  end

  local function raise_phase(pid)
    if tonumber(pid) > tonumber(current_phase) then
      current_phase = pid
      run_changed.current_phase = true
    end
  end

  local count = tonumber(arg_uint(ARGS[1], 'event count'))
  local pos = 2
  local entries = {}
  for _ = 1, count do
    local etype, blob, nargs = ARGS[pos], ARGS[pos + 1], tonumber(arg_uint(ARGS[pos + 2], 'nargs'))
    if etype == nil or blob == nil then fail('BAD_ARG', 'argument list is short') end
    local a = {}
    for i = 1, nargs do a[i] = ARGS[pos + 2 + i] end
    pos = pos + 3 + nargs
    entries[#entries + 1] = {etype, blob}

    if etype == 'agent_started' then
      local aid, pid = a[1], arg_uint(a[2], 'phase_id')
      local entry = started_entry(aid)
      if not entry then
        if started_len == nil then started_len = redis.call('HLEN', K_STARTED) end
        started_len = started_len + 1
        entry = {seq = tostring(started_len)}
        started[aid] = entry
      end
      entry.phase = pid
      local value = entry.seq .. ' ' .. pid
      writes[#writes + 1] = function()
        redis.call('HSET', K_STARTED, aid, value)
        rec('S', aid, value)
      end

    elseif etype == 'agent_done' then
      local aid, rstatus, tokens = a[1], a[2], arg_uint(a[3], 'tokens')
      local output, findings = opt(a[4], 'output'), opt(a[5], 'findings')
      local p = aid .. ':'
      local entry = result_entry(aid)
      local fields = {p .. 'status', rstatus, p .. 'tokens', tokens}
      if not entry.exists then
        local seen = started_entry(aid)
        fields[#fields + 1] = p .. 'phase_id'
        fields[#fields + 1] = seen and seen.phase or '0'
        fields[#fields + 1] = p .. 'completed_at'
        fields[#fields + 1] = now
        entry.exists = true
      end
      if not entry.output and output then
        fields[#fields + 1] = p .. 'output'
        fields[#fields + 1] = output
        entry.output = true
      end
      local new_findings = nil
      if not entry.findings and findings then
        fields[#fields + 1] = p .. 'findings'
        fields[#fields + 1] = findings
        new_findings = findings
        entry.findings = true
        findings_touched = true
      end
      total = u64_add(total, tokens, 'total_tokens')
      run_changed.total_tokens = true
      touch_id(touched_results, aid)
      writes[#writes + 1] = function()
        redis.call('HSET', K_RESULTS, unpack(fields))
        if new_findings then set_agent_findings(aid, new_findings) end
      end

    elseif etype == 'phase_started' or etype == 'phase_done' then
      local pid = arg_uint(a[1], 'phase_id')
      local p = pid .. ':'
      local fields = {}
      local known = phase_known(pid)
      local function put(name, value)
        fields[#fields + 1] = p .. name
        fields[#fields + 1] = value
      end
      if not known then
        phase_count = u64_add(phase_count, '1', 'phases')
        run_changed.phases = true
        put('seq', phase_count)
        phases[pid] = true
      end
      if etype == 'phase_started' then
        put('label', a[2])
        put('planned', arg_uint(a[3], 'planned'))
        if not known then
          put('ok', '0')
          put('failed', '0')
        end
        -- a repeated phase_started keeps the stored description/role it leaves null
        -- (luft's SQLite backend: COALESCE(excluded.x, phases.x))
        local description, role = opt(a[4], 'description'), opt(a[5], 'role')
        if description then put('description', description) end
        if role then put('role', role) end
      else
        if not known then
          put('label', '')
          put('planned', '0')
        end
        put('ok', arg_uint(a[2], 'ok'))
        put('failed', arg_uint(a[3], 'failed'))
      end
      raise_phase(pid)
      touch_id(touched_phases, pid)
      writes[#writes + 1] = function()
        redis.call('HSET', K_PHASES, unpack(fields))
      end

    elseif etype == 'run_done' then
      local reported, reported_total = a[1], arg_uint(a[2], 'total_tokens')
      if reported ~= 'partial' and (not VALID_STATUS[reported] or reported == 'running') then
        fail('BAD_ARG', 'run_done status ' .. tostring(reported) .. ' is not a run status')
      end
      if reported ~= 'partial' and status ~= 'completed' and status ~= 'cancelled' then
        status = reported
        run_changed.status = true
      end
      if reported_total ~= '0' then
        total = reported_total
        run_changed.total_tokens = true
      end
    end
  end
  if pos - 1 ~= #ARGS then fail('BAD_ARG', 'argument list does not match the event count') end
  if findings_touched then check_findings_keys() end

  -- 2. writes
  for i = 1, #entries do
    redis.call('XADD', K_EVENTS, '*', 'type', entries[i][1], 'data', entries[i][2])
  end
  for i = 1, #writes do writes[i]() end
  for i = 1, #touched_results do
    rec_entity('res', K_RESULTS, touched_results[i], RESULT_ATTRS)
  end
  for i = 1, #touched_phases do
    rec_entity('ph', K_PHASES, touched_phases[i], PHASE_ATTRS)
  end
  local fields = {}
  if run_changed.status then fields[#fields + 1] = 'status'; fields[#fields + 1] = status end
  if run_changed.current_phase then
    fields[#fields + 1] = 'current_phase'; fields[#fields + 1] = current_phase
  end
  if run_changed.total_tokens then
    fields[#fields + 1] = 'total_tokens'; fields[#fields + 1] = total
  end
  if run_changed.phases then fields[#fields + 1] = 'phases'; fields[#fields + 1] = phase_count end
  if trim_log() then fields[#fields + 1] = 'log_trimmed'; fields[#fields + 1] = '1' end
  return retained(commit(run, now, 'append', fields), status)
end

--- @include "includes/main"
