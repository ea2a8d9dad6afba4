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
 * a check is PTTL, GET and, when allowed, PEXPIRE (SET ... PX for a new
 * key, a fractional interval or a value at another rate). No clock call.
 * callgrind on redis-server 7.0 (`make profile`): about 28,500
 * instructions per call against the seed's 69,000 before the GET below.
 *
 * A reload that changes the rate keeps the tokens spent (issue 28). The
 * expiry alone means ttl x limit units short of full, so a slower rate
 * would read a spent client's key as 1.67 tokens short and hand it a new
 * bucket, a faster one the reverse. The value therefore names the rate
 * that wrote it ("REM LIMIT/PERIOD"), and a read at another rate converts:
 * tokens spent = d_old / period_old, d_new = min(cap_new, spent x
 * period_new), rounded up (admitting less). Chosen over a key per rate
 * (which loses the count outright) and over the agent remembering old
 * rates (another agent, or a restarted one, may have written the key).
 * The price is a GET in every call on an existing key, where a whole
 * interval read the expiry alone: docs/performance.md has the figures.
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
 * A fifth argument (any) makes the call a hold's difference (issue 31):
 * the cost is taken whatever the bucket holds, and a bucket it takes past
 * empty is in debt, d above capacity, which the next requests wait out as
 * they wait for tokens (a rejection then answers a d above capacity).
 *
 * Debt and the clamp. A read clamps d to the capacity, so that a lowered
 * burst (a reload) leaves a spent client at most one new bucket short
 * (test_rate_change.c). That clamp would forget a debt at the next read.
 * A bucket in debt is therefore written with a mark, "REM LIMIT/PERIOD!",
 * and a read of a marked value at the same period keeps d as it is: the
 * debt is the request's own excess, which a lowered burst does not make
 * smaller, and keeping it admits less. A read at another period converts
 * and clamps as before (the debt is then forgotten beyond the new
 * capacity: a rate change is rare, a debt is short). Older agents do not
 * match the mark and read the value by its expiry, clamped: they forget
 * the debt, admitting at most its excess more.
 *
 * Numbers are parsed once: strtod, under Lua's tonumber, was a third of a
 * call's instructions. The function library keeps the arguments it has seen
 * in a table of at most 1,024, emptied when full; a script sent with
 * EVALSHA starts with an empty one each call.
 *
 * The library is rl_3 since it holds the lease function: an rl 2 agent
 * reconnecting would FUNCTION LOAD REPLACE its rl_2 library, and a newer
 * library under the same name would lose the lease to it. For the same
 * reason it was rl_4 when it took the multi-bucket function (issue 18): an
 * rl 3 agent that reconnects replaces rl_3 with its own, which has no
 * rl_3_multi. It is rl_5 since the bodies read and write the rate tag: an
 * rl 4 agent would replace an rl_4 holding them with its own, and the two
 * would take turns. It is rl_6 since the bucket takes a hold's
 * difference into debt and marks it, the library holds the fixed
 * window's difference (rl_6_window_add), and the multi function takes
 * in_flight slots (with rl_6_slots to set an agent's own): an rl 5 agent
 * would replace it with its own, which neither reads the mark nor has
 * the functions, and every hold of this agent would fail its commit.
 * Older agents still share every bucket through their
 * own libraries: they read the expiry (and, at a fractional interval, a
 * value that is a plain number); a tagged value is not one, so they count
 * no remainder, at most 1 ms of refill short. Their untagged writes read
 * here as they read there. The EVALSHA scripts are addressed by digest
 * and never replace one another.
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
 * the expiry alone is exact. The value is "REM LIMIT/PERIOD": the
 * rounding's units and the rate that wrote it (rl 5), so that a read at
 * another rate (a reload) carries the tokens spent over, d / period of the
 * old rate, rather than the expiry, which a slower rate would read as
 * fewer tokens short. A value without the tag (rl 4 and before, rl 1's
 * states) is read as they read it. own: the value is this rate's with no
 * remainder, so a whole interval's write only moves the expiry. LUA_READ
 * reads the bucket, LUA_WRITE writes d back; the bucket and the lease
 * share both, so a leased rule's key is an exact rule's key, to the
 * unit. */
#define LUA_READ_OF(KEY, BURST, LIMIT, PERIOD, COST, MIN, LIMIT_S, PERIOD_S) \
    "  local call, key = redis.call, " KEY "\n" \
    "  local burst, limit = " BURST ", " LIMIT "\n" \
    "  local period, cost = " PERIOD ", " COST "\n" \
    "  local cap, need = burst * period, cost * period\n" \
    "  local whole = period % limit == 0\n" \
    "  local tag = " LIMIT_S " .. '/' .. " PERIOD_S "\n" \
    "  local d, own, ttl = 0, false, call('PTTL', key)\n" \
    "  local indebted = false\n" \
    "  if ttl > 0 then\n" \
    "    d = ttl * limit\n" \
    "    local v = call('GET', key)\n" \
    "    own = v == '0 ' .. tag\n" \
    "    if not own then\n" \
    "      local rem, l, p, debt =\n" \
    "        string.match(v, '^(%d+) (%d+)/(%d+)(!?)$')\n" \
    "      if rem == nil then\n" \
    "        rem = not whole and tonumber(v)\n" \
    "        if rem and rem > 0 and rem < limit then d = d - rem end\n" \
    "      else\n" \
    "        l, p = num(l), num(p)\n" \
    "        d = ttl * l - tonumber(rem)\n" \
    "        if p ~= period then d = math.ceil(d * period / p)\n" \
    "        elseif debt == '!' then indebted = true end\n" \
    "      end\n" \
    "    end\n" \
    "    if not indebted then d = " MIN "(cap, d) end\n" \
    "  end\n"

/* The bucket's own call: one key, four arguments. */
#define LUA_READ \
    LUA_READ_OF("KEYS[1]", "num(ARGV[1])", "num(ARGV[2])", "num(ARGV[3])", \
                "num(ARGV[4])", "math.min", "ARGV[2]", "ARGV[3]")

/* MS and REM are the expiry in ms and the rounding's units as redis.call
 * is given them. */
#define LUA_WRITE_OF(CEIL, MS, REM) \
    "  local full_in = " CEIL "(d / limit)\n" \
    "  if d == 0 then\n" \
    "    call('DEL', key)\n" \
    "  elseif d > cap then\n" \
    "    call('SET', key, " REM " .. ' ' .. tag .. '!', 'PX', " MS ")\n" \
    "  elseif whole and own then\n" \
    "    call('PEXPIRE', key, " MS ")\n" \
    "  else\n" \
    "    call('SET', key, " REM " .. ' ' .. tag, 'PX', " MS ")\n" \
    "  end\n"

#define LUA_WRITE \
    LUA_WRITE_OF("math.ceil", "full_in", "(full_in * limit - d)")

#define LUA_BUCKET_BODY \
    LUA_READ \
    "  if ARGV[5] then\n" \
    "    d = math.max(0, d + need)\n" \
    "  elseif need < 0 then\n" \
    "    d = math.max(0, d + need)\n" \
    "  elseif d + need <= cap then\n" \
    "    d = d + need\n" \
    "  else\n" \
    "    return -d - 1\n" \
    "  end\n" \
    LUA_WRITE \
    "  return d\n"

/* A fixed window's hold difference (issue 31): KEYS[1] the window's key
 * (the window the hold charged, even if a later one has begun), ARGV[1]
 * the difference, ARGV[2] the period in ms. The count never goes below 0
 * (a window that expired meanwhile has nothing to give back), and a key
 * the difference makes anew expires a period on, as a hit's does. The
 * reply is the count after it. */
#define LUA_WINDOW_ADD_BODY \
    "  local call, key = redis.call, KEYS[1]\n" \
    "  local n = call('INCRBY', key, ARGV[1])\n" \
    "  if n < 0 then n = call('INCRBY', key, -n) end\n" \
    "  if call('PTTL', key) == -1 then call('PEXPIRE', key, ARGV[2]) end\n" \
    "  return n\n"

/* The lease: the same arguments, cost being the most tokens wanted. It
 * takes as many whole tokens as the bucket holds, up to that, and answers
 * {taken, d}: taken may be 0 (nothing is written then; a bucket in debt
 * answers d as capacity, empty: dry). Tokens go back
 * through the bucket with a negative cost, never above capacity. */
#define LUA_LEASE_BODY \
    LUA_READ \
    "  local n = math.min(cost, math.floor((cap - d) / period))\n" \
    "  if n <= 0 then return {0, math.min(cap, d)} end\n" \
    "  d = d + n * period\n" \
    LUA_WRITE \
    "  return {n, d}\n"

/* in_flight slots (issue 31): a key's slots are one hash, a field per
 * agent (its id) holding "COUNT EXPIRY", the slots the agent holds and
 * until when by Redis's clock (ms). A field past its expiry is an agent
 * that stopped renewing (it died): it is dropped as it is read, so its
 * slots are free a lease after its last renewal at most. The hash itself
 * expires a quarter of its writer's lease past the latest field expiry
 * written, so past every field's. Agents may have leases of their own
 * (in_flight_lease_ms), so a write only ever lengthens the hash's
 * expiry: one with a short lease setting it would drop a longer-leased
 * agent's live fields with the hash. SLOTS_HELD sums the live fields;
 * SLOT_SET writes ours (none at a count of 0). */
#define LUA_SLOTS \
    "local function now_ms()\n" \
    "  local t = redis.call('TIME')\n" \
    "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
    "end\n" \
    "local function slots_held(key, now)\n" \
    "  local f, sum = redis.call('HGETALL', key), 0\n" \
    "  for k = 1, #f, 2 do\n" \
    "    local c, e = string.match(f[k + 1], '^(%d+) (%d+)$')\n" \
    "    if c == nil or tonumber(e) <= now then\n" \
    "      redis.call('HDEL', key, f[k])\n" \
    "    else\n" \
    "      sum = sum + tonumber(c)\n" \
    "    end\n" \
    "  end\n" \
    "  return sum\n" \
    "end\n" \
    "local function slot_set(key, id, count, now, lease)\n" \
    "  if count <= 0 then\n" \
    "    redis.call('HDEL', key, id)\n" \
    "    return\n" \
    "  end\n" \
    "  redis.call('HSET', key, id, string.format('%d %d', count, now + lease))\n" \
    "  local ttl = lease + math.floor(lease / 4)\n" \
    "  if redis.call('PTTL', key) < ttl then\n" \
    "    redis.call('PEXPIRE', key, string.format('%d', ttl))\n" \
    "  end\n" \
    "end\n" \
    "local function slot_take(key, id, now, lease)\n" \
    "  local v = redis.call('HGET', key, id)\n" \
    "  local c = v and tonumber(string.match(v, '^(%d+) ')) or 0\n" \
    "  slot_set(key, id, c + 1, now, lease)\n" \
    "end\n"

/* An agent's own slots, written: KEYS its keys (one slot of a cluster),
 * ARGV[1] its id, ARGV[2] the lease (ms), then one op per key: "=C" sets
 * its count to C (a renewal, which repairs any drift), "-D" takes D off
 * (a release), "~C" keeps the count (a renewal while a take is
 * unanswered) or sets C, the slots answered as taken, if the field is
 * gone (expired while the store was away). Every op moves the field's
 * expiry to now + lease. */
#define LUA_SLOTS_BODY \
    "  local now, id, lease = now_ms(), ARGV[1], tonumber(ARGV[2])\n" \
    "  for i = 1, #KEYS do\n" \
    "    local key, op = KEYS[i], ARGV[i + 2]\n" \
    "    local c, n = string.sub(op, 1, 1), tonumber(string.sub(op, 2))\n" \
    "    if c ~= '=' then\n" \
    "      local v = redis.call('HGET', key, id)\n" \
    "      local has = v and tonumber(string.match(v, '^(%d+) '))\n" \
    "      if c == '-' then n = (has or 0) - n else n = has or n end\n" \
    "    end\n" \
    "    slot_set(key, id, n, now, lease)\n" \
    "  end\n" \
    "  return #KEYS\n"

/* Several buckets in one call: a request's exact rules on one shard.
 * KEYS are the buckets; ARGV[1] is the mode letter followed by one flag
 * per key ('1' enforced, '0' shadow: its rejection is not the request's);
 * then each key's burst, limit, period_ms and cost, as the bucket's. The
 * reply is a list of the bucket's integers, one per key, in order.
 *
 * - 'c' (charge: all, refund): each bucket as if called alone.
 * - 'f' (charge: first_reject): the same, in order, stopping after the
 *   first enforced rejection; the list is cut there, and the keys after it
 *   were not read.
 * - 'a' (charge: atomic): every bucket is read first; only if no enforced
 *   one rejects are they all written, else none is. An allowing bucket that
 *   was not charged answers its d as it is, unchanged.
 *
 * An in_flight rule's key is flagged '3' (enforced) or '2' (shadow), and
 * its four arguments are the agent's id, N, the lease (ms) and 1 to take
 * a slot (a hold) or 0 to see whether one is free (a plain check). It is
 * admitted when the slots held, live fields summed, are at most N - 1;
 * its answer is the slots held after the call, or -(held + 1) when it
 * rejects. It is charged as a bucket is: with 'a', only when no enforced
 * key rejects.
 *
 * The letters are compared as bytes ('a' 97, 'f' 102): no string is made
 * per call. A rejection writes nothing, as in the bucket. The same key
 * twice in one call would be read before its first write: the agent never
 * sends that (two rules never share a key prefix).
 *
 * It reads and writes each bucket as the bucket does (the same macros), at
 * a lower cost per key, which is what a request of several rules pays
 * (callgrind, docs/performance.md): the numbers written go to redis.call
 * as strings made with %d, where Redis 7.0 formats a Lua number with
 * %.17g (about 1,900 more instructions a key); a cached argument is looked up without a
 * call of num; math's functions are locals; charge: atomic keeps each
 * key's d and whether its value is its own in two tables of the call, not
 * a table per key. */
#define NUM_OF(ARG) "nums[" ARG "] or num(" ARG ")"

#define LUA_MULTI_WRITE \
    LUA_WRITE_OF("ceil", "fmt('%d', full_in)", \
                 "fmt('%d', full_in * limit - d)")

#define LUA_MULTI_BODY \
    "  local flags, byte = ARGV[1], string.byte\n" \
    "  local min, max, ceil = math.min, math.max, math.ceil\n" \
    "  local fmt = string.format\n" \
    "  local mode = byte(flags, 1)\n" \
    "  local out, rejected, after, ttls = {}, false, nil, nil\n" \
    "  local takes, now = {}, nil\n" \
    "  if mode == 97 then after, ttls = {}, {} end\n" \
    "  for i = 1, #KEYS do\n" \
    "    local j = 4 * i - 2\n" \
    "    local kind = byte(flags, i + 1)\n" \
    "    if kind >= 50 then\n" \
    "      now = now or now_ms()\n" \
    "      local held = slots_held(KEYS[i], now)\n" \
    "      local take = tonumber(ARGV[j + 3])\n" \
    "      if held + 1 > tonumber(ARGV[j + 1]) then\n" \
    "        out[i] = -held - 1\n" \
    "        if kind == 51 then\n" \
    "          if mode == 102 then return out end\n" \
    "          rejected = true\n" \
    "        end\n" \
    "      elseif mode == 97 then\n" \
    "        out[i], takes[i] = held, take\n" \
    "      else\n" \
    "        if take > 0 then\n" \
    "          slot_take(KEYS[i], ARGV[j], now, tonumber(ARGV[j + 2]))\n" \
    "        end\n" \
    "        out[i] = held + take\n" \
    "      end\n" \
    "    else\n" \
    LUA_READ_OF("KEYS[i]", NUM_OF("ARGV[j]"), NUM_OF("ARGV[j + 1]"), \
                NUM_OF("ARGV[j + 2]"), NUM_OF("ARGV[j + 3]"), "min", \
                "ARGV[j + 1]", "ARGV[j + 2]") \
    "    local was = d\n" \
    "    if need < 0 then\n" \
    "      d = max(0, d + need)\n" \
    "    elseif d + need <= cap then\n" \
    "      d = d + need\n" \
    "    else\n" \
    "      d = nil\n" \
    "    end\n" \
    "    if d == nil then\n" \
    "      out[i] = -was - 1\n" \
    "      if byte(flags, i + 1) == 49 then\n" \
    "        if mode == 102 then return out end\n" \
    "        rejected = true\n" \
    "      end\n" \
    "    elseif mode == 97 then\n" \
    "      out[i], after[i], ttls[i] = was, d, own\n" \
    "    else\n" \
    "      out[i] = d\n" \
    LUA_MULTI_WRITE \
    "    end\n" \
    "    end\n" \
    "  end\n" \
    "  if rejected or after == nil then return out end\n" \
    "  local call = redis.call\n" \
    "  for i = 1, #KEYS do\n" \
    "    local d, take = after[i], takes[i]\n" \
    "    if take ~= nil and take > 0 then\n" \
    "      slot_take(KEYS[i], ARGV[4 * i - 2], now, num(ARGV[4 * i]))\n" \
    "      out[i] = out[i] + take\n" \
    "    end\n" \
    "    if d ~= nil then\n" \
    "      local key, own = KEYS[i], ttls[i]\n" \
    "      local limit = " NUM_OF("ARGV[4 * i - 1]") "\n" \
    "      local period = " NUM_OF("ARGV[4 * i]") "\n" \
    "      local whole = period % limit == 0\n" \
    "      local cap = (" NUM_OF("ARGV[4 * i - 2]") ") * period\n" \
    "      local tag = ARGV[4 * i - 1] .. '/' .. ARGV[4 * i]\n" \
    LUA_MULTI_WRITE \
    "      out[i] = d\n" \
    "    end\n" \
    "  end\n" \
    "  return out\n"

const char rl_library_source[] =
    "#!lua name=" RL_LIBRARY_NAME "\n"
    LUA_NUMBER_CACHE
    LUA_SLOTS
    "local function bucket(KEYS, ARGV)\n"
    LUA_BUCKET_BODY
    "end\n"
    "local function lease(KEYS, ARGV)\n"
    LUA_LEASE_BODY
    "end\n"
    "local function multi(KEYS, ARGV)\n"
    LUA_MULTI_BODY
    "end\n"
    "local function window_add(KEYS, ARGV)\n"
    LUA_WINDOW_ADD_BODY
    "end\n"
    "local function slots(KEYS, ARGV)\n"
    LUA_SLOTS_BODY
    "end\n"
    "redis.register_function('" RL_FUNCTION_BUCKET "', bucket)\n"
    "redis.register_function('" RL_FUNCTION_LEASE "', lease)\n"
    "redis.register_function('" RL_FUNCTION_MULTI "', multi)\n"
    "redis.register_function('" RL_FUNCTION_WINDOW_ADD "', window_add)\n"
    "redis.register_function('" RL_FUNCTION_SLOTS "', slots)\n";

/* Before Redis 5 a script that writes after a non-deterministic read needs
 * effects replication switched on; from 5 on it is the default and this is
 * a no-op. */
#define LUA_SCRIPT_PREAMBLE \
    "if redis.replicate_commands then redis.replicate_commands() end\n"

static const char bucket_script[] =
    LUA_SCRIPT_PREAMBLE LUA_NUMBER_CACHE LUA_BUCKET_BODY;

static const char lease_script[] =
    LUA_SCRIPT_PREAMBLE LUA_NUMBER_CACHE LUA_LEASE_BODY;

static const char multi_script[] =
    LUA_SCRIPT_PREAMBLE LUA_NUMBER_CACHE LUA_SLOTS LUA_MULTI_BODY;

static const char slots_script[] =
    LUA_SCRIPT_PREAMBLE LUA_SLOTS LUA_SLOTS_BODY;

static const char window_add_script[] =
    LUA_SCRIPT_PREAMBLE LUA_WINDOW_ADD_BODY;

static const char *const functions[] = {RL_FUNCTION_BUCKET, RL_FUNCTION_LEASE,
                                        RL_FUNCTION_MULTI,
                                        RL_FUNCTION_WINDOW_ADD,
                                        RL_FUNCTION_SLOTS};
static const char *const sources[] = {bucket_script, lease_script,
                                      multi_script, window_add_script,
                                      slots_script};

const rl_script_set rl_bucket_scripts = {
    .library = rl_library_source,
    .functions = functions,
    .sources = sources,
    .n = 5,
};
