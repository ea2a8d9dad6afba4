/*
 * windows.c: counts per window in Redis. A synced rule's count for a client
 * lives in one key per window, "<key_prefix><value>:w<window>", where
 * window = Redis's ms / period: windows are numbered by Redis's clock, the
 * same for every aggregator and never an agent's. Keys expire by themselves
 * two periods after they were last written, so the previous window is
 * still there while the current one runs.
 *
 * A report is applied by one function call, atomically: it checks the
 * agent's sequence number (rl:agg:seq:<agent>), and only if the report is
 * new adds its counts (INCRBY) and records the agent in the rule's set of
 * reporting agents for the window (rl:agg:agents:<rule>:w<window>). Either
 * way it answers the current totals, so an agent that resends a report
 * whose acknowledgement was lost gets the same answer and nothing is
 * counted twice. The rule: a report is applied when its sequence number is
 * greater than the last one applied for its agent id; agents number their
 * reports 1, 2, 3... and send the same number again until it is
 * acknowledged.
 */
#include "windows.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_TTL_S "3600"

/* KEYS: seq, then per rule (agents now, agents before), then per entry
 * (count now, count before). ARGV: seq, agent, n_rules, per rule its ttl
 * in ms, then per entry its rule's index (1-based) and count. Answers
 * {duplicate, agents per rule..., (now, before) per entry...}. */
#define LUA_APPLY_BODY \
    "  local seq, agent, nr = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])\n" \
    "  local last = tonumber(redis.call('GET', KEYS[1]) or '0')\n" \
    "  local fresh = seq > last\n" \
    "  if fresh then redis.call('SET', KEYS[1], seq, 'EX', " SEQ_TTL_S ") end\n" \
    "  local out = {fresh and 0 or 1}\n" \
    "  for r = 1, nr do\n" \
    "    local now, before = KEYS[2 * r], KEYS[2 * r + 1]\n" \
    "    if fresh then\n" \
    "      redis.call('SADD', now, agent)\n" \
    "      redis.call('PEXPIRE', now, ARGV[3 + r])\n" \
    "    end\n" \
    "    out[#out + 1] = math.max(redis.call('SCARD', now),\n" \
    "                             redis.call('SCARD', before))\n" \
    "  end\n" \
    "  local k, a = 2 + 2 * nr, 4 + nr\n" \
    "  while k <= #KEYS do\n" \
    "    local rule, count = tonumber(ARGV[a]), tonumber(ARGV[a + 1])\n" \
    "    local total\n" \
    "    if fresh then\n" \
    "      total = redis.call('INCRBY', KEYS[k], count)\n" \
    "      redis.call('PEXPIRE', KEYS[k], ARGV[3 + rule])\n" \
    "    else\n" \
    "      total = tonumber(redis.call('GET', KEYS[k]) or '0')\n" \
    "    end\n" \
    "    out[#out + 1] = total\n" \
    "    out[#out + 1] = tonumber(redis.call('GET', KEYS[k + 1]) or '0')\n" \
    "    k, a = k + 2, a + 2\n" \
    "  end\n" \
    "  return out\n"

static const char library[] =
    "#!lua name=rl_agg_1\n"
    "local function apply(KEYS, ARGV)\n" LUA_APPLY_BODY "end\n"
    "redis.register_function('rl_agg_1_apply', apply)\n";

static const char apply_script[] = LUA_APPLY_BODY;

static const char *const functions[] = {"rl_agg_1_apply"};
static const char *const sources[] = {apply_script};

const rl_script_set rl_window_scripts = {
    .library = library,
    .functions = functions,
    .sources = sources,
    .n = 1,
};

typedef struct pending {
    rl_windows_fn fn;
    void *arg;
    size_t n_entries;
    size_t n_rules;
    uint64_t *windows; /* per entry */
    size_t *rule_of;   /* per entry: index among the report's rules */
} pending;

