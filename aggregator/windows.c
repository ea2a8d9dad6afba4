/*
 * windows.c: counts per sub-window in Redis. A synced rule's period is cut
 * into RL_WIRE_SUBWINDOWS sub-windows of g = rl_wire_subwindow_ms(period)
 * ms; a client's counts live in one hash, "<key_prefix><value>:w" (on a
 * cluster "{<key_prefix><value>}:w"), one field per sub-window, named by
 * its number, window = Redis's ms / g: windows are numbered by Redis's
 * clock, the same for every aggregator and never an agent's. One hash, not
 * a key per sub-window: a report entry then passes one key, not 21, and
 * the aggregator's ingest measured 5.3 times faster (bench-synced).
 *
 * Beside the sub-windows the hash holds one field m, "h r o": the head h
 * (the newest sub-window counted), r, the sum of h-N+1..h-1, and o, the
 * count of h-N. So a count in the head's sub-window costs two calls,
 * HINCRBY (whose reply is that sub-window's count) and HGET m, and its
 * answer is r plus that count, and o, never a read of 21 fields; that took
 * Redis's work per pair from about 80,000 instructions to 21,000 (callgrind,
 * docs/performance.md, "Aggregator ingest"). The head moves with the first
 * count of a new sub-window; only then does the hash get its expiry (two
 * periods) and lose the field that left the span one sub-window before,
 * so that an aggregator one sub-window behind still reads what it would
 * have without m. rlctl and the tests read only fields named by a number.
 *
 * The answer for an entry read in sub-window w is "recent", the sum of
 * w-N+1..w, and "oldest", the count of w-N (N = RL_WIRE_SUBWINDOWS): their
 * sum covers every request counted in the trailing period, counting the
 * oldest sub-window whole although part of it is already outside. That is
 * what lets agents promise the limit over any span of one period, not only
 * over aligned windows: an estimate that weighs an older window by the part
 * of it still inside assumes its requests were spread evenly, and a burst
 * at its end then counts for less than it was.
 *
 * A report is applied by function calls that each check a sequence number
 * and, only if the report is new to them, add its counts (INCRBY; a count
 * of 0 only asks for the totals and writes nothing) or record the agent in
 * the rule's set of reporting agents for the period window
 * (rl:agg:agents:<rule>:w<period window>): the rules its counts are for and
 * the rules it names as present. Either way they answer the current
 * totals, so an agent that resends a report whose acknowledgement was lost
 * gets the same answer and nothing is counted twice. A report is applied
 * when its sequence number is greater than the last one applied for its
 * agent id; agents number their reports 1, 2, 3... and send the same
 * report again until it is acknowledged.
 *
 * An agent with several aggregators sends several streams of reports,
 * each numbered on its own: the sequence is per (agent, stream), its key
 * rl:agg:seq:<agent>/<stream> (rl:agg:seq:<agent> for stream 0). A report
 * numbered 0 is a ping: 0 is never greater than the last, so it is
 * answered as a duplicate and writes nothing.
 *
 * On one server that is one call (rl:agg:seq:<agent>). On a cluster a
 * call may only touch one slot, so a report becomes one call per slot its
 * counts fall in, plus one per rule for the agent sets, each with its own
 * sequence key in that slot (rl:agg:seq:<agent>:counts:{...} and
 * rl:agg:seq:<agent>:agents:{<rule>}), all sent at once. If any of them
 * fails the report is not acknowledged; its resend is then applied by the
 * calls that failed and skipped by the ones that did not.
 */
#include "windows.h"

#include "keys.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_TTL_S "3600"

