/*
 * window_call.c: one call of the window function for several parts of
 * reports (window_call.h). The parts are those that arrived while the last
 * call was at Redis (windows.c): a fleet's agents report the same keys at
 * the same moments, so a key carried by several parts appears once in the
 * call, with the sum of their counts, and costs Redis one HINCRBY and one
 * HGET however many reports carried it (once per sub-window its counts go
 * to: counts held through an outage keep the sub-windows they were made
 * in, windows.c).
 *
 * Each part is still applied once, by its own sequence key. The function
 * first checks every part not known to be a duplicate; if any is not new,
 * it writes nothing and answers which: the call is made again with those
 * parts marked as duplicates, whose counts are then left out of the sums
 * and whose agents are not added (they are only answered). Another way
 * would be to pass every part's counts and sum in Lua only the fresh ones,
 * but that costs Lua work per report entry in every call, for the rare
 * resent report; this costs one more call when one comes. The check and
 * the writes are one atomic call, so a part found new is applied exactly
 * once; a part once found not new never becomes new again (sequence
 * numbers only grow), and each repeat marks at least one more part, so a
 * call of p parts is made at most p + 1 times.
 */
#include "window_call.h"

#include "keys.h"
#include "window_args.h"
#include "wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_TTL_S "3600"

/* KEYS: per part its sequence key, per agent set rule its set of live
 * agents, then the hashes of sub-windows, grouped by sub-window. ARGV: the
 * number of parts, of set rules, N; per part its seq, agent, 1 if known a
 * duplicate (else 0), its number of set rules and their numbers (from 1);
 * per set rule now (Redis's ms) and the time until which an agent added
 * now stays live (its score: members scored before now are dropped, and
 * the rest counted); the number of
 * groups, per group the hashes' ttl in ms, the sub-window w their totals
 * are read in (now's), the sub-window their counts go to (w or one of the
 * N before it), the number of hashes, the sub-windows' length g in ms
 * and how many sub-windows after the oldest to answer (LEAVING, wire.h);
 * then per hash its count (summed over the fresh parts). Answers {0,
 * agents per set rule..., (recent, oldest, {the counts of w-N+1, w-N+2,
 * ..., as many as asked}) per hash..., the µs the call took in Redis (its
 * own TIME, not the wait before it: what it kept others waiting,
 * windows.c sizes calls by it)}, or {1, the numbers of the parts found not new...} or {2, the
 * numbers of the KEYS that hold another type...} having written nothing.
 * Everything that can fail is read before the first write (the types of
 * the sets and hashes; a hash's m, kept for its first entry) and the
 * sequence keys are written last: a call that fails part-way would have
 * marked reports applied whose counts it never wrote, and their resends,
 * taken as duplicates, lost them. A hash may be in two groups of a call (one
 * report's counts of a key made in two sub-windows): the group after sees
 * the writes of the one before.
 *
 * Besides a field per sub-window a hash holds one field m, "h r o g": its
 * head h (the newest sub-window a count was applied in, by the clock of
 * the aggregator that applied it: the count itself may be for an older
 * one), r (the sum of h-N+1..h-1) and o (the count of h-N). While h is w
 * and the count is for w, the answer is r plus w's field, and o: the
 * HINCRBY's reply and one HGET. When w is past the head, the head moves
 * to w: from the last head's sums and two fields when it moves by one and
 * the count is w's, else from the fields. A count for a sub-window before
 * the head (an aggregator whose estimate of Redis's clock lags, or a count
 * its report says was made earlier) adds to r or o, so that they always
 * equal what the fields hold, and gives the hash its expiry again, as a
 * head move does: a hash that only such counts wrote still expires.
 *
 * g is the length of the sub-windows the fields are numbered in: a reload
 * that changes a rule's period changes it, and the fields written before
 * are read in the period that wrote them, not in the new one. The first
 * call with another g renumbers the hash: each field f goes to the new
 * sub-window of its end, floor(((f + 1) * g_old - 1) / g), but not past
 * now's (nothing was counted later): every count is placed as late as it
 * may have been made, so it stays in spans as long as it may have to (the
 * limit admits less, never more), and m is worked out afresh. Two aggregators
 * whose configs differ for a moment renumber a hash back and forth; each
 * time moves counts later, never earlier. An m of three numbers (written
 * by rl_agg_6) is taken as numbered in the call's g.
 *
 * A hash's count may be negative: give-backs (wire.h) beyond the call's
 * other counts of it. It comes off its sub-window's field, never below 0
 * (the estimate it gives back may have been counted elsewhere: a report
 * that the aggregator's clock put in another sub-window), and off r or o
 * as a count adds to them, so that they still equal the fields. */
