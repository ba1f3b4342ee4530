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

-- Run fields that are checkpoint state (luft_redis.cache's _RUN_ATTRS, less the version and
-- updated_at that every entry has): the only R records an entry keeps.
local HISTORY_RUN_FIELDS = {
  status = true, current_phase = true, total_tokens = true, created_at = true, task = true,
  workflow_meta = true,
}
local HIST = {} -- scratch: an entry's record parts (kept from call to call, as DELTA)

-- Set by a script before commit(): the id of the last event it appended, and whether its
-- entry restarts the history (append_events, when it trimmed the log). Cleared at the start
-- of every call.
local HISTORY_EVENT, HISTORY_RESTART, HISTORY_APPENDED = nil, false, 0
-- Set by history_before: entities ("<section> <id>" -> {attr = value}) and finding segments
-- (id -> blob, or false: none) as stored before this call's write.
local HISTORY_BEFORE, HISTORY_SEGMENTS = nil, nil
local function begin_history()
  HISTORY_EVENT, HISTORY_RESTART, HISTORY_APPENDED = nil, false, 0
  HISTORY_BEFORE, HISTORY_SEGMENTS = nil, nil
end

-- Tell the history what entity `id` of `section` held before this call replaces it whole
-- (`names`, `values`: an HMGET of its attributes) and its finding segment (`segment`, nil:
-- none): its entry then holds what changed (a P record).
local function history_before(section, id, names, values, segment)
  local attrs = {}
  for i = 1, #names do
    if values[i] then attrs[names[i]] = values[i] end
  end
  HISTORY_BEFORE = HISTORY_BEFORE or {}
  HISTORY_BEFORE[section .. ' ' .. id] = attrs
  HISTORY_SEGMENTS = HISTORY_SEGMENTS or {}
  HISTORY_SEGMENTS[id] = segment or false
end
--- @each-call begin_history()

-- The P record of E record DELTA[i..] (entity `before` held before): appended to parts.
local function history_patch(parts, n, i, before, blobs)
  local section, id, count = DELTA[i + 1], DELTA[i + 2], tonumber(DELTA[i + 3])
  local set, seen = {}, {}
  for j = i + 4, i + 3 + 2 * count, 2 do
    local attr, value = DELTA[j], DELTA[j + 1]
    if section == 'res' and attr == 'findings' and value == '' then value = blobs[id] end
    seen[attr] = true
    if before[attr] ~= value then
      set[#set + 1] = attr
      set[#set + 1] = value
    end
  end
  local gone = {}
  for attr in pairs(before) do
    if not seen[attr] then gone[#gone + 1] = attr end
  end
  if #set == 0 and #gone == 0 then return n end -- as it was: nothing to record
  table.sort(gone)
  parts[n + 1], parts[n + 2], parts[n + 3], parts[n + 4] = 'P', section, id, decimal(#set / 2)
  n = n + 4
  for j = 1, #set do parts[n + j] = set[j] end
  n = n + #set + 1
  parts[n] = decimal(#gone)
  for j = 1, #gone do parts[n + j] = gone[j] end
  return n + #gone
end

-- DELTA[1..DN] without the R records of fields that are not checkpoint state, and with the
-- entities history_before named as P records: (parts, n).
local function history_records()
  local parts, n = HIST, 0
  local blobs = {} -- this delta's F blobs, by segment
  local i = 1
  while i <= DN do
    local tag = DELTA[i]
    local size
    if tag == 'R' then
      size = 3
      if HISTORY_RUN_FIELDS[DELTA[i + 1]] then
        parts[n + 1], parts[n + 2], parts[n + 3] = 'R', DELTA[i + 1], DELTA[i + 2]
        n = n + 3
      end
    elseif tag == 'E' and HISTORY_BEFORE and HISTORY_BEFORE[DELTA[i + 1] .. ' ' .. DELTA[i + 2]] then
      size = 4 + 2 * tonumber(DELTA[i + 3])
      n = history_patch(parts, n, i, HISTORY_BEFORE[DELTA[i + 1] .. ' ' .. DELTA[i + 2]], blobs)
    elseif tag == 'F' and HISTORY_SEGMENTS and HISTORY_SEGMENTS[DELTA[i + 1]] == DELTA[i + 2] then
      size = 3 -- the blob stored already: left out
      blobs[DELTA[i + 1]] = DELTA[i + 2]
    else
      if tag == 'F' then blobs[DELTA[i + 1]] = DELTA[i + 2] end
      if tag == 'E' then size = 4 + 2 * tonumber(DELTA[i + 3])
      elseif tag == 'X' then size = 2
      else size = 3 end -- S, F
      for j = 0, size - 1 do parts[n + 1 + j] = DELTA[i + j] end
      n = n + size
    end
    i = i + size
  end
  if n > DELTA_KEEP then HIST = {} end
  return parts, n
end

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