/* KEYS: seq, then per rule (agents now, agents before), then per entry
 * its hash, grouped by sub-window. ARGV: seq, agent, n_rules, N, per rule
 * its ttl in ms, the number of groups, per group the hashes' ttl in ms, the
 * sub-window and the number of entries, then per entry its count. Answers
 * {duplicate, agents per rule..., (recent, oldest) per entry...}.
 *
 * Besides a field per sub-window a hash holds one field m, "h r o": its
 * head h (the newest sub-window counted), r (the sum of h-N+1..h-1) and o
 * (the count of h-N). While h is the entry's sub-window its answer is r
 * plus its own field, and o: the HINCRBY's reply and one HGET. When a count
 * starts a new sub-window the head moves (from the last head's sums and two
 * fields, or from the fields when sub-windows were skipped), and a count
 * for an older sub-window (an aggregator whose estimate of Redis's clock
 * lags) adds to r or o, so that they always equal what the fields hold. */
#define LUA_APPLY_BODY \
    "  local seq, agent = tonumber(ARGV[1]), ARGV[2]\n" \
    "  local nr, n = tonumber(ARGV[3]), tonumber(ARGV[4])\n" \
    "  local last = tonumber(redis.call('GET', KEYS[1]) or '0')\n" \
    "  local fresh = seq > last\n" \
    "  if fresh then redis.call('SET', KEYS[1], seq, 'EX', " SEQ_TTL_S ") end\n" \
    "  local out = {fresh and 0 or 1}\n" \
    "  for r = 1, nr do\n" \
    "    local now, before = KEYS[2 * r], KEYS[2 * r + 1]\n" \
    "    if fresh then\n" \
    "      redis.call('SADD', now, agent)\n" \
    "      redis.call('PEXPIRE', now, ARGV[4 + r])\n" \
    "    end\n" \
    "    out[#out + 1] = math.max(redis.call('SCARD', now),\n" \
    "                             redis.call('SCARD', before))\n" \
    "  end\n" \
    "  local fields, fields_of = {}, nil\n" \
    "  local function span(key, w)\n" \
    "    if w ~= fields_of then\n" \
    "      for i = 0, n do fields[i + 1] = string.format('%.0f', w - i) end\n" \
    "      fields_of = w\n" \
    "    end\n" \
    "    local v = redis.call('HMGET', key, unpack(fields))\n" \
    "    local recent = 0\n" \
    "    for i = 1, n do recent = recent + tonumber(v[i] or 0) end\n" \
    "    return recent, tonumber(v[n + 1] or 0)\n" \
    "  end\n" \
    "  local function sums(key, h, r, o)\n" \
    "    redis.call('HSET', key, 'm', string.format('%s %.0f %.0f', h, r, o))\n" \
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
    "    if h == w - 1 then\n" \
    "      local v = redis.call('HMGET', key, hs,\n" \
    "                           string.format('%.0f', h - n + 1))\n" \
    "      oldest = tonumber(v[2] or 0)\n" \
    "      recent = tonumber(r) + tonumber(v[1] or 0) - oldest + now\n" \
    "    else\n" \
    "      recent, oldest = span(key, w)\n" \
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
    "  local function entry(key, counted, w, ws, ttl)\n" \
    "    local count = tonumber(counted)\n" \
    "    if fresh and count > 0 then\n" \
    "      local now = redis.call('HINCRBY', key, ws, counted)\n" \
    "      local hs, r, o = string.match(redis.call('HGET', key, 'm') or '',\n" \
    "                                    '^(%d+) (%d+) (%d+)$')\n" \
    "      if hs == ws or tonumber(hs) == w then\n" \
    "        return tonumber(r) + now, tonumber(o)\n" \
    "      end\n" \
    "      local h = tonumber(hs)\n" \
    "      if h == nil or h < w then\n" \
    "        return move_head(key, hs, r, h, w, ws, ttl, now)\n" \
    "      end\n" \
    "      local recent, oldest = span(key, w)\n" \
    "      if w > h - n then\n" \
    "        sums(key, hs, tonumber(r) + count, tonumber(o))\n" \
    "      elseif w == h - n then\n" \
    "        sums(key, hs, tonumber(r), tonumber(o) + count)\n" \
    "      end\n" \
    "      forget_strays(key, w)\n" \
    "      return recent, oldest\n" \
    "    end\n" \
    "    local v = redis.call('HMGET', key, 'm', ws)\n" \
    "    local hs, r, o = string.match(v[1] or '', '^(%d+) (%d+) (%d+)$')\n" \
    "    if hs == ws or tonumber(hs) == w then\n" \
    "      return tonumber(r) + tonumber(v[2] or 0), tonumber(o)\n" \
    "    end\n" \
    "    return span(key, w)\n" \
    "  end\n" \
    "  local k, g, o = 2 + 2 * nr, 6 + nr, #out\n" \
    "  local c = g + 3 * tonumber(ARGV[5 + nr])\n" \
    "  while k <= #KEYS do\n" \
    "    local ttl, ws = ARGV[g], ARGV[g + 1]\n" \
    "    local w, upto = tonumber(ws), k + tonumber(ARGV[g + 2])\n" \
    "    while k < upto do\n" \
    "      local recent, oldest = entry(KEYS[k], ARGV[c], w, ws, ttl)\n" \
    "      out[o + 1], out[o + 2], o = recent, oldest, o + 2\n" \
    "      k, c = k + 1, c + 1\n" \
    "    end\n" \
    "    g = g + 3\n" \
    "  end\n" \
    "  return out\n"