#define LUA_APPLY_BODY \
    "  local started = redis.call('TIME')\n" \
    "  local nparts, nsets = tonumber(ARGV[1]), tonumber(ARGV[2])\n" \
    "  local n = tonumber(ARGV[3])\n" \
    "  local a, last, stale, fresh = 4, {}, {}, {}\n" \
    "  for p = 1, nparts do\n" \
    "    if ARGV[a + 2] == '0' then\n" \
    "      local seq, key = tonumber(ARGV[a]), KEYS[p]\n" \
    "      local applied = last[key]\n" \
    "                      or tonumber(redis.call('GET', key) or '0')\n" \
    "      if seq > applied then\n" \
    "        last[key], fresh[#fresh + 1] = seq, a\n" \
    "      else\n" \
    "        stale[#stale + 1] = p\n" \
    "      end\n" \
    "    end\n" \
    "    a = a + 4 + tonumber(ARGV[a + 3])\n" \
    "  end\n" \
    "  if #stale > 0 then return {1, unpack(stale)} end\n" \
    "  local first_hash, heads, wrong = nparts + nsets + 1, {}, {2}\n" \
    "  for k = nparts + 1, first_hash - 1 do\n" \
    "    local t = redis.call('TYPE', KEYS[k])['ok']\n" \
    "    if t ~= 'none' and t ~= 'zset' then wrong[#wrong + 1] = k end\n" \
    "  end\n" \
    "  for k = first_hash, #KEYS do\n" \
    "    local m = redis.pcall('HGET', KEYS[k], 'm')\n" \
    "    if type(m) == 'table' and m['err'] then\n" \
    "      wrong[#wrong + 1] = k\n" \
    "    elseif heads[KEYS[k]] == nil then\n" \
    "      heads[KEYS[k]] = m\n" \
    "    end\n" \
    "  end\n" \
    "  if #wrong > 1 then return wrong end\n" \
    "  local function head_of(key)\n" \
    "    local m = heads[key]\n" \
    "    if m == nil then return redis.call('HGET', key, 'm') end\n" \
    "    heads[key] = nil\n" \
    "    return m\n" \
    "  end\n" \
    "  for _, f in ipairs(fresh) do\n" \
    "    for i = 1, tonumber(ARGV[f + 3]) do\n" \
    "      local s = tonumber(ARGV[f + 3 + i])\n" \
    "      local till = ARGV[a + 2 * s - 1]\n" \
    "      redis.call('ZADD', KEYS[nparts + s], till, ARGV[f + 1])\n" \
    "      redis.call('PEXPIRE', KEYS[nparts + s],\n" \
    "                 tonumber(till) - tonumber(ARGV[a + 2 * s - 2]))\n" \
    "    end\n" \
    "  end\n" \
    "  local out = {0}\n" \
    "  for s = 1, nsets do\n" \
    "    redis.call('ZREMRANGEBYSCORE', KEYS[nparts + s], '-inf',\n" \
    "               '(' .. ARGV[a + 2 * s - 2])\n" \
    "    out[s + 1] = redis.call('ZCARD', KEYS[nparts + s])\n" \
    "  end\n" \
    "  local fields, fields_of, sub = {}, nil, nil\n" \
    "  local function span(key, w)\n" \
    "    if w ~= fields_of then\n" \
    "      for i = 0, n do fields[i + 1] = string.format('%.0f', w - i) end\n" \
    "      fields_of = w\n" \
    "    end\n" \
    "    local v = redis.call('HMGET', key, unpack(fields))\n" \
    "    local recent = 0\n" \
    "    for i = 1, n do recent = recent + tonumber(v[i] or 0) end\n" \
    "    return recent, tonumber(v[n + 1] or 0), tonumber(v[1] or 0)\n" \
    "  end\n" \
    "  local function sums(key, h, r, o)\n" \
    "    redis.call('HSET', key, 'm',\n" \
    "               string.format('%s %.0f %.0f %s', h, r, o, sub))\n" \
    "  end\n" \
    "  local function head(m)\n" \
    "    return string.match(m or '', '^(%d+) (%d+) (%d+) ?(%d*)$')\n" \
    "  end\n" \
    "  local function renumber(key, from, w, ws)\n" \
    "    local all, moved, gone = redis.call('HGETALL', key), {}, {'m'}\n" \
    "    for i = 1, #all, 2 do\n" \
    "      local x = tonumber(all[i])\n" \
    "      if x ~= nil then\n" \
    "        local y = math.min(math.floor(((x + 1) * from - 1) / sub), w)\n" \
    "        moved[y] = (moved[y] or 0) + tonumber(all[i + 1])\n" \
    "        gone[#gone + 1] = all[i]\n" \
    "      end\n" \
    "    end\n" \
    "    redis.call('HDEL', key, unpack(gone))\n" \
    "    for y, c in pairs(moved) do\n" \
    "      redis.call('HSET', key, string.format('%.0f', y),\n" \
    "                 string.format('%.0f', c))\n" \
    "    end\n" \
    "    local recent, oldest, now = span(key, w)\n" \
    "    sums(key, ws, recent - now, oldest)\n" \
    "    return ws, recent - now, oldest, now\n" \
    "  end\n" \
    "  local function forget_strays(key, w)\n" \
    "    if redis.call('HLEN', key) <= 2 * n + 3 then return end\n" \
    "    for _, f in ipairs(redis.call('HKEYS', key)) do\n" \
    "      local x = tonumber(f)\n" \
    "      if x ~= nil and x < w - n - 1 then redis.call('HDEL', key, f) end\n" \
    "    end\n" \
    "  end\n" \
    "  local function move_head(key, hs, r, h, w, ws, ttl, now)\n" \
    "    local recent, oldest\n" \
    "    if h == w - 1 and now ~= nil then\n" \
    "      local v = redis.call('HMGET', key, hs,\n" \
    "                           string.format('%.0f', h - n + 1))\n" \
    "      oldest = tonumber(v[2] or 0)\n" \
    "      recent = tonumber(r) + tonumber(v[1] or 0) - oldest + now\n" \
    "    else\n" \
    "      recent, oldest, now = span(key, w)\n" \
    "    end\n" \
    "    sums(key, ws, recent - now, oldest)\n" \
    "    redis.call('PEXPIRE', key, ttl)\n" \
    "    if h == nil then\n" \
    "      forget_strays(key, w)\n" \
    "    else\n" \
    "      local gone = {}\n" \
    "      for i = h - n - 1, math.min(h, w - n - 2) do\n" \
    "        gone[#gone + 1] = string.format('%.0f', i)\n" \
    "      end\n" \
    "      if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end\n" \
    "    end\n" \
    "    return recent, oldest\n" \
    "  end\n" \
    "  local function before_head(key, hs, r, o, cw, count, w, ttl)\n" \
    "    local h = tonumber(hs)\n" \
    "    if cw > h - n then\n" \
    "      sums(key, hs, tonumber(r) + count, tonumber(o))\n" \
    "    elseif cw == h - n then\n" \
    "      sums(key, hs, tonumber(r), tonumber(o) + count)\n" \
    "    end\n" \
    "    redis.call('PEXPIRE', key, ttl)\n" \
    "    forget_strays(key, w)\n" \
    "    return span(key, w)\n" \
    "  end\n" \
    "  local function entry(key, counted, w, ws, cw, cs, ttl)\n" \
    "    local count = tonumber(counted)\n" \
    "    local hs, r, o, from = head(head_of(key))\n" \
    "    if from ~= nil and from ~= '' and from ~= sub then\n" \
    "      hs, r, o = renumber(key, tonumber(from), w, ws)\n" \
    "    end\n" \
    "    if count < 0 then\n" \
    "      count = math.max(count, -tonumber(redis.call('HGET', key, cs)\n" \
    "                                        or 0))\n" \
    "    end\n" \
    "    if count ~= 0 then\n" \
    "      local now = redis.call('HINCRBY', key, cs,\n" \
    "                             string.format('%.0f', count))\n" \
    "      if cs ~= ws then now = nil end\n" \
    "      if now ~= nil and (hs == ws or tonumber(hs) == w) then\n" \
    "        return tonumber(r) + now, tonumber(o)\n" \
    "      end\n" \
    "      local h = tonumber(hs)\n" \
    "      if h == nil or h < w then\n" \
    "        return move_head(key, hs, r, h, w, ws, ttl, now)\n" \
    "      end\n" \
    "      return before_head(key, hs, r, o, cw, count, w, ttl)\n" \
    "    end\n" \
    "    if hs == ws or tonumber(hs) == w then\n" \
    "      return tonumber(r) + tonumber(redis.call('HGET', key, ws) or 0),\n" \
    "             tonumber(o)\n" \
    "    end\n" \
    "    return span(key, w)\n" \
    "  end\n" \
    "  local function leaving(key, w, count)\n" \
    "    if count == 0 then return {} end\n" \
    "    local names = {}\n" \
    "    for i = 1, count do\n" \
    "      names[i] = string.format('%.0f', w - n + i)\n" \
    "    end\n" \
    "    local v = redis.call('HMGET', key, unpack(names))\n" \
    "    for i = 1, count do v[i] = tonumber(v[i] or 0) end\n" \
    "    return v\n" \
    "  end\n" \
    "  local k, g, o = nparts + nsets + 1, a + 2 * nsets + 1, #out\n" \
    "  local c = g + 6 * tonumber(ARGV[g - 1])\n" \
    "  while k <= #KEYS do\n" \
    "    local ttl, ws, cs = ARGV[g], ARGV[g + 1], ARGV[g + 2]\n" \
    "    sub = ARGV[g + 4]\n" \
    "    local w, cw = tonumber(ws), tonumber(cs)\n" \
    "    local upto = k + tonumber(ARGV[g + 3])\n" \
    "    local count = tonumber(ARGV[g + 5])\n" \
    "    while k < upto do\n" \
    "      local recent, oldest = entry(KEYS[k], ARGV[c], w, ws, cw, cs,\n" \
    "                                   ttl)\n" \
    "      out[o + 1], out[o + 2] = recent, oldest\n" \
    "      out[o + 3], o = leaving(KEYS[k], w, count), o + 3\n" \
    "      k, c = k + 1, c + 1\n" \
    "    end\n" \
    "    g = g + 6\n" \
    "  end\n" \
    "  for key, seq in pairs(last) do\n" \
    "    redis.call('SET', key, seq, 'EX', " SEQ_TTL_S ")\n" \
    "  end\n" \
    "  local ended = redis.call('TIME')\n" \
    "  out[#out + 1] = (ended[1] - started[1]) * 1000000\n" \
    "                  + (ended[2] - started[2])\n" \
    "  return out\n"


