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
 * Beside the sub-windows the hash holds one field m, "h r o g": the head h
 * (the newest sub-window counted), r, the sum of h-N+1..h-1, o, the
 * count of h-N, and g, the sub-windows' length (a changed period
 * renumbers the hash: window_call.c). So a count in the head's sub-window costs two calls,
 * HINCRBY (whose reply is that sub-window's count) and HGET m, and its
 * answer is r plus that count, and o, never a read of 21 fields; that took
 * Redis's work per pair from about 80,000 instructions to 21,000 (callgrind,
 * docs/performance.md, "Aggregator ingest"). The head moves with the first
 * count of a new sub-window; only then does the hash get its expiry (two
 * periods) and lose the field that left the span one sub-window before,
 * so that an aggregator one sub-window behind still reads what it would
 * have without m. A count for a sub-window before the head gives it its
 * expiry again, so that a hash only such counts wrote expires too. rlctl
 * and the tests read only fields named by a number.
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
 * A report entry may name the sub-window its count was made in (wire.h),
 * and the count goes there: a report held through an outage then weighs
 * what its requests weighed when they were admitted, instead of a
 * period's worth landing at once in the sub-window it arrives in, which
 * refused a tenant under its limit for a period. A sub-window after now's
 * (the agent's clock ahead) is taken as now's; one more than N before
 * now's takes the count nowhere, since no span read from now on holds it,
 * not even as its oldest. Either way the entry is answered with the totals
 * read in now's sub-window, as every entry is; an entry without a window
 * (an older agent) is counted now.
 *
 * A report is applied by function calls that each check a sequence number
 * and, only if the report is new to them, add its counts (HINCRBY; a
 * count of 0 only asks for the totals and writes nothing) or record the
 * agent as live in the rules its counts are for and the rules it names as
 * present: a sorted set per rule (rl:agg:live:<rule>), the agent's id
 * scored by the time it stays live until, now plus live_ms (by Redis's
 * clock as this aggregator knows it), read after dropping those scored
 * before now. A rule's agent count is then the agents that reported it
 * lately, whichever aggregator they reported to, not every id a period
 * saw: a restarted gateway's old id leaves it with its goodbye (GOODBYE,
 * rl_windows_leave) or live_ms after its last report, and an id that is
 * gone costs nothing after that. Either way they answer the current
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
 * On one server a report is one part (rl:agg:seq:<agent>), and the parts
 * are gathered: while a call is at Redis, the reports that arrive are
 * queued, and when it answers they all go as one call (window_call.c),
 * each key once (per sub-window its counts go to) with the sum of the
 * fresh reports' counts, each report still checked against its own
 * sequence key. A report that arrives with no call at Redis goes at once:
 * gathering adds no wait when idle. A gathered call carries at most
 * aggregator.max_entries entries, no more than fit RL_WINDOWS_CALL_US of
 * Redis's time (windows.h: a report over RL_WINDOWS_PIECE entries goes in
 * pieces, the first part of a call whatever its cost), and
 * at most the reports the aggregator handles at once (RL_INGEST_WORKERS):
 * the queue holds nothing the workers do not. With four agents reporting the same 1,000 keys, a call of four
 * reports costs Redis one HINCRBY and one HGET per key, not four
 * (docs/performance.md, "Aggregator ingest").
 *
 * On a cluster a call may only touch one slot, so a report becomes one
 * call per slot its counts fall in, plus one per rule for the agent sets,
 * each with its own sequence key in that slot
 * (rl:agg:seq:<agent>:counts:{...} and rl:agg:seq:<agent>:agents:{<rule>}),
 * all sent at once. They are not gathered (not built: that would be per
 * slot, and a report's counts spread over many slots). If any of them
 * fails the report is not acknowledged; its resend is then applied by the
 * calls that failed and skipped by the ones that did not.
 */
#include "windows.h"

#include "keys.h"
#include "window_args.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reports applied on one server: the parts waiting while a call is at
 * Redis. */
struct rl_windows {
    rl_store *store;
    size_t max_entries;
    uint64_t live_ms;       /* how long a report keeps its agent live */
    uint64_t interval_ms;   /* the sync interval */
    rl_window_part *queue, *queue_tail;
    bool busy;
    uint64_t cost_ns, cost_entries; /* decaying sums (cost_per_entry_ns) */
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

/* One call's worth of a report: the report rules whose agent sets it
 * writes and the entries whose counts it adds, by their indexes in the
 * report, and what it asks of Redis, its keys made when it is planned
 * (a queued part must not hold on to the rules: a reload frees them). */
typedef struct part {
    job *job;
    /* Piece number + 1 of a report split in pieces (windows.h), 0 for a
     * report applied whole. */
    size_t piece;
    size_t n_rules, n_entries;
    size_t *rules, *entries;
    rl_window_part call;
    rl_args keys;
} part;

static part *part_of(rl_window_part *p)
{
    return (part *)((char *)p - offsetof(part, call));
}

static void part_free(part *pt)
{
    free(pt->rules);
    free(pt->entries);
    free(pt->call.sets);
    free(pt->call.counts);
    rl_args_fini(&pt->keys);
    free(pt);
}

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

static void part_answered(part *pt, const char *error)
{
    job *j = pt->job;
    if (error == NULL) {
        j->all_duplicate &= pt->call.duplicate;
        for (size_t k = 0; k < pt->n_rules; k++)
            j->agents[pt->rules[k]] = pt->call.sets[k].agents;
        for (size_t k = 0; k < pt->n_entries; k++) {
            rl_window_total *t = &j->totals[pt->entries[k]];
            const rl_window_count *c = &pt->call.counts[k];
            t->current = c->recent;
            t->previous = c->oldest;
            t->n_leaving = c->n_leaving;
            memcpy(t->leaving, c->leaving, sizeof t->leaving);
        }
    } else if (j->error == NULL) {
        snprintf(j->error_text, sizeof j->error_text, "%s", error);
        j->error = j->error_text;
    }
    part_free(pt);
    if (--j->parts_pending == 0)
        job_done(j);
}

static void on_answered(void *arg, rl_window_part *parts, uint64_t redis_us,
                        size_t entries, const char *error)
{
    (void)arg;
    (void)redis_us;
    (void)entries;
    while (parts != NULL) {
        rl_window_part *next = parts->next;
        part_answered(part_of(parts),
                      parts->error[0] != '\0' ? parts->error : error);
        parts = next;
    }
}

static void on_gathered(void *arg, rl_window_part *parts, uint64_t redis_us,
                        size_t entries, const char *error);

/* What the queue's next entries are expected to cost Redis, in ns each:
 * the time recent calls took by Redis's clock over the entries they
 * carried, each sum decaying by an eighth a call, so that a flood of
 * fresh keys (a new hash each, several times the work of a known key)
 * shrinks the calls within a few. Before any call, the cost that makes a
 * piece of fresh keys fill a call. */
static uint64_t cost_per_entry_ns(const rl_windows *ws)
{
    if (ws->cost_entries == 0)
        return RL_WINDOWS_CALL_US * 1000 / RL_WINDOWS_PIECE;
    return ws->cost_ns / ws->cost_entries + 1;
}

/* Sends the parts queued, as many as fit one call: the entries the cap
 * lets in, and no more than RL_WINDOWS_CALL_US of Redis's time by the
 * cost of recent calls, or a piece's worth (the first part whatever its
 * cost: at most a piece). */
static void send_gathered(rl_windows *ws)
{
    rl_window_part *first = ws->queue, *last = first;
    if (first == NULL) {
        ws->busy = false;
        return;
    }
    /* A piece's entries always fit: a call's own cost (its round of Lua,
     * TIME, the sequence keys) makes small calls read as dear per entry,
     * and a piece of the dearest entries is sized to the budget. */
    uint64_t per_entry = cost_per_entry_ns(ws);
    size_t fit = (size_t)(RL_WINDOWS_CALL_US * 1000 / per_entry);
    if (fit < RL_WINDOWS_PIECE)
        fit = RL_WINDOWS_PIECE;
    size_t cap = fit < ws->max_entries ? fit : ws->max_entries;
    size_t entries = first->n_counts;
    while (last->next != NULL && entries <= cap
           && last->next->n_counts <= cap - entries) {
        last = last->next;
        entries += last->n_counts;
    }
    ws->queue = last->next;
    if (ws->queue == NULL)
        ws->queue_tail = NULL;
    last->next = NULL;
    ws->busy = true;
    rl_window_call(ws->store, first, on_gathered, ws);
}

static void on_gathered(void *arg, rl_window_part *parts, uint64_t redis_us,
                        size_t entries, const char *error)
{
    rl_windows *ws = arg;
    if (entries > 0 && redis_us > 0) {
        ws->cost_ns = ws->cost_ns - ws->cost_ns / 8 + redis_us * 1000;
        ws->cost_entries = ws->cost_entries - ws->cost_entries / 8 + entries;
    }
    on_answered(NULL, parts, redis_us, entries, error);
    send_gathered(ws);
}

/* What the report is applied with, shared by its parts. */
typedef struct report_view {
    const rl_wire_msg *m;
    const rl_rule *const *rules;  /* per entry */
    const rl_rule **distinct;     /* the report's rules */
    bool cluster;
} report_view;

/* An entry's hash of sub-windows. */
static void add_window_key(rl_args *a, const report_view *v, size_t i)
{
    size_t start = a->used;
    const rl_rule *rule = v->rules[i];
    const rl_wire_entry *e = &v->m->entries[i];
    rl_args_add(a, v->cluster ? "{" : "", v->cluster ? 1 : 0);
    rl_args_add(a, rule->key_prefix, strlen(rule->key_prefix));
    rl_args_add(a, e->value.ptr, e->value.len);
    rl_args_add(a, v->cluster ? "}" : "", v->cluster ? 1 : 0);
    rl_args_add(a, ":w", 2);
    rl_args_join(a, 5, start);
}

/* A rule's set of live agents, in the rule's own slot on a cluster. */
static void add_live_key(rl_args *a, const char *rule, bool cluster)
{
    rl_args_addf(a, cluster ? "rl:agg:live:{%s}" : "rl:agg:live:%s", rule);
}

/* The part's sequence key, in the slot of its keys. */
static void add_seq_key(rl_args *a, const report_view *v, const part *pt)
{
    const rl_wire_msg *m = v->m;
    size_t start = a->used;
    /* A piece's own sequence (windows.h), named before the agent so that
     * no agent id can make one piece's key another's. */
    /* An exchange's sender is another region's aggregator: its own
     * names, so that no agent id can be taken for one. */
    const char *of = m->type == RL_WIRE_EXCHANGE ? "x" : "";
    if (pt->piece > 0) {
        rl_args_addf(a, "rl:agg:%spiece:%zu:%.*s", of, pt->piece - 1,
                     (int)m->agent_id.len, m->agent_id.ptr);
        if (m->stream > 0)
            rl_args_addf(a, "/%llu", (unsigned long long)m->stream);
        rl_args_join(a, m->stream > 0 ? 2 : 1, start);
        return;
    }
    /* One sequence per (agent, stream): an agent's streams (one per
     * aggregator of its config) number their reports each on their own,
     * and a stream's report may reach any aggregator (failover). */
    if (m->stream > 0)
        rl_args_addf(a, "rl:agg:seq:%.*s/%llu", (int)m->agent_id.len,
                     m->agent_id.ptr, (unsigned long long)m->stream);
    else
        rl_args_addf(a, "rl:agg:%sseq:%.*s", of, (int)m->agent_id.len,
                     m->agent_id.ptr);
    if (!v->cluster)
        return;
    if (pt->n_rules > 0) {
        rl_args_addf(a, ":agents:{%s}", v->distinct[pt->rules[0]]->name);
    } else {
        const rl_wire_entry *e = &m->entries[pt->entries[0]];
        const char *prefix = v->rules[pt->entries[0]]->key_prefix;
        rl_args_addf(a, ":counts:{%s", prefix);
        rl_args_add(a, e->value.ptr, e->value.len);
        rl_args_add(a, "}", 1);
        rl_args_join(a, 4, start);
        return;
    }
    rl_args_join(a, 2, start);
}

static size_t keys_cap(const report_view *v, const part *pt)
{
    size_t cap = 2 * (RL_WIRE_ID_MAX + 40)
                 + pt->n_rules * (RL_NAME_MAX + 24);
    for (size_t k = 0; k < pt->n_entries; k++) {
        size_t i = pt->entries[k];
        cap += strlen(v->rules[i]->key_prefix) + v->m->entries[i].value.len
               + 8;
    }
    /* The sequence key may repeat one entry's key. */
    return cap + RL_PREFIX_MAX + RL_WIRE_VALUE_MAX + 16;
}

/* The sub-window an entry's count goes to: the one it was made in, if the
 * entry says when (at: a time in it, numbered here by this aggregator's
 * period of the rule, g), but not after now's (the agent's clock ahead),
 * and none (a count of 0: its totals are only read) once more than N
 * sub-windows before now's, where no span read from now on has it even as
 * its oldest: a give-back too, as its estimate no longer counts. Without a
 * time, now's. */
static void place_count(rl_window_count *c, const rl_wire_entry *e,
                        uint64_t g)
{
    c->count_window = c->window;
    c->count = e->count;
    c->back = e->back;
    uint64_t made = e->at_ms / g;
    if (e->at_ms == 0 || made >= c->window)
        return;
    if (c->window - made > RL_WIRE_SUBWINDOWS)
        c->count = c->back = 0;
    else
        c->count_window = made;
}

/* Makes the part's keys and what it asks of Redis; -1 without memory. */
static int prepare(const report_view *v, part *pt, uint64_t now_ms,
                   const rl_windows *ws)
{
    rl_window_part *c = &pt->call;
    /* Every key, plus room for the pieces of a key being joined. */
    size_t slots = 1 + pt->n_rules + pt->n_entries + 8;
    c->sets = calloc(pt->n_rules + 1, sizeof *c->sets);
    c->counts = calloc(pt->n_entries + 1, sizeof *c->counts);
    if (c->sets == NULL || c->counts == NULL
        || rl_args_init(&pt->keys, slots, keys_cap(v, pt)) != 0)
        return -1;
    rl_args *a = &pt->keys;
    add_seq_key(a, v, pt);
    *c = (rl_window_part){.seq_key = a->argv[0], .seq_key_len = a->lens[0],
                          .agent = v->m->agent_id.ptr,
                          .agent_len = v->m->agent_id.len,
                          .seq = v->m->seq,
                          .duplicate = v->m->seq == 0,
                          .n_sets = pt->n_rules, .sets = c->sets,
                          .n_counts = pt->n_entries, .counts = c->counts};
    for (size_t k = 0; k < pt->n_rules; k++) {
        add_live_key(a, v->distinct[pt->rules[k]]->name, v->cluster);
        c->sets[k] = (rl_window_set){.key = a->argv[a->n - 1],
                                     .key_len = a->lens[a->n - 1],
                                     .now_ms = now_ms,
                                     .until_ms = now_ms + ws->live_ms};
    }
    for (size_t k = 0; k < pt->n_entries; k++) {
        size_t i = pt->entries[k];
        uint64_t period = v->rules[i]->period_ms;
        add_window_key(a, v, i);
        c->counts[k] = (rl_window_count){
            .key = a->argv[a->n - 1], .key_len = a->lens[a->n - 1],
            .ttl_ms = 2 * period, .g_ms = rl_wire_subwindow_ms(period),
            .window = now_ms / rl_wire_subwindow_ms(period),
            .n_leaving = rl_wire_leaving_count(period, ws->interval_ms)};
        place_count(&c->counts[k], &v->m->entries[i],
                    rl_wire_subwindow_ms(period));
    }
    return 0;
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
        part_free(pt);
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
        size_t pieces = (n + RL_WINDOWS_PIECE - 1) / RL_WINDOWS_PIECE;
        for (size_t k = 0; k == 0 || k < pieces; k++) {
            size_t from = k * RL_WINDOWS_PIECE;
            size_t to = pieces <= 1 ? n
                        : from + RL_WINDOWS_PIECE < n ? from + RL_WINDOWS_PIECE
                                                      : n;
            part *pt = new_part(j, k == 0 ? n_rules : 0, to - from);
            if (pt == NULL)
                return -1;
            pt->piece = pieces > 1 ? k + 1 : 0;
            for (size_t r = 0; k == 0 && r < n_rules; r++)
                pt->rules[pt->n_rules++] = r;
            for (size_t i = from; i < to; i++)
                pt->entries[pt->n_entries++] = i;
            parts[(*n_parts)++] = pt;
        }
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
        /* An exchange's sender is no agent: it joins no live set, and
         * its entries are answered with no agent count (agents[0] stays
         * 0: no set writes it). */
        j->rule_of[i] = m->type == RL_WIRE_EXCHANGE
                            ? 0
                            : distinct_index(distinct, n_rules, rules[i]);
        j->windows[i] = now_ms / rl_wire_subwindow_ms(rules[i]->period_ms);
    }
    for (size_t i = 0; i < n_presence; i++)
        j->presence_rule[i] = distinct_index(distinct, n_rules, presence[i]);
    return j;
}

rl_windows *rl_windows_new(rl_store *store, size_t max_entries,
                           uint64_t interval_ms)
{
    rl_windows *ws = calloc(1, sizeof *ws);
    if (ws != NULL)
        *ws = (rl_windows){.store = store, .max_entries = max_entries,
                           .live_ms = RL_WIRE_LIVE_INTERVALS * interval_ms,
                           .interval_ms = interval_ms};
    return ws;
}

void rl_windows_free(rl_windows *ws)
{
    free(ws);
}

/* On one server the part waits for the call at Redis, if there is one;
 * on a cluster it goes now, on its own. */
static void submit(rl_windows *ws, part *pt, bool cluster)
{
    if (cluster) {
        rl_window_call(ws->store, &pt->call, on_answered, NULL);
        return;
    }
    if (ws->queue_tail != NULL)
        ws->queue_tail->next = &pt->call;
    else
        ws->queue = &pt->call;
    ws->queue_tail = &pt->call;
    if (!ws->busy)
        send_gathered(ws);
}

void rl_windows_apply(rl_windows *ws, const rl_wire_msg *m,
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
    report_view v = {m, rules, distinct, rl_store_is_cluster(ws->store)};
    bool ok = j != NULL && plan(&v, j, n_rules, parts, &n_parts) == 0;
    for (size_t k = 0; ok && k < n_parts; k++)
        ok = prepare(&v, parts[k], now_ms, ws) == 0;
    if (!ok) {
        for (size_t k = 0; k < n_parts; k++)
            part_free(parts[k]);
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
    for (size_t k = 0; k < n_parts; k++)
        submit(ws, parts[k], v.cluster);
    free(distinct);
    free(parts);
    if (--j->parts_pending == 0)
        job_done(j);
}

/* One goodbye: its calls, one per rule (each rule's set is in its own slot
 * on a cluster; an agent leaves once in its life), answer into it. */
typedef struct leave {
    rl_windows_leave_fn fn;
    void *arg;
    uint64_t *agents;
    size_t pending;
    const char *error;
    char error_text[256];
} leave;

typedef struct leave_call {
    leave *job;
    size_t index;
} leave_call;

static void leave_answered(leave *j, const char *error)
{
    if (error != NULL && j->error == NULL) {
        snprintf(j->error_text, sizeof j->error_text, "%s", error);
        j->error = j->error_text;
    }
    if (--j->pending > 0)
        return;
    j->fn(j->arg, j->error == NULL ? j->agents : NULL, j->error);
    free(j->agents);
    free(j);
}

static void on_left(void *arg, const redisReply *r, const char *error)
{
    leave_call *c = arg;
    leave *j = c->job;
    if (error == NULL && (r == NULL || r->type != REDIS_REPLY_ARRAY
                          || r->elements != 1
                          || r->element[0]->type != REDIS_REPLY_INTEGER))
        error = "unexpected reply from the leave function";
    if (error == NULL)
        j->agents[c->index] = (uint64_t)r->element[0]->integer;
    free(c);
    leave_answered(j, error);
}

void rl_windows_leave(rl_windows *ws, rl_wire_bytes agent,
                      const rl_rule *const *rules, size_t n_rules,
                      uint64_t now_ms, rl_windows_leave_fn fn, void *arg)
{
    leave *j = calloc(1, sizeof *j);
    uint64_t *agents = calloc(n_rules + 1, sizeof *agents);
    if (j == NULL || agents == NULL) {
        free(j);
        free(agents);
        fn(arg, NULL, "out of memory");
        return;
    }
    /* One more pending than calls: a call that fails at once must not
     * finish the goodbye before the others are sent. */
    *j = (leave){.fn = fn, .arg = arg, .agents = agents,
                 .pending = n_rules + 1};
    bool cluster = rl_store_is_cluster(ws->store);
    for (size_t i = 0; i < n_rules; i++) {
        leave_call *c = calloc(1, sizeof *c);
        rl_args a;
        if (c == NULL
            || rl_args_init(&a, 8, RL_NAME_MAX + RL_WIRE_ID_MAX + 64) != 0) {
            free(c);
            leave_answered(j, "out of memory");
            continue;
        }
        *c = (leave_call){j, i};
        rl_args_add_u64(&a, 1);
        add_live_key(&a, rules[i]->name, cluster);
        rl_args_add(&a, agent.ptr, agent.len);
        rl_args_add_u64(&a, now_ms);
        rl_store_run(ws->store, RL_WINDOW_LEAVE, (int)a.n, a.argv, a.lens,
                     on_left, c);
        rl_args_fini(&a);
    }
    leave_answered(j, NULL);
}
