/*
 * scripts.c: the bucket scripts. Both run as one atomic step on Redis's
 * command thread, which is what makes a check exact (the seed's second deep
 * dive). Every property of the seed's script is kept:
 *
 *   - Redis's clock (TIME), in milliseconds: one clock for every gateway;
 *   - elapsed time clamped at zero, so a clock step after a failover can
 *     pause refills but never take tokens away;
 *   - the rate as two integers, limit tokens per period ms;
 *   - an expiry equal to the time until the bucket is full again, so that a
 *     missing key means a full bucket;
 *   - integer replies: {allowed, remaining, retry_ms, reset_ms}.
 *
 * Numbers are parsed once: strtod, under Lua's tonumber, was a third of a
 * call's instructions (callgrind on redis-server). A function library keeps
 * the arguments it has seen (a rule's burst, limit and period, the cost,
 * the current second of TIME) in a table of at most 1,024, emptied when
 * full; a script sent with EVALSHA starts with an empty one each call.
 *
 * Leaner than the seed's: the state is one string written with SET ... PX
 * (one command sets value and expiry, where HSET + PEXPIRE took two), and
 * only an allowed request writes: a rejection leaves a state that reads back
 * the same. Tokens are counted in units of 1/period_ms, so a refill is
 * elapsed_ms x limit, a whole number, and no rounding ever drifts; config.c
 * keeps burst x period below 2^53, where doubles stop being exact.
 *
 * A negative cost gives tokens back (charge: refund), never above capacity.
 * A cost larger than the bucket is rejected with retry -1: it can never
 * pass, and looping on it would be pointless.
 *
 * The GCRA variant stores one number, the theoretical arrival time (TAT) in
 * ms, plus its remainder in 1/limit ms when the emission interval is not a
 * whole number of ms ("TAT" or "TAT REM"). It is the same bucket seen as a
 * time: level = capacity - (TAT - now), so it makes the same decisions with
 * a smaller key (an integer-encoded string in the common case).
 *
 * The two states cannot be mistaken for each other (only the token bucket's
 * has a ':'). A value a script cannot read, such as the other algorithm's
 * after a rule switched algorithm, counts as a missing key: a full bucket,
 * the same trade the seed makes for a lost key.
 */
#include "scripts.h"

#include "bucket.h"

/* Shared by both algorithms: the clock, the arguments and the decision. */
#define LUA_COMMON \
    "local nums, n_nums = {}, 0\n" \
    "local function num(s)\n" \
    "  local n = nums[s]\n" \
    "  if n == nil then\n" \
    "    n = tonumber(s)\n" \
    "    if n_nums >= 1024 then nums, n_nums = {}, 0 end\n" \
    "    nums[s], n_nums = n, n_nums + 1\n" \
    "  end\n" \
    "  return n\n" \
    "end\n" \
    "local function now_ms()\n" \
    "  local t = redis.call('TIME')\n" \
    "  return num(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
    "end\n" \
    "local function spend(level, cap, limit, period, cost)\n" \
    "  local need, allowed, retry = cost * period, 0, 0\n" \
    "  if cost < 0 then\n" \
    "    level, allowed = math.min(cap, level - need), 1\n" \
    "  elseif need > cap then\n" \
    "    retry = -1\n" \
    "  elseif level >= need then\n" \
    "    level, allowed = level - need, 1\n" \
    "  else\n" \
    "    retry = math.ceil((need - level) / limit)\n" \
    "  end\n" \
    "  return level, allowed, retry\n" \
    "end\n" \
    "local function store(key, value, ttl)\n" \
    "  if ttl > 0 then\n" \
    "    redis.call('SET', key, value, 'PX', ttl)\n" \
    "  else\n" \
    "    redis.call('DEL', key)\n" \
    "  end\n" \
    "end\n"

/* KEYS[1] the bucket; ARGV burst, limit, period_ms, cost. State
 * "LEVEL:TS": level in 1/period_ms tokens, ts the ms of the last write. */