/* An agent leaving (GOODBYE, windows.c): KEYS are the live sets of its
 * rules, ARGV its id and now; answers each set's count without it. */
#define LUA_LEAVE_BODY \
    "  local out = {}\n" \
    "  for i, key in ipairs(KEYS) do\n" \
    "    redis.call('ZREM', key, ARGV[1])\n" \
    "    redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. ARGV[2])\n" \
    "    out[i] = redis.call('ZCARD', key)\n" \
    "  end\n" \
    "  return out\n"

/* rl_agg_8: rl_agg_7 answered no counts of the sub-windows after the
 * oldest (LEAVING), and its groups have five arguments, not six. The
 * hashes, their m and the sets of live agents are the same: an rl_agg_7
 * aggregator beside an rl_agg_8 one on the same Redis (a rolling upgrade)
 * keeps its own library and counts into the same keys.
 *
 * rl_agg_7: rl_agg_6 read a hash's sub-windows in the period of the call,
 * whatever period numbered them: an m of four numbers does not parse
 * there, so rl_agg_6 aggregators on the same Redis work its sums out again
 * from the fields, and write three. And rl_agg_6 kept each rule's agents in a set per period window
 * and counted this one's or the last one's, whichever was larger, so that
 * every process start (a restart, a reload of nginx's workers) counted for
 * up to two periods; rl_agg_7 keeps one sorted set per rule of the agents
 * live (rl:agg:live:<rule>, windows.c). An rl_agg_6 aggregator on the same
 * Redis keeps its own library and its sets (as rl_agg_5 beside rl_agg_6):
 * the counts of a rolling upgrade are each side's own until it is over.
 * rl_agg_6 also wrote the sequence keys first, answered no time, and
 * failed part-way on a key of another type. The hashes are the same. */
