--[[
  index_status: keep a run's entry in the run index together with the per-status run counts
  next to it (luft_redis/index.py, docs/redis-layout.md "The run index"). Unlike the other
  functions, its keys are the prefix's, not a run's (all in the prefix's slot, {<prefix>}), it
  has no change channel, writer id or operation number (an index write is idempotent: it
  sets a status, and an older read changes nothing) and it publishes nothing.

  KEYS[1] the run index          zset  run id -> updated_at
  KEYS[2] the indexed statuses   hash  run id -> "<updated_at> <version> <incarnation> <status>"
  KEYS[3] the status counts      hash  status -> runs indexed with it
  ARGV[1] "add" or "remove"   ARGV[2] the run id
  add:    ARGV[3] status   ARGV[4] updated_at   ARGV[5] version   ARGV[6] incarnation, as read
          from the run hash. An entry read earlier than the stored one (same incarnation, a
          lower version; another incarnation, an older updated_at) changes nothing, so two
          processes that index one run at once end with the newer status.
  remove: the run's entry leaves the index, its status and its count.

  Reply:  add: 1 when the entry changed, else 0; remove: 1 when the run was in the index
  Errors: LUFT_CORRUPT (a stored entry or count is malformed: nothing changed), LUFT_BAD_ARG
]]
local op, rid = ARGV[1], ARGV[2]
local function refuse(code, message)
  return redis.error_reply('LUFT_' .. code .. ' ' .. message)
end
if (op ~= 'add' and op ~= 'remove') or rid == nil or rid == '' then
  return refuse('BAD_ARG', 'run index: expected "add" or "remove" and a run id')
end
local old = redis.call('HGET', KEYS[2], rid)
local old_at, old_v, old_inc, old_status
if old then
  old_at, old_v, old_inc, old_status = string.match(old, '^(%d+) (%d+) (%S+) (%l+)$')
  if not old_at then
    return refuse('CORRUPT', KEYS[2] .. ' ' .. rid .. ' is not "<updated_at> <version> <inc> <status>"')
  end
  local n = redis.call('HGET', KEYS[3], old_status)
  if not n or not string.find(n, '^%d+$') or n == '0' then
    return refuse('CORRUPT', KEYS[3] .. ' ' .. old_status .. ' is ' .. tostring(n) ..
      ', not a count >= 1 (a run is indexed with that status)')
  end
end
if op == 'remove' then
  local removed = redis.call('ZREM', KEYS[1], rid)
  if old then
    redis.call('HDEL', KEYS[2], rid)
    redis.call('HINCRBY', KEYS[3], old_status, -1)
  end
  return removed
end
local status, at, v, inc = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if not (status and string.find(status, '^%l+$') and at and string.find(at, '^%d+$')
    and v and string.find(v, '^%d+$') and inc and string.find(inc, '^%S+$')) then
  return refuse('BAD_ARG', 'run index: malformed status, updated_at, version or incarnation')
end
if old then
  local newer
  if inc == old_inc then newer = tonumber(v) > tonumber(old_v)
  else newer = tonumber(at) >= tonumber(old_at) end
  if not newer then return 0 end
end
redis.call('ZADD', KEYS[1], at, rid)
redis.call('HSET', KEYS[2], rid, at .. ' ' .. v .. ' ' .. inc .. ' ' .. status)
if old_status ~= status then
  if old then redis.call('HINCRBY', KEYS[3], old_status, -1) end
  redis.call('HINCRBY', KEYS[3], status, 1)
end
return 1
