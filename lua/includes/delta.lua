--[[
  Deltas: the records of what a call changed, built as the script writes.

  Every writing script replies with one delta and publishes the same bytes as its
  change notice (SPUBLISH on ARGV[1]) when it changed something. A delta (format L3) is a
  header of six netstrings "<len>:<bytes>":
    'L3', incarnation before, version before, incarnation after, version after, op
  then, when there are records, one netstring holding the byte length of every record part as
  decimals separated by single spaces, then those parts back to back (no separators). The
  parts are the records, each a tag and its parts:
      R field value                 the run hash field now holds value
      E section id n (attr value)*n the entity `id` of section (ph, res, ses) is now exactly
                                    these attributes (n = 0: it is gone); in an E res record
                                    an empty `findings` value stands for the blob of this
                                    delta's F record of segment `id` (sent once, not twice)
      S agent_id value              started[agent_id] = value ("<seq> <phase_id>")
      F segment blob                finding segment set: in place when listed, else appended
      X segment                     finding segment removed
      Z then the 7 parts of load's reply, each counted: the whole state (replaces all)
  Format L2 (an unreleased layout before L3) put every record part in a netstring of its own;
  no release wrote it, and this version reads it as an unknown format (a reload).
  A script that changes nothing replies with version before = version after and no records,
  and publishes nothing. The cache applies a delta only when its incarnation and version equal
  the delta's "before" (see luft_redis/delta.py).
]]
--- @include "includes/call"
--- @include "includes/numbers"

-- The delta under construction: the parts of its records are DELTA[1..DN], in order (see the
-- header). The table is kept from call to call and only its first DN entries belong to this
-- call: growing a new table part by part (a rehash at every power of two) costs more than
-- writing the records' bytes. begin_delta() sets DN = 0 and drops a table grown past
-- DELTA_KEEP parts (a whole-state record), so a big save does not stay in memory.
local FORMAT = 'L3'
local DELTA, DN = {}, 0
local DELTA_KEEP = 4096
local LENGTHS = {} -- scratch of delta_bytes, kept like DELTA
-- Segment id -> the blob of the F record this call sent for it (see rec_attrs); the table is
-- new in every call that sends one.
local F_SENT, F_SENT_CALL, CALL = {}, 0, 0
local function sent_findings(aid, blob)
  if F_SENT_CALL ~= CALL then F_SENT, F_SENT_CALL = {}, CALL end
  F_SENT[aid] = blob
end

-- Append a record of two or three parts: its tag, then a (and b unless nil).
local function rec(tag, a, b)
  local n = DN
  DELTA[n + 1] = tag
  DELTA[n + 2] = a
  if b == nil then
    DN = n + 2
  else
    DELTA[n + 3] = b
    DN = n + 3
  end
end

-- Append an E record of entity `id` (section tag `tag`) from a flat attr/value list.
local function rec_attrs(tag, id, out)
  local n, count = DN, #out
  DELTA[n + 1] = 'E'
  DELTA[n + 2] = tag
  DELTA[n + 3] = id
  DELTA[n + 4] = decimal(count / 2)
  n = n + 4
  local sent = F_SENT_CALL == CALL and F_SENT[id]
  for i = 1, count, 2 do
    local value = out[i + 1]
    if sent and value == sent and out[i] == 'findings' then value = '' end
    DELTA[n + i] = out[i]
    DELTA[n + i + 1] = value
  end
  DN = n + count
end

-- Record entity `id` of `key` (section tag `tag`) as it is now stored: an E record.
local function rec_entity(tag, key, id, attrs)
  local names = {}
  for i = 1, #attrs do names[i] = id .. ':' .. attrs[i] end
  local values = redis.call('HMGET', key, unpack(names))
  local out = {}
  for i = 1, #attrs do
    if values[i] then
      out[#out + 1] = attrs[i]
      out[#out + 1] = values[i]
    end
  end
  rec_attrs(tag, id, out)
end

-- Records as bytes: the index of the lengths of parts[1..n] (a netstring of decimals separated
-- by single spaces), then the parts back to back (a delta's body; a history entry's d and z).
local function records_bytes(parts, n)
  local lengths = LENGTHS
  for i = 1, n do
    local len = #parts[i]
    lengths[i] = DECIMAL[len] or decimal(len)
  end
  local index = table.concat(lengths, ' ', 1, n)
  return decimal(#index) .. ':' .. index .. table.concat(parts, '', 1, n)
end

-- A delta's bytes: its header, then, with `records`, the parts DELTA[1..DN] behind their
-- index of lengths (format L3, see the header).
local function delta_bytes(inc_before, v_before, inc_after, v_after, op, records)
  local head = '2:' .. FORMAT .. decimal(#inc_before) .. ':' .. inc_before
    .. decimal(#v_before) .. ':' .. v_before .. decimal(#inc_after) .. ':' .. inc_after
    .. decimal(#v_after) .. ':' .. v_after .. decimal(#op) .. ':' .. op
  if not records or DN == 0 then return head end
  return head .. records_bytes(DELTA, DN)
end

-- The whole state as a Z record's parts in out[1..n] (returns n): 'Z', then the 7 parts of
-- load's reply, each counted.
local function whole_state_parts(out)
  local parts = {
    redis.call('HGETALL', K_RUN), redis.call('HGETALL', K_PHASES),
    redis.call('HGETALL', K_RESULTS), redis.call('HGETALL', K_SESSIONS),
    redis.call('HGETALL', K_STARTED), redis.call('HGETALL', K_FINDINGS),
    redis.call('LRANGE', K_FINDINGS_ORDER, 0, -1),
  }
  local n = 1
  out[1] = 'Z'
  for i = 1, #parts do
    local part = parts[i]
    local count = #part
    out[n + 1] = decimal(count)
    for j = 1, count do out[n + 1 + j] = part[j] end
    n = n + 1 + count
  end
  return n
end

-- The whole state, as a Z record (init_run and save_checkpoint): the delta's only record.
local function rec_whole_state()
  DN = whole_state_parts(DELTA)
end

-- Start this call's delta empty (the @each-call statement, after begin_call()).
local function begin_delta()
  CALL = CALL + 1
  if DN > DELTA_KEEP then DELTA, LENGTHS = {}, {} end
  DN = 0
end
--- @each-call begin_delta()