static const char library[] =
    "#!lua name=rl_agg_8\n"
    "local function apply(KEYS, ARGV)\n" LUA_APPLY_BODY "end\n"
    "local function leave(KEYS, ARGV)\n" LUA_LEAVE_BODY "end\n"
    "redis.register_function('rl_agg_8_apply', apply)\n"
    "redis.register_function('rl_agg_8_leave', leave)\n";

static const char apply_script[] = LUA_APPLY_BODY;
static const char leave_script[] = LUA_LEAVE_BODY;

static const char *const functions[] = {"rl_agg_8_apply",
                                        "rl_agg_8_leave"};
static const char *const sources[] = {apply_script, leave_script};

const rl_script_set rl_window_scripts = {
    .library = library,
    .functions = functions,
    .sources = sources,
    .n = 2,
};

/* The first part from p on that has not failed alone: a call leaves
 * those out. */
static rl_window_part *live(const rl_window_part *p)
{
    while (p != NULL && p->error[0] != '\0')
        p = p->next;
    return (rl_window_part *)p;
}

/* One call in flight. */
typedef struct call {
    rl_store *store;
    rl_window_part *parts;
    rl_window_call_fn fn;
    void *arg;
    size_t n_parts, n_sets, n_keys, n_counts;
} call;

/* The distinct set rules, sub-windows and hashes of a call's parts. */
typedef struct merge {
    uint64_t *group_ttl, *group_window, *group_count_window, *group_g;
    size_t *group_leaving;
    size_t *group_keys, n_groups, last_group; /* hashes per group */
    size_t *group_first, *group_filled;      /* their places */
    const rl_window_count **key_first; /* per distinct hash, in order met */
    size_t *key_group, *key_slot, *by_slot, n_keys;
    int64_t *key_sum;                  /* counts less give-backs */
    size_t *table, mask;               /* distinct hash + 1; 0: empty */
    const rl_window_set **sets;
    size_t n_sets;
} merge;