static const char library[] =
    "#!lua name=rl_agg_4\n"
    "local function apply(KEYS, ARGV)\n" LUA_APPLY_BODY "end\n"
    "redis.register_function('rl_agg_4_apply', apply)\n";

static const char apply_script[] = LUA_APPLY_BODY;

static const char *const functions[] = {"rl_agg_4_apply"};
static const char *const sources[] = {apply_script};

const rl_script_set rl_window_scripts = {
    .library = library,
    .functions = functions,
    .sources = sources,
    .n = 1,
};

/* One report being applied: its parts answer into it. */
typedef struct job {
    rl_windows_fn fn;
    void *arg;
    size_t n_entries;
    uint64_t *windows;       /* per entry */
    size_t *rule_of;         /* per entry: index among the report's rules */
    uint64_t *agents;        /* per report rule */
    size_t n_presence;
    size_t *presence_rule;   /* per presence name: index among the rules */
    uint64_t *presence_agents; /* per presence name, for the callback */
    rl_window_total *totals; /* per entry */
    int parts_pending;
    bool all_duplicate;
    const char *error;       /* the first part's failure (static text) */
    char error_text[256];
} job;

/* One call: the report rules whose agent sets it writes and the entries
 * whose counts it adds, by their indexes in the report. */
typedef struct part {
    job *job;
    size_t n_rules, n_entries;
    size_t *rules, *entries;
} part;

static void job_done(job *j)
{
    if (j->error == NULL) {
        for (size_t i = 0; i < j->n_entries; i++) {
            j->totals[i].window = j->windows[i];
            j->totals[i].agents = j->agents[j->rule_of[i]];
        }
        for (size_t i = 0; i < j->n_presence; i++)
            j->presence_agents[i] = j->agents[j->presence_rule[i]];
        j->fn(j->arg, j->all_duplicate, j->totals, j->presence_agents,
              NULL);
    } else {
        j->fn(j->arg, false, NULL, NULL, j->error);
    }
    free(j->presence_rule);
    free(j->presence_agents);
    free(j->windows);
    free(j->rule_of);
    free(j->agents);
    free(j->totals);
    free(j);
}