#define LUA_TOKEN_BUCKET_BODY \
    "  local burst, limit = num(ARGV[1]), num(ARGV[2])\n" \
    "  local period, cost = num(ARGV[3]), num(ARGV[4])\n" \
    "  local cap, now = burst * period, now_ms()\n" \
    "  local level, ts = cap, now\n" \
    "  local v = redis.call('GET', KEYS[1])\n" \
    "  local sep = v and string.find(v, ':', 1, true)\n" \
    "  if sep then\n" \
    "    local l = tonumber(string.sub(v, 1, sep - 1))\n" \
    "    local t = tonumber(string.sub(v, sep + 1))\n" \
    "    if l and t then level, ts = math.min(cap, l), t end\n" \
    "  end\n" \
    "  level = math.min(cap, level + math.max(0, now - ts) * limit)\n" \
    "  local allowed, retry\n" \
    "  level, allowed, retry = spend(level, cap, limit, period, cost)\n" \
    "  local reset = math.ceil((cap - level) / limit)\n" \
    "  if allowed == 1 then\n" \
    "    store(KEYS[1], string.format('%d:%d', level, now), reset)\n" \
    "  end\n" \
    "  return {allowed, math.floor(level / period), retry, reset}\n"

/* Same arguments; state "TAT" or "TAT REM". d is how far the TAT is ahead
 * of now, in 1/limit ms, which is exactly the tokens missing from a full
 * bucket in 1/period_ms units. */
#define LUA_GCRA_BODY \
    "  local burst, limit = num(ARGV[1]), num(ARGV[2])\n" \
    "  local period, cost = num(ARGV[3]), num(ARGV[4])\n" \
    "  local cap, now, d = burst * period, now_ms(), 0\n" \
    "  local v = redis.call('GET', KEYS[1])\n" \
    "  if v then\n" \
    "    local sp = string.find(v, ' ', 1, true)\n" \
    "    local tat, rem = tonumber(v), 0\n" \
    "    if sp then\n" \
    "      tat = tonumber(string.sub(v, 1, sp - 1))\n" \
    "      rem = tonumber(string.sub(v, sp + 1))\n" \
    "    end\n" \
    "    if tat and rem then\n" \
    "      d = math.min(cap, math.max(0, (tat - now) * limit + rem))\n" \
    "    end\n" \
    "  end\n" \
    "  local level, allowed, retry = spend(cap - d, cap, limit, period, cost)\n" \
    "  d = cap - level\n" \
    "  local reset = math.ceil(d / limit)\n" \
    "  if allowed == 1 then\n" \
    "    local tat, rem = now + math.floor(d / limit), d % limit\n" \
    "    local value = string.format('%d', tat)\n" \
    "    if rem ~= 0 then value = string.format('%d %d', tat, rem) end\n" \
    "    store(KEYS[1], value, reset)\n" \
    "  end\n" \
    "  return {allowed, math.floor(level / period), retry, reset}\n"

const char rl_library_source[] =
    "#!lua name=" RL_LIBRARY_NAME "\n"
    LUA_COMMON
    "local function token_bucket(KEYS, ARGV)\n"
    LUA_TOKEN_BUCKET_BODY
    "end\n"
    "local function gcra(KEYS, ARGV)\n"
    LUA_GCRA_BODY
    "end\n"
    "redis.register_function('" RL_FUNCTION_TOKEN_BUCKET "', token_bucket)\n"
    "redis.register_function('" RL_FUNCTION_GCRA "', gcra)\n";

/* Before Redis 5 a script that calls TIME and then writes needs effects
 * replication switched on; from 5 on it is the default and this is a no-op. */
#define LUA_SCRIPT_PREAMBLE \
    "if redis.replicate_commands then redis.replicate_commands() end\n"

static const char token_bucket_script[] =
    LUA_SCRIPT_PREAMBLE LUA_COMMON LUA_TOKEN_BUCKET_BODY;
static const char gcra_script[] = LUA_SCRIPT_PREAMBLE LUA_COMMON LUA_GCRA_BODY;

/* Indexed by rl_algorithm. */
static const char *const functions[] = {RL_FUNCTION_TOKEN_BUCKET,
                                        RL_FUNCTION_GCRA};
static const char *const sources[] = {token_bucket_script, gcra_script};

const rl_script_set rl_bucket_scripts = {
    .library = rl_library_source,
    .functions = functions,
    .sources = sources,
    .n = 2,
};

const char *rl_script_source(rl_algorithm algorithm)
{
    return sources[algorithm];
}