static void merge_free(merge *g)
{
    free(g->group_ttl);
    free(g->group_window);
    free(g->group_count_window);
    free(g->group_g);
    free(g->group_leaving);
    free(g->group_keys);
    free(g->group_first);
    free(g->group_filled);
    free(g->key_slot);
    free(g->key_first);
    free(g->key_group);
    free(g->by_slot);
    free(g->key_sum);
    free(g->table);
    free(g->sets);
}

static int merge_alloc(merge *g, size_t n_counts, size_t n_sets)
{
    size_t cap = 2;
    while (cap < 2 * n_counts)
        cap *= 2;
    *g = (merge){.group_ttl = calloc(n_counts + 1, sizeof *g->group_ttl),
                 .group_window = calloc(n_counts + 1,
                                        sizeof *g->group_window),
                 .group_count_window = calloc(n_counts + 1,
                                              sizeof *g->group_count_window),
                 .group_g = calloc(n_counts + 1, sizeof *g->group_g),
                 .group_leaving = calloc(n_counts + 1,
                                         sizeof *g->group_leaving),
                 .group_keys = calloc(n_counts + 1, sizeof *g->group_keys),
                 .group_first = calloc(n_counts + 1,
                                       sizeof *g->group_first),
                 .group_filled = calloc(n_counts + 1,
                                        sizeof *g->group_filled),
                 .key_slot = calloc(n_counts + 1, sizeof *g->key_slot),
                 .key_first = calloc(n_counts + 1, sizeof *g->key_first),
                 .key_group = calloc(n_counts + 1, sizeof *g->key_group),
                 .by_slot = calloc(n_counts + 1, sizeof *g->by_slot),
                 .key_sum = calloc(n_counts + 1, sizeof *g->key_sum),
                 .table = calloc(cap, sizeof *g->table),
                 .mask = cap - 1,
                 .sets = calloc(n_sets + 1, sizeof *g->sets)};
    if (g->group_ttl == NULL || g->group_window == NULL
        || g->group_count_window == NULL || g->group_g == NULL
        || g->group_leaving == NULL
        || g->group_keys == NULL
        || g->group_first == NULL || g->group_filled == NULL || g->key_slot == NULL
        || g->key_first == NULL
        || g->key_group == NULL || g->by_slot == NULL || g->key_sum == NULL
        || g->table == NULL || g->sets == NULL) {
        merge_free(g);
        return -1;
    }
    return 0;
}

static bool in_group(const merge *g, size_t k, const rl_window_count *c)
{
    return g->group_window[k] == c->window
           && g->group_count_window[k] == c->count_window
           && g->group_ttl[k] == c->ttl_ms && g->group_g[k] == c->g_ms
           && g->group_leaving[k] == c->n_leaving;
}

/* The group of a count's hash: its sub-windows and ttl (a call's counts
 * are mostly of one rule and made now, so the last group is tried
 * first). */
