--[[
  The run's history (KEYS[12], a stream; docs/redis-layout.md, "history"): one entry per
  version, added by commit() in the script that makes the version. An entry holds the records
  of the change notice that the same script publishes, which every cache applies, so a state
  folded from a base and the entries after it is the state each version had
  (luft_redis/history.py).

  An entry's fields:
    v   the version it made (decimal)
    op  the operation, as in the delta ('append', 'claim', 'result', ...)
    d   a change: its records (includes/delta.lua: the index of lengths, then the parts),
        without the R records of run fields that are not checkpoint state (version,
        updated_at, lease_token, agents, ...); absent when the change holds no other (a
        claim, a submit: only the version and updated_at moved). An entity the script
        replaced whole, having told what it held before (history_before: a result upsert),
        is a P record of what changed instead of its E record:
          P section id n (attr value)*n m attr*m   n attributes set, m removed
        and its finding segment's F record is left out when the blob is the one stored.
    z   a base, instead of d: the whole state after the change (a Z record)
    t   updated_at (unix seconds) when it is not the second of the entry's id
    e   an append's last event id, when the entry could not take that id as its own
    l   (a base) the id of the log's last event before this change's own events (absent: an
        empty log): the events up to it came before the base, so no version after it holds
        them
  An append's entry takes the id of the last event it appended (so an event id names the
  version that holds it). A base is written by init, save and restore; by the first write to
  a run whose history does not reach the version before it (a run written before the
  history, or by an older luft-redis in a rolling upgrade: its history starts there); and
  by an append that trimmed the log (max_events) once the history holds more than twice
  max_events entries: the entries before that base are trimmed.

  The run field history_version is the version of the last entry.
]]
--- @defines-only
--- @include "includes/call"
--- @include "includes/numbers"
--- @include "includes/delta"
--- @include "includes/history_records"

-- Set by a script before commit(): the id of the last event it appended, how many it
-- appended, and whether its entry restarts the history (append_events, when it trimmed the
-- log). Cleared at the start of every call.
local HISTORY_EVENT, HISTORY_RESTART, HISTORY_APPENDED = nil, false, 0
local function begin_history()
  HISTORY_EVENT, HISTORY_RESTART, HISTORY_APPENDED = nil, false, 0
end
--- @each-call begin_history()

-- The seconds of a stream id "<ms>-<seq>", as a decimal string.
local function id_seconds(id)
  local ms = string.match(id, '^(%d+)-')
  return string.sub(ms, 1, -4) ~= '' and string.sub(ms, 1, -4) or '0'
end

-- XADD the entry: at `id` when given and the stream allows it, else at '*' (then with e = id);
-- with t = updated_at when the id's second is not it: known before the XADD for `id`, checked
-- after it for '*' (the entry is then added again with t, e kept: rare, a clock set back or a
-- second turning over during the script).
local function history_xadd(fields, id, updated_at)
  local added
  if id then
    if updated_at and id_seconds(id) ~= updated_at then -- (decided before: no re-add)
      fields[#fields + 1] = 't'
      fields[#fields + 1] = updated_at
      updated_at = nil
    end
    added = redis.pcall('XADD', K_HISTORY, id, unpack(fields))
    if type(added) == 'table' then -- not after the last entry: take '*', name the event
      fields[#fields + 1] = 'e'
      fields[#fields + 1] = id
      added = nil
    end
  end
  added = added or redis.call('XADD', K_HISTORY, '*', unpack(fields))
  if updated_at and id_seconds(added) ~= updated_at then
    redis.call('XDEL', K_HISTORY, added)
    fields[#fields + 1] = 't'
    fields[#fields + 1] = updated_at
    added = redis.call('XADD', K_HISTORY, '*', unpack(fields))
  end
  return added
end

-- True when the history's last entry is of version `before` (the run field history_version):
-- this change may be an entry that changes it; else it must be a base.
local function history_reaches(before)
  return redis.call('HGET', K_RUN, 'history_version') == before
end

-- Add this change's entry: version `v`, op, updated_at (nil for a base: the state has it);
-- `base`: the entry is the whole state (from the delta when it is one, `whole`); `restart`:
-- the entries before it are trimmed.
local function add_history(v, op, updated_at, base, whole, restart)
  local fields = {'v', v, 'op', op}
  if base then
    -- the log's last event before this call's own (a base is rare: one XREVRANGE; a stray
    -- key of another type in place of the log leaves l out, and is reported by its readers)
    local got = redis.pcall('XREVRANGE', K_EVENTS, '+', '-', 'COUNT', HISTORY_APPENDED + 1)
    local last = type(got) == 'table' and not got.err and got[HISTORY_APPENDED + 1]
    if last then
      fields[#fields + 1] = 'l'
      fields[#fields + 1] = last[1]
    end
    local parts, n
    if whole then
      parts, n = DELTA, DN
    else
      parts = HIST
      n = whole_state_parts(parts)
    end
    fields[#fields + 1] = 'z'
    fields[#fields + 1] = records_bytes(parts, n)
    if n > DELTA_KEEP then HIST = {} end
    updated_at = nil
  else
    local parts, n = history_records()
    if n > 0 then fields[5], fields[6] = 'd', records_bytes(parts, n) end
  end
  local id = history_xadd(fields, HISTORY_EVENT, updated_at)
  if restart then -- the entries before this base are trimmed with the log
    redis.call('XTRIM', K_HISTORY, 'MINID', id)
  end
end
