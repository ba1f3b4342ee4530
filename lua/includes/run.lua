--[[
  The run hash (KEYS[1]): its status, version and incarnation, read and checked, and the
  agent counters it keeps (agents, agents_ok, agents_failed).
]]
--- @defines-only
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/numbers"
--- @include "includes/keytypes"

local VALID_STATUS = {running = true, completed = true, failed = true, cancelled = true}

-- The run's status, version and incarnation (nil for a run written by 0.1.0), then any other
-- run fields asked for, checked; fails with LUFT_NO_RUN when the run does not exist.
local function read_run(...)
  local values = read_key(1, 'hash', 'HMGET', 'status', 'version', 'incarnation', ...)
  local status = values[1]
  if not status then fail('NO_RUN', K_RUN .. ' does not exist') end
  if not VALID_STATUS[status] then
    fail('CORRUPT', K_RUN .. ' status is not a checkpoint status')
  end
  stored_uint(K_RUN, 'version', values[2])
  return values
end

-- The run field `agents`: the number of distinct agents that started (K_STARTED) or have a
-- result (K_RESULTS), what `luft-redis runs` shows. Every script that adds a started agent or
-- a result keeps it (read before its first write, plus what it adds); a run written before
-- the field existed has none, and gets it counted here from the two hashes at its first such
-- write. `n`: the field as the caller read it already (HMGET), when it did.
local function stored_agents(n)
  if n == nil then n = redis.call('HGET', K_RUN, 'agents') end
  if n then return tonumber(stored_uint(K_RUN, 'agents', n)) end
  -- (HGETALL, not HKEYS: the commands of docs/security.md's ACL; once per older run)
  local seen, count = {}, 0
  local started = redis.call('HGETALL', K_STARTED)
  for i = 1, #started, 2 do
    seen[started[i]] = true
    count = count + 1
  end
  local fields = redis.call('HGETALL', K_RESULTS)
  for i = 1, #fields, 2 do
    local aid = string.match(fields[i], '^(.+):status$')
    if aid and not seen[aid] then
      seen[aid] = true
      count = count + 1
    end
  end
  return count
end

-- The run fields agents_ok and agents_failed: the agents whose result's status is "ok", and
-- those with a result of any other status (running = agents - ok - failed: started, no
-- result), what the runs page shows. `changes` lists {status before, status after} of the
-- results a write sets (false/nil: no result); `ok`, `failed`: the two fields as read_run
-- read them (read_run('agents_ok', 'agents_failed', ...): no read of its own). Returns the
-- fields to set with the write's version ({name, value, ...}), nil when no count changes;
-- call it before the first write.
-- A run written before the counters has neither field: counted here from the results as they
-- are before this write (once per run). One field without the other is LUFT_CORRUPT.
local function status_count_fields(changes, stored_ok, stored_failed)
  local dok, dfailed = 0, 0
  for i = 1, #changes do
    local before, after = changes[i][1], changes[i][2]
    if before ~= after then
      if before == 'ok' then dok = dok - 1 elseif before then dfailed = dfailed - 1 end
      if after == 'ok' then dok = dok + 1 elseif after then dfailed = dfailed + 1 end
    end
  end
  if dok == 0 and dfailed == 0 then return nil end
  local stored = {stored_ok, stored_failed}
  local ok, failed = 0, 0
  if stored[1] and stored[2] then
    ok = tonumber(stored_uint(K_RUN, 'agents_ok', stored[1]))
    failed = tonumber(stored_uint(K_RUN, 'agents_failed', stored[2]))
  elseif stored[1] or stored[2] then
    fail('CORRUPT', K_RUN .. ' has one of agents_ok and agents_failed without the other')
  else
    -- (HGETALL, not HSCAN/HKEYS: the commands of docs/security.md's ACL; once per older run)
    local fields = redis.call('HGETALL', K_RESULTS)
    for i = 1, #fields, 2 do
      if string.find(fields[i], ':status$') then
        if fields[i + 1] == 'ok' then ok = ok + 1 else failed = failed + 1 end
      end
    end
  end
  ok, failed = ok + dok, failed + dfailed
  if ok < 0 or failed < 0 then
    fail('CORRUPT', K_RUN .. ' agents_ok/agents_failed are less than the results they count')
  end
  return {'agents_ok', string.format('%.0f', ok), 'agents_failed', string.format('%.0f', failed)}
end
