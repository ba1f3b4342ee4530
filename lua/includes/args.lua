--[[
  A script's own arguments (ARGS): an optional argument is "n" for null or "s" followed by
  the value; a count or a time is an unsigned decimal.
]]
--- @defines-only
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/numbers"

-- Decode an optional argument: "n" -> nil, "s<value>" -> value.
local function opt(arg, name)
  if arg == 'n' then return nil end
  if arg == nil or string.sub(arg, 1, 1) ~= 's' then
    fail('BAD_ARG', 'optional argument ' .. name .. ' is malformed')
  end
  return string.sub(arg, 2)
end

local function arg_uint(value, name)
  if not is_uint(value) then fail('BAD_ARG', name .. ' is not an unsigned integer') end
  return value
end

-- For each name, the optional argument ARGS[first + i - 1]: when present, append
-- `prefix .. name` and its value to `fields`; when null, append `prefix .. name` to `drop`
-- (the field to delete, so an upsert replaces the whole entity).
local function optional_fields(fields, drop, prefix, names, first)
  for i, name in ipairs(names) do
    local value = opt(ARGS[first + i - 1], name)
    if value then
      fields[#fields + 1] = prefix .. name
      fields[#fields + 1] = value
    else
      drop[#drop + 1] = prefix .. name
    end
  end
end
