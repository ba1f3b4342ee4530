--[[
  What a history entry's d holds (includes/history.lua): the records of this call's delta
  (DELTA[1..DN], includes/delta.lua) without the R records of run fields that are not
  checkpoint state, and, for an entity the script replaced whole after telling what it held
  (history_before), a P record of what changed:
    P section id n (attr value)*n m attr*m   n attributes set, m removed
  with its finding segment's F record left out when the blob is the one stored.
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

-- Set by history_before: entities ("<section> <id>" -> {attr = value}) and finding segments
-- (id -> blob, or false: none) as stored before this call's write; cleared every call.
local HISTORY_BEFORE, HISTORY_SEGMENTS = nil, nil
local function begin_history_records()
  HISTORY_BEFORE, HISTORY_SEGMENTS = nil, nil
end
--- @each-call begin_history_records()

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

