#!lua name=rl_3
local nums, n_nums = {}, 0
local function num(s)
  local n = nums[s]
  if n == nil then
    n = tonumber(s)
    if n_nums >= 1024 then nums, n_nums = {}, 0 end
    nums[s], n_nums = n, n_nums + 1
  end
  return n
end
local function bucket(KEYS, ARGV)
  local call, key = redis.call, KEYS[1]
  local burst, limit = num(ARGV[1]), num(ARGV[2])
  local period, cost = num(ARGV[3]), num(ARGV[4])
  local cap, need = burst * period, cost * period
  local whole = period % limit == 0
  local d, ttl = 0, call('PTTL', key)
  if ttl > 0 then
    d = ttl * limit
    if not whole then
      local rem = tonumber(call('GET', key))
      if rem and rem > 0 and rem < limit then d = d - rem end
    end
    d = math.min(cap, d)
  end
  if need < 0 then
    d = math.max(0, d + need)
  elseif d + need <= cap then
    d = d + need
  else
    return -d - 1
  end
  local full_in = math.ceil(d / limit)
  if d == 0 then
    call('DEL', key)
  elseif not whole then
    call('SET', key, full_in * limit - d, 'PX', full_in)
  elseif ttl > 0 then
    call('PEXPIRE', key, full_in)
  else
    call('SET', key, '0', 'PX', full_in)
  end
  return d
end
local function lease(KEYS, ARGV)
  local call, key = redis.call, KEYS[1]
  local burst, limit = num(ARGV[1]), num(ARGV[2])
  local period, cost = num(ARGV[3]), num(ARGV[4])
  local cap, need = burst * period, cost * period
  local whole = period % limit == 0
  local d, ttl = 0, call('PTTL', key)
  if ttl > 0 then
    d = ttl * limit
    if not whole then
      local rem = tonumber(call('GET', key))
      if rem and rem > 0 and rem < limit then d = d - rem end
    end
    d = math.min(cap, d)
  end
  local n = math.min(cost, math.floor((cap - d) / period))
  if n <= 0 then return {0, d} end
  d = d + n * period
  local full_in = math.ceil(d / limit)
  if d == 0 then
    call('DEL', key)
  elseif not whole then
    call('SET', key, full_in * limit - d, 'PX', full_in)
  elseif ttl > 0 then
    call('PEXPIRE', key, full_in)
  else
    call('SET', key, '0', 'PX', full_in)
  end
  return {n, d}
end
redis.register_function('rl_3_bucket', bucket)
redis.register_function('rl_3_lease', lease)