static void on_reply(void *arg, const redisReply *r, const char *error)
{
    pending *p = arg;
    size_t want = 1 + p->n_rules + 2 * p->n_entries;
    rl_window_total *totals = NULL;
    if (r != NULL && (r->type != REDIS_REPLY_ARRAY || r->elements != want))
        error = "unexpected reply from the window script";
    if (r != NULL && error == NULL)
        totals = calloc(p->n_entries ? p->n_entries : 1, sizeof *totals);
    if (r != NULL && error == NULL && totals == NULL)
        error = "out of memory";
    if (totals != NULL) {
        for (size_t i = 0; i < p->n_entries; i++) {
            const redisReply *now = r->element[1 + p->n_rules + 2 * i];
            const redisReply *before = r->element[2 + p->n_rules + 2 * i];
            totals[i] = (rl_window_total){
                .window = p->windows[i],
                .current = (uint64_t)now->integer,
                .previous = (uint64_t)before->integer,
                .agents = (uint64_t)r->element[1 + p->rule_of[i]]->integer,
            };
        }
        p->fn(p->arg, r->element[0]->integer == 1, totals, NULL);
    } else {
        p->fn(p->arg, false, NULL, error);
    }
    free(totals);
    free(p->windows);
    free(p->rule_of);
    free(p);
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

void rl_windows_apply(rl_store *store, const rl_wire_msg *m,
                      const rl_rule *const *rules, uint64_t now_ms,
                      rl_windows_fn fn, void *arg)
{
    size_t n = m->n_entries;
    pending *p = calloc(1, sizeof *p);
    const rl_rule **distinct = calloc(n + 1, sizeof *distinct);
    /* Keys: 1 + 2 per rule + 2 per entry; arguments: 3 + 1 per rule + 2 per
     * entry. At most one rule per entry. */
    size_t slots = 5 + 7 * n;
    args a = {0};
    a.argv = calloc(slots, sizeof *a.argv);
    a.lens = calloc(slots, sizeof *a.lens);
    if (p != NULL) {
        p->windows = calloc(n + 1, sizeof *p->windows);
        p->rule_of = calloc(n + 1, sizeof *p->rule_of);
    }
    if (p != NULL && distinct != NULL && p->windows != NULL
        && p->rule_of != NULL) {
        *p = (pending){fn, arg, n, 0, p->windows, p->rule_of};
        for (size_t i = 0; i < n; i++) {
            size_t r = 0;
            while (r < p->n_rules && distinct[r] != rules[i])
                r++;
            if (r == p->n_rules)
                distinct[p->n_rules++] = rules[i];
            p->rule_of[i] = r;
            p->windows[i] = now_ms / rules[i]->period_ms;
        }
        /* The text, sized from what this report holds (never a worst case
         * per entry: a report of 65,536 entries must not cost 200 MB).
         * Numbers take at most 20 digits. */
        a.cap = 1 + 3 * 24 + 2 * (RL_WIRE_ID_MAX + 16)
                + p->n_rules * (24 + 2 * (RL_NAME_MAX + 40));
        for (size_t i = 0; i < n; i++)
            a.cap += 2 * (strlen(rules[i]->key_prefix)
                          + m->entries[i].value.len + 24) + 2 * 24;
        a.text = malloc(a.cap);
    }
    if (p == NULL || distinct == NULL || a.argv == NULL || a.lens == NULL
        || a.text == NULL || p->windows == NULL || p->rule_of == NULL) {
        if (p != NULL) {
            free(p->windows);
            free(p->rule_of);
        }
        free(p);
        free(distinct);
        free(a.argv);
        free(a.lens);
        free(a.text);
        fn(arg, false, NULL, "out of memory");
        return;
    }
    size_t numkeys = 1 + 2 * p->n_rules + 2 * n;
    addf(&a, "%zu", numkeys);
    addf(&a, "rl:agg:seq:%.*s", (int)m->agent_id.len, m->agent_id.ptr);
    for (size_t r = 0; r < p->n_rules; r++) {
        uint64_t w = now_ms / distinct[r]->period_ms;
        addf(&a, "rl:agg:agents:%s:w%llu", distinct[r]->name,
             (unsigned long long)w);
        addf(&a, "rl:agg:agents:%s:w%llu", distinct[r]->name,
             (unsigned long long)(w - 1));
    }
    for (size_t i = 0; i < n; i++) {
        for (int back = 0; back < 2; back++) {
            size_t start = a.used;
            add(&a, rules[i]->key_prefix, strlen(rules[i]->key_prefix));
            add(&a, m->entries[i].value.ptr, m->entries[i].value.len);
            addf(&a, ":w%llu", (unsigned long long)(p->windows[i] - back));
            /* The three pieces are one argument. */
            a.n -= 3;
            a.argv[a.n] = a.text + start;
            a.lens[a.n++] = a.used - start;
        }
    }
    addf(&a, "%llu", (unsigned long long)m->seq);
    add(&a, m->agent_id.ptr, m->agent_id.len);
    addf(&a, "%zu", p->n_rules);
    for (size_t r = 0; r < p->n_rules; r++)
        addf(&a, "%llu", (unsigned long long)(2 * distinct[r]->period_ms));
    for (size_t i = 0; i < n; i++) {
        addf(&a, "%zu", p->rule_of[i] + 1);
        addf(&a, "%llu", (unsigned long long)m->entries[i].count);
    }
    rl_store_run(store, 0, (int)a.n, a.argv, a.lens, on_reply, p);
    free(distinct);
    free(a.argv);
    free(a.lens);
    free(a.text);
}
