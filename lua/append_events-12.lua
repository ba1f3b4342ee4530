--[[
  append_events: append a batch of events (one or more) to the run's log and apply the state
  rules of contract §5 to each, in order, as one atomic change (one version, one notice).

  KEYS[1..12] the run's keys (see includes/call.lua)
              max_events > 0: the log is trimmed to about max_events entries, and the
              first trim sets the run field log_trimmed = 1 (an R record)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[#ARGV - 1], ARGV[#ARGV] the fence and retention option slots, always there, taken off
          first (includes/options.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS (= ARGV[4..]):
  ARGS[1] number of events, then per event:
    the stream entry: its length n (even, >= 2), then n arguments, the entry's field-value
    pairs as XADD takes them ("type" <etype> first, the rest opaque: plain-text fields and
    the "data" blob, built by luft_redis.codec.encode_entry), then the rule arguments, a fixed
    number by type; "<a> <b>" is one argument of space-separated words (ids, lower-case names
    and decimals never hold a space):
      agent_started  "<agent_id> <phase_id>"
      agent_done     "<agent_id> <status> <tokens total> <output at> <output length>
                     <findings at> <findings length> <k>", the blob header, then k pairs
                     name, value (opt): the result's output and findings are cut from the
                     entry's "data" blob (sent once, not twice): the bytes at those 1-based
                     offsets and lengths, behind the blob header; a length of 0: none (no
                     output, no findings). The pairs: the event's fields that are also
                     optional text attributes of a result (RESULT_FILLABLE), which fill the
                     result where it lacks them, as its output does (contract §5)
      phase_started  "<phase_id> <planned>", label, description (opt), role (opt)
      phase_done     "<phase_id> <ok> <failed>"
      run_done       "<status> <total tokens>"
      other types    none

  Reply and notice: the delta (see includes/delta.lua), op "append": R records of the changed
          run fields (agents: +1 per agent that neither started nor had a result before), S of started agents, E res/ph of the results and phases written, F/X of
          finding segments; R agents_ok, agents_failed when a result's status changes
          (includes/run.lua).
  A fenced batch (its fence slot, see includes/fence.lua) is applied only while
  the lease is current; its agent_done of the leased agent ends the lease: an ok status makes
  the task done, any other a failed attempt (ready again until max_attempts, then dead). The
  token stays current until the next claim of the task.

  Errors: LUFT_LEASE_LOST (fenced, and the lease was taken over: nothing is written),
          LUFT_NO_RUN, LUFT_CORRUPT (a stored field is unreadable), LUFT_OVERFLOW
          (total_tokens would pass 2^64-1), LUFT_BAD_ARG, LUFT_STALE; nothing is written on
          error, for any event of the batch.
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/numbers"
--- @include "includes/args"
--- @include "includes/time"
--- @include "includes/hset_flat"
--- @include "includes/keytypes"
--- @include "includes/run"
--- @include "includes/delta"
--- @include "includes/commit"
--- @include "includes/findings"
--- @include "includes/entities"
--- @include "includes/fence"
--- @include "includes/tasks"
--- @include "includes/retention"

-- An agent_done's output or findings blob: `head` (the blob header), then the `len` bytes of
-- `data` (its entry's data blob) from the 1-based offset `at`; nil when `len` is 0.
local function cut(data, head, at, len, name)
  len = tonumber(len)
  if len == 0 then return nil end
  at = tonumber(at)
  if head == nil or at < 1 or at + len - 1 > #data then
    fail('BAD_ARG', 'agent_done ' .. name .. ' is not within its entry\'s data')
  end
  return head .. string.sub(data, at, at + len - 1)
end

local NO_FILLS = {} -- (read only: the pairs of an agent_done without any, no table per event)

-- The k pairs name, value (opt) of an agent_done from ARGS[at]: {{name, value or nil}, ...};
-- LUFT_BAD_ARG for a name that is no optional text attribute of a result.
local function fill_pairs(at, k)
  if k == 0 then return NO_FILLS end
  local out = {}
  for j = 0, k - 1 do
    local name = ARGS[at + 2 * j]
    if not RESULT_FILLABLE[name] then
      fail('BAD_ARG', 'agent_done names ' .. tostring(name) .. ', no text attribute of a result')
    end
    out[j + 1] = {name, opt(ARGS[at + 2 * j + 1], name)}
  end
  return out
end

local function main()
  -- the wrong-type check: the keys read below before the first write (run, writers,
  -- started, results, phases, tasks) fail with LUFT_CORRUPT as they are read (read_key); of
  -- the keys written without a read, the log and the history are probed here, the finding hash and list when
  -- an event writes findings and the queue when the batch ends a lease (probe_once)
  local dup = dedup({2, 'stream', 12, 'stream'})
  if dup then return dup end
  local run = read_run('current_phase', 'total_tokens', 'phases', 'agents', 'agents_ok',
    'agents_failed')
  local status = run[1]
  local current_phase = stored_uint(K_RUN, 'current_phase', run[4])
  local total = stored_uint(K_RUN, 'total_tokens', run[5])
  local phase_count = stored_uint(K_RUN, 'phases', run[6])
  local fenced, fence_state = check_fence(run)
  local lease_end = nil -- {fields, score} when this batch ends the lease
  local now = now_seconds()
  local probed = {}
  local function probe_once(i, kind)
    if not probed[i] then
      probed[i] = true
      probe_type(i, kind)
    end
  end

  -- 1. checks and reads, over a simulated state, collecting the writes
  local writes = {}
  local started_fields, result_fields, new_segments = {}, {}, {}
  local run_changed = {}
  local started, started_len = {}, nil
  local results, phases = {}, {}
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
      local seen = read_key(6, 'hash', 'HGET', aid)
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
      local found = read_key(4, 'hash', 'HMGET', p .. 'status', p .. 'output', p .. 'findings')
      entry = {exists = found[1] ~= false, output = found[2] ~= false, findings = found[3] ~= false}
      entry.before = found[1] -- the stored status (run fields agents_ok/agents_failed)
      -- a result new in this batch holds exactly what the batch writes (its E record is
      -- built from that, with no read back)
      entry.new = not (entry.exists or entry.output or entry.findings)
      entry.attrs = {}
      results[aid] = entry
    end
    return entry
  end

  -- The rule arguments of an event: `n` of them, from ARGS[pos]; "<a> <b>" ones split by
  -- `pattern`. Fails with LUFT_BAD_ARG when one is missing or malformed.
  local function words(value, pattern, etype)
    local a, b, c = string.match(value or '', pattern)
    if not a then fail('BAD_ARG', etype .. ' arguments are malformed') end
    return a, b, c
  end

  local function phase_known(pid)
    local known = phases[pid]
    if known == nil then
      known = read_key(3, 'hash', 'HEXISTS', pid .. ':label') == 1
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

  local new_agents = 0 -- distinct agents this batch adds (run field agents)
  local count = tonumber(arg_uint(ARGS[1], 'event count'))
  local pos = 2
  local entries = {}
  for _ = 1, count do
    -- the entry: its length n, then n/2 field-value pairs, "type" <etype> first
    local n = tonumber(arg_uint(ARGS[pos], 'entry length'))
    local etype = ARGS[pos + 2]
    if n < 2 or n % 2 == 1 or ARGS[pos + 1] ~= 'type' or etype == nil or ARGS[pos + n] == nil then
      fail('BAD_ARG', 'a stream entry is malformed or the argument list is short')
    end
    entries[#entries + 1] = {pos + 1, pos + n}
    local data = ARGS[pos + n - 1] == 'data' and ARGS[pos + n] or '' -- (the last pair)
    pos = pos + n + 1
    local a1, a2, a3, a4 = ARGS[pos], ARGS[pos + 1], ARGS[pos + 2], ARGS[pos + 3]

    if etype == 'agent_started' then
      local aid, pid = words(a1, '^(%S+) (%d+)$', etype)
      pos = pos + 1
      local entry = started_entry(aid)
      if not entry then
        -- a new agent unless it already has a result (stored, or from this batch)
        if not result_entry(aid).exists then new_agents = new_agents + 1 end
        if started_len == nil then started_len = read_key(6, 'hash', 'HLEN') end
        started_len = started_len + 1
        entry = {seq = tostring(started_len)}
        started[aid] = entry
      end
      entry.phase = pid
      local value = entry.seq .. ' ' .. pid
      writes[#writes + 1] = function()
        started_fields[#started_fields + 1] = aid
        started_fields[#started_fields + 1] = value
        rec('S', aid, value)
      end

    elseif etype == 'agent_done' then
      local aid, rstatus, tokens, o_at, o_len, f_at, f_len, k = string.match(a1 or '',
        '^(%S+) (%S+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
      if not aid then fail('BAD_ARG', etype .. ' arguments are malformed') end
      local output = cut(data, a2, o_at, o_len, 'output')
      local findings = cut(data, a2, f_at, f_len, 'findings')
      local fills = fill_pairs(pos + 2, tonumber(k))
      pos = pos + 2 + 2 * #fills
      local p = aid .. ':'
      local entry = result_entry(aid)
      local fields = {p .. 'status', rstatus, p .. 'tokens', tokens}
      local attrs = entry.attrs
      attrs.status, attrs.tokens = rstatus, tokens
      if not entry.exists then
        local seen = started_entry(aid)
        if not seen then new_agents = new_agents + 1 end -- neither started nor a result
        local phase = seen and seen.phase or '0'
        fields[#fields + 1] = p .. 'phase_id'
        fields[#fields + 1] = phase
        fields[#fields + 1] = p .. 'completed_at'
        fields[#fields + 1] = now
        attrs.phase_id, attrs.completed_at = phase, now
        entry.exists = true
      end
      if not entry.output and output then
        fields[#fields + 1] = p .. 'output'
        fields[#fields + 1] = output
        attrs.output = output
        entry.output = true
      end
      local new_findings = nil
      if not entry.findings and findings then
        fields[#fields + 1] = p .. 'findings'
        fields[#fields + 1] = findings
        attrs.findings = findings
        new_findings = findings
        entry.findings = true
        probe_once(7, 'hash')
        probe_once(8, 'list')
      end
      if #fills > 0 then
        -- a stored result keeps what it has; one of this batch has what `attrs` holds
        local stored = {}
        if not entry.new then
          local names = {}
          for j = 1, #fills do names[j] = p .. fills[j][1] end
          stored = read_key(4, 'hash', 'HMGET', unpack(names))
        end
        for j = 1, #fills do
          local name, value = fills[j][1], fills[j][2]
          if value and not stored[j] and attrs[name] == nil then
            fields[#fields + 1] = p .. name
            fields[#fields + 1] = value
            attrs[name] = value
          end
        end
      end
      if aid == fenced then
        -- the lease's agent_done ends it, once: a second one (in this batch, or after the ok
        -- one that made the task done) is refused. An ok status makes the task done, any
        -- other is a failed attempt, which needs the task's counts
        if lease_end ~= nil or fence_state ~= 'leased' then fence_ended() end
        probe_once(11, 'zset')
        local ended, score
        if rstatus == 'ok' then
          ended, score = end_lease(aid, true)
        else
          local t = redis.call('HMGET', K_TASKS, p .. 'failures', p .. 'max', p .. 'seq')
          ended, score = end_lease(aid, false, task_uint(aid, 'failures', t[1]),
            task_uint(aid, 'max', t[2]), task_uint(aid, 'seq', t[3]))
        end
        lease_end = {ended, score}
      end
      total = u64_add(total, tokens, 'total_tokens')
      run_changed.total_tokens = true
      touch_id(touched_results, aid)
      writes[#writes + 1] = function()
        for j = 1, #fields do result_fields[#result_fields + 1] = fields[j] end
        if new_findings then set_agent_findings(aid, new_findings, new_segments) end
      end

    elseif etype == 'phase_started' or etype == 'phase_done' then
      local pid, x, y
      local description, role
      if etype == 'phase_started' then
        pid, x = words(a1, '^(%d+) (%d+)$', etype)
        y = a2 -- the label: checked before anything is written
        if y == nil then fail('BAD_ARG', 'phase_started lacks its label') end
        description, role = opt(a3, 'description'), opt(a4, 'role')
        pos = pos + 4
      else
        pid, x, y = words(a1, '^(%d+) (%d+) (%d+)$', etype)
        pos = pos + 1
      end
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
        put('label', y)
        put('planned', x)
        if not known then
          put('ok', '0')
          put('failed', '0')
        end
        -- a repeated phase_started keeps the stored description/role it leaves null
        -- (luft's SQLite backend: COALESCE(excluded.x, phases.x))
        if description then put('description', description) end
        if role then put('role', role) end
      else
        if not known then
          put('label', '')
          put('planned', '0')
        end
        put('ok', x)
        put('failed', y)
      end
      raise_phase(pid)
      touch_id(touched_phases, pid)
      writes[#writes + 1] = function()
        redis.call('HSET', K_PHASES, unpack(fields))
      end

    elseif etype == 'run_done' then
      local reported, reported_total = words(a1, '^(%l+) (%d+)$', etype)
      pos = pos + 1
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
  local agents = nil
  if new_agents > 0 then agents = tostring(stored_agents(run[7] or false) + new_agents) end
  local changes = {}
  for i = 1, #touched_results do
    local entry = results[touched_results[i]]
    changes[i] = {entry.before, entry.attrs.status}
  end
  local counted = status_count_fields(changes, run[8], run[9]) -- nil: no count changes

  -- 2. writes
  if lease_end then write_task_end(fenced, lease_end[1], lease_end[2]) end
  for i = 1, #entries do
    HISTORY_EVENT = redis.call('XADD', K_EVENTS, '*', unpack(ARGS, entries[i][1], entries[i][2]))
    HISTORY_APPENDED = i
  end
  -- one HSET per hash and one RPUSH for the whole batch (a later value of a field in the same
  -- HSET wins, as it would in separate calls)
  for i = 1, #writes do writes[i]() end
  if #started_fields > 0 then hset_flat(K_STARTED, started_fields) end
  if #result_fields > 0 then hset_flat(K_RESULTS, result_fields) end
  for i = 1, #new_segments, 4000 do
    redis.call('RPUSH', K_FINDINGS_ORDER, unpack(new_segments, i, math.min(i + 3999, #new_segments)))
  end
  for i = 1, #touched_results do
    local aid = touched_results[i]
    local entry = results[aid]
    if entry.new then -- exactly what this batch wrote: no read back
      local out, attrs = {}, entry.attrs
      for j = 1, #RESULT_ATTRS do
        local value = attrs[RESULT_ATTRS[j]]
        if value then
          out[#out + 1] = RESULT_ATTRS[j]
          out[#out + 1] = value
        end
      end
      rec_attrs('res', aid, out)
    else
      rec_entity('res', K_RESULTS, aid, RESULT_ATTRS)
    end
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
  if agents then fields[#fields + 1] = 'agents'; fields[#fields + 1] = agents end
  if counted then for i = 1, 4 do fields[#fields + 1] = counted[i] end end
  local trimmed, first_trim = trim_log()
  -- a trim restarts the history at this version once it holds twice max_events entries
  HISTORY_RESTART = trimmed and redis.call('XLEN', K_HISTORY) > 2 * RETAIN_MAX_EVENTS
  if first_trim then fields[#fields + 1] = 'log_trimmed'; fields[#fields + 1] = '1' end
  if status == 'running' and run[1] == 'running' then
    -- no retention rule to apply (no PTTL read): a running run holds no TTL, since every
    -- script that leaves a run running (or makes it so) clears it (includes/retention)
    return commit(run, now, 'append', fields)
  end
  return retained(commit(run, now, 'append', fields), status)
end

--- @include "includes/main"
