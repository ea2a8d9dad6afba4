/*
 * scripts.c: the bucket script. It runs as one atomic step on Redis's
 * command thread, which is what makes a check exact (the seed's second deep
 * dive).
 *
 * The bucket lives in its key's expiry. The seed already sets the expiry to
 * the time until the bucket is full again, so that a missing key means a
 * full bucket; that time is the whole state. With tokens counted in units
 * of 1/period_ms, a bucket d units short of full refills in d / limit ms:
 * PTTL reads d back, and an allowed request moves the expiry by
 * cost x period / limit ms. This is GCRA's theoretical arrival time, kept
 * by Redis instead of in the value, so token_bucket and gcra are one
 * function. When period_ms is not a multiple of limit the expiry is rounded
 * up to a whole ms and the value holds the units of that rounding (below
 * limit), so no fraction of a token is ever lost or invented.
 *
 * What that buys, against the seed's TIME + HMGET + HSET + PEXPIRE:
 * a check is PTTL and, when allowed, PEXPIRE (SET ... PX for a new key or
 * a fractional interval; GET as well in the latter case). No clock call, no
 * state to parse or format. callgrind on redis-server 7.0 (`make profile`):
 * about 28,500 instructions per call against the seed's 69,000.
 *
 * Kept from the seed: Redis's clock (expiries are Redis's), the rate as two
 * integers, a missing key as a full bucket, whole-number arithmetic (config.c
 * keeps burst x period below 2^53, where doubles stop being exact), and a
 * rejection writes nothing. Changed: the seed clamps elapsed time at zero,
 * so a backward clock step (a failover to a replica whose clock is behind)
 * only pauses refills; here an expiry that moves with the clock also takes
 * back up to that step's worth of refilled tokens. Both err on the side of
 * admitting less. On Redis before 7.2 PTTL and PEXPIRE each read the clock,
 * so a call that straddles a millisecond boundary leaves the bucket 1 ms
 * later than exact, again admitting less; from 7.2 a script sees one time.
 *
 * Arguments are the seed's: KEYS[1] the bucket; ARGV burst, limit,
 * period_ms, cost. A negative cost gives tokens back, never above
 * capacity. The reply is one integer: d after the call when allowed,
 * -(d + 1) when rejected; the agent works out remaining, retry and reset
 * from it (bucket.c), which is cheaper than building a table in Redis.
 *
 * Numbers are parsed once: strtod, under Lua's tonumber, was a third of a
 * call's instructions. The function library keeps the arguments it has seen
 * in a table of at most 1,024, emptied when full; a script sent with
 * EVALSHA starts with an empty one each call.
 *
 * The library is rl_3 since it holds the lease function: an rl 2 agent
 * reconnecting would FUNCTION LOAD REPLACE its rl_2 library, and a newer
 * library under the same name would lose the lease to it. rl_3_bucket is
 * rl_2_bucket, so agents of both versions share buckets.
 *
 * rl 1 stored "LEVEL:TS" or "TAT [REM]" with the same expiry: this script
 * reads those keys by their expiry alone (a value it cannot read as a
 * remainder counts as none, at most 1 ms of refill short).
 */
#include "scripts.h"

#include "bucket.h"

#define LUA_NUMBER_CACHE \
    "local nums, n_nums = {}, 0\n" \
    "local function num(s)\n" \
    "  local n = nums[s]\n" \
    "  if n == nil then\n" \
    "    n = tonumber(s)\n" \
    "    if n_nums >= 1024 then nums, n_nums = {}, 0 end\n" \
    "    nums[s], n_nums = n, n_nums + 1\n" \
    "  end\n" \
    "  return n\n" \
    "end\n"

/* d: units short of full. whole: the interval is a whole number of ms, so
 * the expiry alone is exact and the value is never read. LUA_READ reads
 * the bucket, LUA_WRITE writes d back; the bucket and the lease share
 * both, so a leased rule's key is an exact rule's key, to the unit. */
#define LUA_READ \
    "  local call, key = redis.call, KEYS[1]\n" \
    "  local burst, limit = num(ARGV[1]), num(ARGV[2])\n" \
    "  local period, cost = num(ARGV[3]), num(ARGV[4])\n" \
    "  local cap, need = burst * period, cost * period\n" \
    "  local whole = period % limit == 0\n" \
    "  local d, ttl = 0, call('PTTL', key)\n" \
    "  if ttl > 0 then\n" \
    "    d = ttl * limit\n" \
    "    if not whole then\n" \
    "      local rem = tonumber(call('GET', key))\n" \
    "      if rem and rem > 0 and rem < limit then d = d - rem end\n" \
    "    end\n" \
    "    d = math.min(cap, d)\n" \
    "  end\n"

#define LUA_WRITE \
    "  local full_in = math.ceil(d / limit)\n" \
    "  if d == 0 then\n" \
    "    call('DEL', key)\n" \
    "  elseif not whole then\n" \
    "    call('SET', key, full_in * limit - d, 'PX', full_in)\n" \
    "  elseif ttl > 0 then\n" \
    "    call('PEXPIRE', key, full_in)\n" \
    "  else\n" \
    "    call('SET', key, '0', 'PX', full_in)\n" \
    "  end\n"

#define LUA_BUCKET_BODY \
    LUA_READ \
    "  if need < 0 then\n" \
    "    d = math.max(0, d + need)\n" \
    "  elseif d + need <= cap then\n" \
    "    d = d + need\n" \
    "  else\n" \
    "    return -d - 1\n" \
    "  end\n" \
    LUA_WRITE \
    "  return d\n"

/* The lease: the same arguments, cost being the most tokens wanted. It
 * takes as many whole tokens as the bucket holds, up to that, and answers
 * {taken, d}: taken may be 0 (nothing is written then). Tokens go back
 * through the bucket with a negative cost, never above capacity. */
#define LUA_LEASE_BODY \
    LUA_READ \
    "  local n = math.min(cost, math.floor((cap - d) / period))\n" \
    "  if n <= 0 then return {0, d} end\n" \
    "  d = d + n * period\n" \
    LUA_WRITE \
    "  return {n, d}\n"

const char rl_library_source[] =
    "#!lua name=" RL_LIBRARY_NAME "\n"
    LUA_NUMBER_CACHE
    "local function bucket(KEYS, ARGV)\n"
    LUA_BUCKET_BODY
    "end\n"
    "local function lease(KEYS, ARGV)\n"
    LUA_LEASE_BODY
    "end\n"
    "redis.register_function('" RL_FUNCTION_BUCKET "', bucket)\n"
    "redis.register_function('" RL_FUNCTION_LEASE "', lease)\n";

/* Before Redis 5 a script that writes after a non-deterministic read needs
 * effects replication switched on; from 5 on it is the default and this is
 * a no-op. */
#define LUA_SCRIPT_PREAMBLE \
    "if redis.replicate_commands then redis.replicate_commands() end\n"

static const char bucket_script[] =
    LUA_SCRIPT_PREAMBLE LUA_NUMBER_CACHE LUA_BUCKET_BODY;

static const char lease_script[] =
    LUA_SCRIPT_PREAMBLE LUA_NUMBER_CACHE LUA_LEASE_BODY;

static const char *const functions[] = {RL_FUNCTION_BUCKET,
                                        RL_FUNCTION_LEASE};
static const char *const sources[] = {bucket_script, lease_script};

const rl_script_set rl_bucket_scripts = {
    .library = rl_library_source,
    .functions = functions,
    .sources = sources,
    .n = 2,
};