static void on_part_reply(void *arg, const redisReply *r, const char *error)
{
    part *pt = arg;
    job *j = pt->job;
    size_t want = 1 + pt->n_rules + 2 * pt->n_entries;
    if (r != NULL && (r->type != REDIS_REPLY_ARRAY || r->elements != want))
        error = "unexpected reply from the window script";
    if (r != NULL && error == NULL) {
        j->all_duplicate &= r->element[0]->integer == 1;
        for (size_t k = 0; k < pt->n_rules; k++)
            j->agents[pt->rules[k]] = (uint64_t)r->element[1 + k]->integer;
        for (size_t k = 0; k < pt->n_entries; k++) {
            rl_window_total *t = &j->totals[pt->entries[k]];
            t->current = (uint64_t)r->element[1 + pt->n_rules + 2 * k]
                             ->integer;
            t->previous = (uint64_t)r->element[2 + pt->n_rules + 2 * k]
                              ->integer;
        }
    } else if (j->error == NULL) {
        snprintf(j->error_text, sizeof j->error_text, "%s",
                 error != NULL ? error : "no reply");
        j->error = j->error_text;
    }
    free(pt->rules);
    free(pt->entries);
    free(pt);
    if (--j->parts_pending == 0)
        job_done(j);
}

/* The argument list, built in one buffer of strings. */
typedef struct args {
    const char **argv;
    size_t *lens;
    char *text;
    size_t n, used, cap;
} args;

static void add(args *a, const char *s, size_t len)
{
    memcpy(a->text + a->used, s, len);
    a->argv[a->n] = a->text + a->used;
    a->lens[a->n++] = len;
    a->used += len;
}