static size_t group_of(merge *g, const rl_window_count *c)
{
    size_t k = g->last_group;
    if (k < g->n_groups && in_group(g, k, c))
        return k;
    for (k = 0; k < g->n_groups; k++) {
        if (in_group(g, k, c))
            break;
    }
    if (k == g->n_groups) {
        g->group_window[k] = c->window;
        g->group_count_window[k] = c->count_window;
        g->group_ttl[k] = c->ttl_ms;
        g->group_g[k] = c->g_ms;
        g->group_leaving[k] = c->n_leaving;
        g->n_groups++;
    }
    return g->last_group = k;
}

/* The distinct hash a count is for (its index in the order met). */
static size_t key_of(merge *g, const rl_window_count *c, size_t group)
{
    size_t h = rl_key_hash(group + 1, c->key, c->key_len) & g->mask;
    for (;; h = (h + 1) & g->mask) {
        size_t d = g->table[h];
        if (d == 0)
            break;
        const rl_window_count *f = g->key_first[d - 1];
        if (g->key_group[d - 1] == group && f->key_len == c->key_len
            && memcmp(f->key, c->key, c->key_len) == 0)
            return d - 1;
    }
    size_t d = g->n_keys++;
    g->table[h] = d + 1;
    g->key_first[d] = c;
    g->key_group[d] = group;
    g->group_keys[group]++;
    return d;
}

static size_t set_of(merge *g, const rl_window_set *s)
{
    size_t k = 0;
    while (k < g->n_sets && (g->sets[k]->key_len != s->key_len
                             || memcmp(g->sets[k]->key, s->key,
                                       s->key_len) != 0))
        k++;
    if (k == g->n_sets)
        g->sets[g->n_sets++] = s;
    return k;
}

/* count added to sum, which stops at +-RL_WIRE_COUNT_MAX, as one count
 * does: past 2^53 the script's numbers would not be exact. */
static int64_t sum_within(int64_t sum, int64_t count)
{
    const int64_t most = (int64_t)RL_WIRE_COUNT_MAX;
    int64_t s = sum + count; /* both within 2^53: no overflow */
    return s > most ? most : s < -most ? -most : s;
}

/* Finds the distinct hashes and set rules; a count's slot becomes its
 * hash's place in the call (hashes ordered by group), a set's its rule's.
 * The counts of parts known to be duplicates are left out of the sums; a
 * give-back comes off its hash's sum (the script floors the field at 0). */
static void merge_parts(merge *g, rl_window_part *parts)
{
    for (rl_window_part *p = live(parts); p != NULL; p = live(p->next)) {
        for (size_t k = 0; k < p->n_sets; k++)
            p->sets[k].slot = set_of(g, &p->sets[k]);
        for (size_t k = 0; k < p->n_counts; k++) {
            rl_window_count *c = &p->counts[k];
            size_t d = key_of(g, c, group_of(g, c));
            c->slot = d;
            if (!p->duplicate)
                g->key_sum[d] = sum_within(g->key_sum[d],
                                           (int64_t)c->count
                                               - (int64_t)c->back);
        }
    }
    /* Each group's hashes after the groups before it. */
    for (size_t k = 1; k < g->n_groups; k++)
        g->group_first[k] = g->group_first[k - 1] + g->group_keys[k - 1];
    for (size_t d = 0; d < g->n_keys; d++) {
        size_t k = g->key_group[d];
        g->key_slot[d] = g->group_first[k] + g->group_filled[k]++;
        g->by_slot[g->key_slot[d]] = d;
    }
    for (rl_window_part *p = live(parts); p != NULL; p = live(p->next)) {
        for (size_t k = 0; k < p->n_counts; k++)
            p->counts[k].slot = g->key_slot[p->counts[k].slot];
    }
}

/* The bytes and strings the call's arguments take. */
static size_t args_cap(const merge *g, const rl_window_part *parts,
                       size_t *slots)
{
    size_t cap = 8 * 24 + 6 * 24 * g->n_groups, n = 8 + 6 * g->n_groups;
    for (const rl_window_part *p = live(parts); p != NULL;
         p = live(p->next)) {
        cap += p->seq_key_len + p->agent_len + 24 * (3 + p->n_sets);
        n += 5 + p->n_sets;
    }
    for (size_t k = 0; k < g->n_sets; k++) {
        cap += g->sets[k]->key_len + 2 * 24;
        n += 3;
    }
    for (size_t d = 0; d < g->n_keys; d++)
        cap += g->key_first[d]->key_len + 24;
    *slots = n + 2 * g->n_keys;
    return cap;
}

