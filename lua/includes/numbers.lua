--[[
  Numbers: they travel as decimal strings. Checks of unsigned 64-bit decimals, exact u64
  sums done on strings (u64_add), and the decimal text of small whole numbers.
]]
--- @defines-only
--- @include "includes/fail"

local U64_MAX = '18446744073709551615'

-- Decimal text of a non-negative integer below 2^53. Lua 5.1 turns a number into text with
-- sprintf("%.14g"), a float formatter that costs more than the rest of a small record: the
-- lengths and counts of a delta (small numbers) come from a table filled as they are met.
local DECIMAL = {}
local function decimal(n)
  local s = DECIMAL[n]
  if s == nil then
    s = string.format('%d', n)
    if n < 65536 then DECIMAL[n] = s end
  end
  return s
end

local function is_uint(s)
  return type(s) == 'string' and (s == '0' or string.find(s, '^[1-9]%d*$') ~= nil)
    and (#s < 20 or (#s == 20 and s <= U64_MAX))
end

-- A stored u64 field, checked; a missing field is corrupt too.
local function stored_uint(key, field, value)
  if not is_uint(value) then
    fail('CORRUPT', key .. ' ' .. field .. ' is not an unsigned integer')
  end
  return value
end

-- a >= b for two u64 decimal strings (checked ones: no leading zeros), exactly.
local function uint_ge(a, b)
  if #a ~= #b then return #a > #b end
  return a >= b
end

-- Exact addition of two u64 decimal strings; fails with LUFT_OVERFLOW past 2^64-1.
local function u64_add(a, b, what)
  if #a < 15 and #b < 15 then
    return string.format('%d', tonumber(a) + tonumber(b))
  end
  local digits, carry = {}, 0
  local i, j = #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local d = carry
    if i > 0 then d = d + string.byte(a, i) - 48 end
    if j > 0 then d = d + string.byte(b, j) - 48 end
    digits[#digits + 1] = d % 10
    carry = math.floor(d / 10)
    i, j = i - 1, j - 1
  end
  local sum = string.reverse(table.concat(digits))
  if #sum > 20 or (#sum == 20 and sum > U64_MAX) then
    fail('OVERFLOW', what .. ' would exceed 2^64-1')
  end
  return sum
end

-- Decimal text of a whole number below 2^53 (string.format's %d takes a C long: 64 bits on
-- the servers' builds, as u64_add relies on too; cheaper than %.0f, a float conversion).
local function whole(n)
  return string.format('%d', n)
end