static void addf(args *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void addf(args *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(a->text + a->used, a->cap - a->used, fmt, ap);
    va_end(ap);
    a->argv[a->n] = a->text + a->used;
    a->lens[a->n++] = (size_t)n;
    a->used += (size_t)n;
}

/* Joins the last `pieces` arguments into one. */
static void join(args *a, size_t pieces, size_t start)
{
    a->n -= pieces;
    a->argv[a->n] = a->text + start;
    a->lens[a->n++] = a->used - start;
}

/* What the report is applied with, shared by its parts. */
typedef struct report_view {
    const rl_wire_msg *m;
    const rl_rule *const *rules;  /* per entry */
    const rl_rule **distinct;     /* the report's rules */
    bool cluster;
} report_view;

/* An entry's hash of sub-windows. */
static void add_window_key(args *a, const report_view *v, size_t i)
{
    size_t start = a->used;
    const rl_rule *rule = v->rules[i];
    const rl_wire_entry *e = &v->m->entries[i];
    add(a, v->cluster ? "{" : "", v->cluster ? 1 : 0);
    add(a, rule->key_prefix, strlen(rule->key_prefix));
    add(a, e->value.ptr, e->value.len);
    add(a, v->cluster ? "}" : "", v->cluster ? 1 : 0);
    add(a, ":w", 2);
    join(a, 5, start);
}

static void add_agents_key(args *a, const report_view *v, size_t r,
                           uint64_t window)
{
    const char *name = v->distinct[r]->name;
    if (v->cluster)
        addf(a, "rl:agg:agents:{%s}:w%llu", name,
             (unsigned long long)window);
    else
        addf(a, "rl:agg:agents:%s:w%llu", name, (unsigned long long)window);
}

/* The part's sequence key, in the slot of its keys. */
static void add_seq_key(args *a, const report_view *v, const part *pt)
{
    const rl_wire_msg *m = v->m;
    size_t start = a->used;
    /* One sequence per (agent, stream): an agent's streams (one per
     * aggregator of its config) number their reports each on their own,
     * and a stream's report may reach any aggregator (failover). */
    if (m->stream > 0)
        addf(a, "rl:agg:seq:%.*s/%llu", (int)m->agent_id.len,
             m->agent_id.ptr, (unsigned long long)m->stream);
    else
        addf(a, "rl:agg:seq:%.*s", (int)m->agent_id.len, m->agent_id.ptr);
    if (!v->cluster)
        return;
    if (pt->n_rules > 0) {
        addf(a, ":agents:{%s}", v->distinct[pt->rules[0]]->name);
    } else {
        const rl_wire_entry *e = &m->entries[pt->entries[0]];
        const char *prefix = v->rules[pt->entries[0]]->key_prefix;
        addf(a, ":counts:{%s", prefix);
        add(a, e->value.ptr, e->value.len);
        add(a, "}", 1);
        join(a, 4, start);
        return;
    }
    join(a, 2, start);
}

static size_t args_cap(const report_view *v, const part *pt)
{
    size_t cap = 5 * 24 + 2 * (RL_WIRE_ID_MAX + 40)
                 + pt->n_rules * (24 + 2 * (RL_NAME_MAX + 48));
    for (size_t k = 0; k < pt->n_entries; k++) {
        size_t i = pt->entries[k];
        /* The key, its count, and its group's three numbers at most. */
        cap += strlen(v->rules[i]->key_prefix) + v->m->entries[i].value.len
               + 30 + 4 * 24;
    }
    /* The sequence key may repeat one entry's key. */
    return cap + RL_PREFIX_MAX + RL_WIRE_VALUE_MAX + 16;
}

/* A number as an argument, without printf: a report's counts are most of
 * its arguments. */
static void add_u64(args *a, uint64_t v)
{
    char digits[20];
    size_t n = 0;
    do {
        digits[sizeof digits - ++n] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    add(a, digits + sizeof digits - n, n);
}

/* Orders the part's entries by rule, so that the script gets them in
 * groups sharing a sub-window and a ttl; returns the number of groups, or
 * 0 without memory. The reply follows the new order (entries[k] says which
 * entry the k-th answer is for). */
static size_t group_by_rule(part *pt, const size_t *rule_of, size_t n_rules)
{
    size_t *next = calloc(n_rules + 1, sizeof *next);
    size_t *sorted = calloc(pt->n_entries + 1, sizeof *sorted);
    size_t groups = 0;
    if (next != NULL && sorted != NULL) {
        for (size_t k = 0; k < pt->n_entries; k++)
            next[rule_of[pt->entries[k]] + 1]++;
        for (size_t r = 0; r < n_rules; r++) {
            groups += next[r + 1] > 0;
            next[r + 1] += next[r];
        }
        for (size_t k = 0; k < pt->n_entries; k++)
            sorted[next[rule_of[pt->entries[k]]]++] = pt->entries[k];
        memcpy(pt->entries, sorted, pt->n_entries * sizeof *sorted);
    }
    free(next);
    free(sorted);
    return groups;
}

/* Per group of entries: the hashes' ttl, the sub-window, how many. */
static void add_groups(args *a, const report_view *v, const part *pt,
                       const size_t *rule_of, uint64_t now_ms)
{
    size_t k = 0;
    while (k < pt->n_entries) {
        size_t first = pt->entries[k], len = 0;
        while (k + len < pt->n_entries
               && rule_of[pt->entries[k + len]] == rule_of[first])
            len++;
        uint64_t period = v->rules[first]->period_ms;
        add_u64(a, 2 * period);
        add_u64(a, now_ms / rl_wire_subwindow_ms(period));
        add_u64(a, len);
        k += len;
    }
}

static bool run_part(rl_store *store, const report_view *v, part *pt,
                     size_t n_rules, uint64_t now_ms)
{
    const size_t *rule_of = pt->job->rule_of;
    size_t groups = pt->n_entries > 0 ? group_by_rule(pt, rule_of, n_rules)
                                      : 0;
    /* The final count, plus room for the pieces of a key being joined. */
    size_t slots = 7 + 3 * pt->n_rules + 2 * pt->n_entries + 3 * groups + 8;
    args a = {.argv = calloc(slots, sizeof *a.argv),
              .lens = calloc(slots, sizeof *a.lens),
              .cap = args_cap(v, pt)};
    a.text = malloc(a.cap);
    if (a.argv == NULL || a.lens == NULL || a.text == NULL
        || (pt->n_entries > 0 && groups == 0)) {
        free(a.argv);
        free(a.lens);
        free(a.text);
        return false;
    }
    add_u64(&a, 1 + 2 * pt->n_rules + pt->n_entries);
    add_seq_key(&a, v, pt);
    for (size_t k = 0; k < pt->n_rules; k++) {
        uint64_t w = now_ms / v->distinct[pt->rules[k]]->period_ms;
        add_agents_key(&a, v, pt->rules[k], w);
        add_agents_key(&a, v, pt->rules[k], w - 1);
    }
    for (size_t k = 0; k < pt->n_entries; k++)
        add_window_key(&a, v, pt->entries[k]);
    add_u64(&a, v->m->seq);
    add(&a, v->m->agent_id.ptr, v->m->agent_id.len);
    add_u64(&a, pt->n_rules);
    add_u64(&a, RL_WIRE_SUBWINDOWS);
    for (size_t k = 0; k < pt->n_rules; k++)
        add_u64(&a, 2 * v->distinct[pt->rules[k]]->period_ms);
    add_u64(&a, groups);
    add_groups(&a, v, pt, rule_of, now_ms);
    for (size_t k = 0; k < pt->n_entries; k++)
        add_u64(&a, v->m->entries[pt->entries[k]].count);
    rl_store_run(store, 0, (int)a.n, a.argv, a.lens, on_part_reply, pt);
    free(a.argv);
    free(a.lens);
    free(a.text);
    return true;
}

static part *new_part(job *j, size_t max_rules, size_t max_entries)
{
    part *pt = calloc(1, sizeof *pt);
    if (pt == NULL)
        return NULL;
    pt->job = j;
    pt->rules = calloc(max_rules + 1, sizeof *pt->rules);
    pt->entries = calloc(max_entries + 1, sizeof *pt->entries);
    if (pt->rules == NULL || pt->entries == NULL) {
        free(pt->rules);
        free(pt->entries);
        free(pt);
        return NULL;
    }
    return pt;
}

/* The slot an entry's window keys fall in (cluster only). */
static uint16_t entry_slot(const report_view *v, size_t i)
{
    char key[RL_PREFIX_MAX + RL_WIRE_VALUE_MAX + 4];
    const rl_wire_entry *e = &v->m->entries[i];
    size_t plen = strlen(v->rules[i]->key_prefix);
    key[0] = '{';
    memcpy(key + 1, v->rules[i]->key_prefix, plen);
    memcpy(key + 1 + plen, e->value.ptr, e->value.len);
    key[1 + plen + e->value.len] = '}';
    return rl_key_slot(key, plen + e->value.len + 2);
}

/* Splits the report into parts: one for everything on one server; on a
 * cluster one per rule (agent sets) and one per slot (counts). */
static int plan(const report_view *v, job *j, size_t n_rules,
                part **parts, size_t *n_parts)
{
    size_t n = v->m->n_entries;
    *n_parts = 0;
    if (!v->cluster) {
        part *pt = new_part(j, n_rules, n);
        if (pt == NULL)
            return -1;
        for (size_t r = 0; r < n_rules; r++)
            pt->rules[pt->n_rules++] = r;
        for (size_t i = 0; i < n; i++)
            pt->entries[pt->n_entries++] = i;
        parts[(*n_parts)++] = pt;
        return 0;
    }
    for (size_t r = 0; r < n_rules; r++) {
        part *pt = new_part(j, 1, 0);
        if (pt == NULL)
            return -1;
        pt->rules[pt->n_rules++] = r;
        parts[(*n_parts)++] = pt;
    }
    uint16_t *slot_of = calloc(n + 1, sizeof *slot_of);
    if (slot_of == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        slot_of[i] = entry_slot(v, i);
    size_t first_count_part = *n_parts;
    for (size_t i = 0; i < n; i++) {
        part *pt = NULL;
        for (size_t k = first_count_part; k < *n_parts && pt == NULL; k++) {
            if (slot_of[parts[k]->entries[0]] == slot_of[i])
                pt = parts[k];
        }
        if (pt == NULL) {
            if ((pt = new_part(j, 0, n)) == NULL) {
                free(slot_of);
                return -1;
            }
            parts[(*n_parts)++] = pt;
        }
        pt->entries[pt->n_entries++] = i;
    }
    free(slot_of);
    return 0;
}

static size_t distinct_index(const rl_rule **distinct, size_t *n_rules,
                             const rl_rule *rule)
{
    size_t r = 0;
    while (r < *n_rules && distinct[r] != rule)
        r++;
    if (r == *n_rules)
        distinct[(*n_rules)++] = rule;
    return r;
}

static job *new_job(const rl_wire_msg *m, const rl_rule *const *rules,
                    const rl_rule *const *presence, size_t n_presence,
                    const rl_rule **distinct, size_t *n_rules,
                    uint64_t now_ms, rl_windows_fn fn, void *arg)
{
    size_t n = m->n_entries;
    job *j = calloc(1, sizeof *j);
    if (j == NULL)
        return NULL;
    *j = (job){.fn = fn, .arg = arg, .n_entries = n, .all_duplicate = true,
               .n_presence = n_presence};
    j->windows = calloc(n + 1, sizeof *j->windows);
    j->rule_of = calloc(n + 1, sizeof *j->rule_of);
    j->agents = calloc(n + n_presence + 1, sizeof *j->agents);
    j->totals = calloc(n + 1, sizeof *j->totals);
    j->presence_rule = calloc(n_presence + 1, sizeof *j->presence_rule);
    j->presence_agents = calloc(n_presence + 1, sizeof *j->presence_agents);
    if (j->windows == NULL || j->rule_of == NULL || j->agents == NULL
        || j->totals == NULL || j->presence_rule == NULL
        || j->presence_agents == NULL) {
        free(j->presence_rule);
        free(j->presence_agents);
        free(j->windows);
        free(j->rule_of);
        free(j->agents);
        free(j->totals);
        free(j);
        return NULL;
    }
    *n_rules = 0;
    for (size_t i = 0; i < n; i++) {
        j->rule_of[i] = distinct_index(distinct, n_rules, rules[i]);
        j->windows[i] = now_ms / rl_wire_subwindow_ms(rules[i]->period_ms);
    }
    for (size_t i = 0; i < n_presence; i++)
        j->presence_rule[i] = distinct_index(distinct, n_rules, presence[i]);
    return j;
}

void rl_windows_apply(rl_store *store, const rl_wire_msg *m,
                      const rl_rule *const *rules,
                      const rl_rule *const *presence, size_t n_presence,
                      uint64_t now_ms, rl_windows_fn fn, void *arg)
{
    size_t n = m->n_entries, n_rules = 0, n_parts = 0;
    const rl_rule **distinct = calloc(n + n_presence + 1, sizeof *distinct);
    part **parts = calloc(2 * n + n_presence + 1, sizeof *parts);
    job *j = distinct != NULL && parts != NULL
                 ? new_job(m, rules, presence, n_presence, distinct, &n_rules,
                           now_ms, fn, arg)
                 : NULL;
    report_view v = {m, rules, distinct, rl_store_is_cluster(store)};
    bool ok = j != NULL && plan(&v, j, n_rules, parts, &n_parts) == 0;
    if (!ok) {
        for (size_t k = 0; k < n_parts; k++) {
            free(parts[k]->rules);
            free(parts[k]->entries);
            free(parts[k]);
        }
        if (j != NULL) {
            j->error = "out of memory";
            job_done(j);
        } else {
            fn(arg, false, NULL, NULL, "out of memory");
        }
        free(distinct);
        free(parts);
        return;
    }
    /* Every part counts as pending before the first is sent: a part that
     * fails at once must not finish the job early. */
    j->parts_pending = (int)n_parts + 1;
    for (size_t k = 0; k < n_parts; k++) {
        if (!run_part(store, &v, parts[k], n_rules, now_ms)) {
            snprintf(j->error_text, sizeof j->error_text, "out of memory");
            j->error = j->error_text;
            free(parts[k]->rules);
            free(parts[k]->entries);
            free(parts[k]);
            j->parts_pending--;
        }
    }
    free(distinct);
    free(parts);
    if (--j->parts_pending == 0)
        job_done(j);
}