static void add_args(rl_args *a, const merge *g, const rl_window_part *parts,
                     size_t n_parts)
{
    rl_args_add_u64(a, n_parts + g->n_sets + g->n_keys);
    for (const rl_window_part *p = live(parts); p != NULL;
         p = live(p->next))
        rl_args_add(a, p->seq_key, p->seq_key_len);
    for (size_t k = 0; k < g->n_sets; k++)
        rl_args_add(a, g->sets[k]->key, g->sets[k]->key_len);
    for (size_t s = 0; s < g->n_keys; s++) {
        const rl_window_count *c = g->key_first[g->by_slot[s]];
        rl_args_add(a, c->key, c->key_len);
    }
    rl_args_add_u64(a, n_parts);
    rl_args_add_u64(a, g->n_sets);
    rl_args_add_u64(a, RL_WIRE_SUBWINDOWS);
    for (const rl_window_part *p = live(parts); p != NULL;
         p = live(p->next)) {
        rl_args_add_u64(a, p->seq);
        rl_args_add(a, p->agent, p->agent_len);
        rl_args_add(a, p->duplicate ? "1" : "0", 1);
        rl_args_add_u64(a, p->n_sets);
        for (size_t k = 0; k < p->n_sets; k++)
            rl_args_add_u64(a, p->sets[k].slot + 1);
    }
    for (size_t k = 0; k < g->n_sets; k++) {
        rl_args_add_u64(a, g->sets[k]->now_ms);
        rl_args_add_u64(a, g->sets[k]->until_ms);
    }
    rl_args_add_u64(a, g->n_groups);
    for (size_t k = 0; k < g->n_groups; k++) {
        rl_args_add_u64(a, g->group_ttl[k]);
        rl_args_add_u64(a, g->group_window[k]);
        rl_args_add_u64(a, g->group_count_window[k]);
        rl_args_add_u64(a, g->group_keys[k]);
        rl_args_add_u64(a, g->group_g[k]);
        rl_args_add_u64(a, g->group_leaving[k]);
    }
    for (size_t s = 0; s < g->n_keys; s++)
        rl_args_addf(a, "%" PRId64, g->key_sum[g->by_slot[s]]);
}

static bool all_integers(const redisReply *r)
{
    for (size_t i = 0; i < r->elements; i++) {
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            return false;
    }
    return true;
}

/* An applied call's answer: integers, but for each hash's counts after
 * the oldest, an array of as many integers as it asked, none negative. */
static bool well_formed(const call *c, const redisReply *r)
{
    if (r->elements != 2 + c->n_sets + 3 * c->n_keys)
        return false;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        bool counts = i > c->n_sets && i < r->elements - 1
                      && (i - 1 - c->n_sets) % 3 == 2;
        if (counts ? e->type != REDIS_REPLY_ARRAY || !all_integers(e)
                   : e->type != REDIS_REPLY_INTEGER)
            return false;
    }
    for (const rl_window_part *p = live(c->parts); p != NULL;
         p = live(p->next)) {
        for (size_t k = 0; k < p->n_counts; k++) {
            const redisReply *e =
                r->element[1 + c->n_sets + 3 * p->counts[k].slot + 2];
            if (e->elements != p->counts[k].n_leaving)
                return false;
            for (size_t j = 0; j < e->elements; j++)
                if (e->element[j]->integer < 0)
                    return false;
        }
    }
    return true;
}

/* Marks the parts the function found not new; false if the answer names
 * none, or one that is not a part still taken as new. */
static bool mark_duplicates(const call *c, const redisReply *r)
{
    if (r->elements < 2)
        return false;
    for (size_t i = 1; i < r->elements; i++) {
        long long number = r->element[i]->integer;
        rl_window_part *p = live(c->parts);
        for (long long k = 1; p != NULL && k < number; k++)
            p = live(p->next);
        if (number < 1 || p == NULL || p->duplicate)
            return false;
        p->duplicate = true;
    }
    return true;
}

/* Fails, each on its own, the parts that carry a key the function found
 * of another type (by its number among KEYS): an operator has to remove
 * or rename it, and until then the other reports of the call go on. False
 * if the answer names no such key of a live part. */
