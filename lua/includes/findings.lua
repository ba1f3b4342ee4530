--[[
  The run's finding list: segments (KEYS[7], one msgpack list per agent) in order (KEYS[8]).
]]
--- @defines-only
--- @include "includes/call"
--- @include "includes/delta"

local EMPTY_LIST = '\144' -- msgpack of []

-- Replace agent `aid`'s findings in the run's finding list (contract §5, findings): in place
-- when the agent already has some there, at the end when it has none. Reporting no findings
-- removes the agent's segment (decided: the stored list is then exactly what get_checkpoint()
-- shows, so saving that changes nothing). Segments "<aid>#2", "<aid>#3", ... left by
-- save_checkpoint for the same agent are dropped too (an agent with such segments always has
-- its own segment, so a new segment has none).
-- With `push` (a list), a new segment's id is appended to it for the caller to RPUSH later.
local function set_agent_findings(aid, blob, push)
  if blob == EMPTY_LIST then
    if redis.call('HDEL', K_FINDINGS, aid) == 0 then return end
    redis.call('LREM', K_FINDINGS_ORDER, 1, aid)
    rec('X', aid)
  elseif redis.call('HSETNX', K_FINDINGS, aid, blob) == 1 then
    if push then push[#push + 1] = aid else redis.call('RPUSH', K_FINDINGS_ORDER, aid) end
    rec('F', aid, blob)
    sent_findings(aid, blob)
    return
  else
    redis.call('HSET', K_FINDINGS, aid, blob)
    rec('F', aid, blob)
    sent_findings(aid, blob)
  end
  local k = 2
  while redis.call('HDEL', K_FINDINGS, aid .. '#' .. k) == 1 do
    redis.call('LREM', K_FINDINGS_ORDER, 1, aid .. '#' .. k)
    rec('X', aid .. '#' .. k)
    k = k + 1
  end
end
