--[[
  The type check of a run's keys: a key of the wrong type (a stray key) is LUFT_CORRUPT
  naming it, found before the first write, never an untyped WRONGTYPE error half way.
]]
--- @defines-only
--- @include "includes/fail"

-- Fail with LUFT_CORRUPT unless `key` is missing or holds a `kind` ('hash', 'list', ...):
-- called in the check phase for keys a script writes without reading them first, so a key of
-- the wrong type never stops a script half way.
local function check_type(key, kind)
  local found = redis.call('TYPE', key)
  if type(found) == 'table' then found = found['ok'] end
  if found ~= 'none' and found ~= kind then
    fail('CORRUPT', key .. ' type is ' .. tostring(found) .. ', not a ' .. kind)
  end
end

-- A read of KEYS[i] (a `kind` key) that is also its type check: `redis.call(cmd, KEYS[i], ...)`,
-- where a WRONGTYPE error (a stray key of another type) is LUFT_CORRUPT naming the key, any
-- other error (an ACL NOPERM) raised as it is. A script reads a key this way before its first
-- write, so the key needs no probe of its own (see dedup).
local function read_key(i, kind, cmd, ...)
  local found = redis.pcall(cmd, KEYS[i], ...)
  if type(found) == 'table' and found.err then
    if string.find(tostring(found.err), '^WRONGTYPE') then check_type(KEYS[i], kind) end
    error(found)
  end
  return found
end

-- The type every key of a run must have (KEYS[1..12]).
local RUN_KEY_TYPES = {'hash', 'stream', 'hash', 'hash', 'hash', 'hash', 'hash', 'list', 'hash',
  'hash', 'zset', 'stream'}

-- Probe KEYS[i] with a command that reads only a `kind` key and answers an integer: cheaper
-- than TYPE, whose status reply becomes a table. Its WRONGTYPE error is the sign of a stray
-- key, which check_type then names; any other error (an ACL NOPERM) is raised as it is.
local function probe_type(i, kind)
  local found
  if kind == 'hash' then
    found = redis.pcall('HLEN', KEYS[i])
  elseif kind == 'stream' then
    found = redis.pcall('XLEN', KEYS[i])
  elseif kind == 'zset' then
    found = redis.pcall('ZCARD', KEYS[i])
  else
    found = redis.pcall('LLEN', KEYS[i])
  end
  if type(found) == 'table' then
    if string.find(tostring(found.err), '^WRONGTYPE') then check_type(KEYS[i], kind) end
    error(found)
  end
end

-- Fail with LUFT_CORRUPT naming the first key of the run that holds the wrong type: every
-- script calls it (dedup does) before it reads or writes anything else, so a stray key never
-- surfaces as an untyped WRONGTYPE error or stops a script half way.
local function check_run_types()
  for i = 1, #RUN_KEY_TYPES do probe_type(i, RUN_KEY_TYPES[i]) end
end
