--[[
  HSET of a long flat field/value list.
]]
--- @defines-only

-- HSET a flat field/value list in chunks (Lua's unpack has a stack limit).
local function hset_flat(key, flat)
  local n = #flat
  local i = 1
  while i <= n do
    local j = math.min(i + 3999, n)
    redis.call('HSET', key, unpack(flat, i, j))
    i = j + 1
  end
end
