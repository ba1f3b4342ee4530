--[[
  The tombstone of a deleted run (delete_run, gc_run): a hash <writer id> -> "<op seq> <reply>"
  that outlives the run for a while (its TTL), so that a delete retried after its reply was
  lost gets its first answer instead of "there was nothing to delete". Not one of the run's
  keys: each script that uses it takes it as KEYS[13].
]]
--- @defines-only
--- @include "includes/call"
--- @include "includes/fail"

-- The reply this writer's operation already got (a retry), else nil. A key of another type in
-- the tombstone's place is deleted: it is only a memo, never data.
local function tombstone_reply(key)
  if WRITER == nil or WRITER_SEQ == nil or string.find(WRITER_SEQ, '^%d+$') == nil then
    fail('BAD_ARG', 'writer id and operation sequence are required')
  end
  local kind = redis.call('TYPE', key)
  if type(kind) == 'table' then kind = kind['ok'] end
  if kind == 'hash' then
    local seq, reply = string.match(redis.call('HGET', key, WRITER) or '', '^(%d+) ([01])$')
    if seq == WRITER_SEQ then return tonumber(reply) end
  elseif kind ~= 'none' then
    redis.call('DEL', key)
  end
  return nil
end

-- Remember this operation's reply (0 or 1) for `ttl` seconds.
local function tombstone_keep(key, reply, ttl)
  redis.call('HSET', key, WRITER, WRITER_SEQ .. ' ' .. reply)
  redis.call('EXPIRE', key, ttl)
end