static bool fail_wrong_types(const call *c, const redisReply *r)
{
    size_t first_hash = c->n_parts + c->n_sets + 1;
    bool any = false;
    for (size_t i = 1; i < r->elements; i++) {
        long long k = r->element[i]->integer;
        if (k <= (long long)c->n_parts || k >= (long long)(first_hash
                                                           + c->n_keys))
            return false;
        for (rl_window_part *p = live(c->parts); p != NULL;
             p = live(p->next)) {
            const char *key = NULL;
            size_t len = 0;
            for (size_t s = 0; s < p->n_sets && key == NULL; s++) {
                if (c->n_parts + p->sets[s].slot + 1 == (size_t)k) {
                    key = p->sets[s].key;
                    len = p->sets[s].key_len;
                }
            }
            for (size_t e = 0; e < p->n_counts && key == NULL; e++) {
                if (first_hash + p->counts[e].slot == (size_t)k) {
                    key = p->counts[e].key;
                    len = p->counts[e].key_len;
                }
            }
            if (key == NULL)
                continue;
            snprintf(p->error, sizeof p->error, "Redis key '%.*s' holds "
                     "another type than rl writes there (a %s): remove or "
                     "rename it", (int)(len < 128 ? len : 128), key,
                     (size_t)k < first_hash ? "set of agents"
                                            : "hash of sub-windows");
            any = true;
        }
    }
    return any;
}

static void take_answer(const call *c, const redisReply *r)
{
    for (rl_window_part *p = live(c->parts); p != NULL; p = live(p->next)) {
        for (size_t k = 0; k < p->n_sets; k++)
            p->sets[k].agents = (uint64_t)r->element[1 + p->sets[k].slot]
                                    ->integer;
        for (size_t k = 0; k < p->n_counts; k++) {
            rl_window_count *t = &p->counts[k];
            size_t at = 1 + c->n_sets + 3 * t->slot;
            t->recent = (uint64_t)r->element[at]->integer;
            t->oldest = (uint64_t)r->element[at + 1]->integer;
            for (size_t j = 0; j < t->n_leaving; j++)
                t->leaving[j] = (uint64_t)r->element[at + 2]->element[j]
                                    ->integer;
        }
    }
}

static void on_reply(void *arg, const redisReply *r, const char *error)
{
    call *c = arg;
    if (error == NULL && r == NULL)
        error = "no reply";
    if (error == NULL && (r->type != REDIS_REPLY_ARRAY || r->elements < 1
                          || r->element[0]->type != REDIS_REPLY_INTEGER))
        error = "unexpected reply from the window script";
    if (error == NULL && (r->element[0]->integer == 1
                          || r->element[0]->integer == 2)) {
        if (all_integers(r)
            && (r->element[0]->integer == 1 ? mark_duplicates(c, r)
                                            : fail_wrong_types(c, r))) {
            rl_window_call(c->store, c->parts, c->fn, c->arg);
            free(c);
            return;
        }
        error = "unexpected reply from the window script";
    } else if (error == NULL && !well_formed(c, r)) {
        error = "unexpected reply from the window script";
    }
    uint64_t redis_us = 0;
    if (error == NULL) {
        take_answer(c, r);
        redis_us = (uint64_t)r->element[r->elements - 1]->integer;
    }
    c->fn(c->arg, c->parts, redis_us, c->n_counts, error);
    free(c);
}

void rl_window_call(rl_store *store, rl_window_part *parts,
                    rl_window_call_fn fn, void *arg)
{
    size_t n_parts = 0, n_counts = 0, n_sets = 0, slots = 0;
    for (const rl_window_part *p = live(parts); p != NULL;
         p = live(p->next)) {
        n_parts++;
        n_counts += p->n_counts;
        n_sets += p->n_sets;
    }
    if (n_parts == 0) {
        fn(arg, parts, 0, 0, NULL);
        return;
    }
    call *c = calloc(1, sizeof *c);
    merge g;
    if (c == NULL || merge_alloc(&g, n_counts, n_sets) != 0) {
        free(c);
        fn(arg, parts, 0, 0, "out of memory");
        return;
    }
    merge_parts(&g, parts);
    rl_args a;
    size_t cap = args_cap(&g, parts, &slots);
    if (rl_args_init(&a, slots, cap) != 0) {
        merge_free(&g);
        free(c);
        fn(arg, parts, 0, 0, "out of memory");
        return;
    }
    add_args(&a, &g, parts, n_parts);
    *c = (call){.store = store, .parts = parts, .fn = fn, .arg = arg,
                .n_parts = n_parts, .n_sets = g.n_sets, .n_keys = g.n_keys,
                .n_counts = n_counts};
    merge_free(&g);
    rl_store_run(store, RL_WINDOW_APPLY, (int)a.n, a.argv, a.lens, on_reply,
                 c);
    rl_args_fini(&a);
}
