/*
 * Several aggregators sharing the keys (docs/design.md, "Several
 * aggregators"): three rl-aggregator processes on one config's
 * aggregators: list, ten agents in this process, one tenant offered twice
 * its synced limit round-robin. The aggregator the tenant's key goes to
 * is killed (SIGKILL) in the middle of the traffic and started again
 * 10 s later. At the end (agents closed: their last
 * reports are in) Redis holds exactly what the agents admitted: nothing
 * lost, nothing applied twice across the moves. A subscriber to all three
 * aggregators' totals sees the key's totals with no gap longer than two
 * intervals and a little slack, and the admissions stay within the synced
 * bound over any span of one period.
 */
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_proxy.h"
#include "partition.h"
#include "redis_server.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define AGGREGATORS 3
#define AGENTS 10
#define LIMIT 200
/* As test_synced_accuracy.c: the bound assumes an agent's I/O thread keeps
 * up with an interval, which under the sanitizers it does at four times
 * the time scale (under AddressSanitizer at twice, totals had come up to
 * 376 ms apart at 100 ms, beside other work on two cores). At four times
 * the worst span reached 209 (ASan, ci18), 210 (TSan, ci20) and over 210
 * (ASan, cluster) of the bound 210 while the agents took the agent count
 * of 0 the restarted aggregator published before its first report as the
 * fleet's size, and each took the whole room when the restart fell while
 * the key had some (211 reproduced, every agent's share the room). Since
 * they keep the count they knew, the shares' rounding is what is left
 * over the limit: 201 to 204 under ASan. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TIME_SCALE 4
#else
#define TIME_SCALE 1
#endif
#define PERIOD_MS (2000 * TIME_SCALE)
#define INTERVAL_MS (100 * TIME_SCALE)
/* The owner of the key is killed 2.5 periods into the traffic and back
 * 10 s later, at any time scale (issue 19's figure: 100 intervals away,
 * 25 under the sanitizers); the traffic goes on 3 periods more, in every
 * build (when the sanitizers killed it at 1.5 periods, the worst span on
 * the cluster reached 209 and 208 of the bound 210 in CI, against 200 to
 * 203 in the runs killed at 2.5). */
#define KILL_AT_MS (5 * PERIOD_MS / 2)
#define PERIODS_AFTER 3
#define DOWN_MS 10000
#define RUN_MS (KILL_AT_MS + DOWN_MS + PERIODS_AFTER * PERIOD_MS)
/* How long the key's totals may pause: the interval the kill falls in and
 * the one its keys move in (the agents' tick), and scheduling slack. */
#define TOTALS_GAP_MAX_MS (2 * INTERVAL_MS + INTERVAL_MS / 2)
/* How long after the owner is back any agent may still send it elsewhere:
 * a redial (below an interval); a ping's answer, which brings the link up
 * once the totals socket is connected too, so at worst the next tick's;
 * the tick after it, which moves the key (the other aggregator's last
 * broadcast of it comes before that tick): under three intervals, and
 * slack. Measured up to 105 ms at 100 ms, 850 ms at 400 ms. The bound is
 * also what catches nng's default redial (a wait below a second, on each
 * of twenty sockets): at a bound of six intervals that mutant survived a
 * CI run, the key back elsewhere for 511 ms. */
#define KEY_BACK_MAX_MS (4 * INTERVAL_MS)

typedef struct admissions {
    uint64_t *at_us;    /* in the order admitted */
    size_t n, cap;
    long offered;
    long failed;        /* checks that did not return RL_OK */
} admissions;

typedef struct traffic {
    rl_agent **agents;
    const char *tenant;
    uint64_t ms;
    admissions a;
} traffic;

/* Twice the limit, round-robin over the agents; no Criterion assertion on
 * this thread. */
static void *offer(void *arg)
{
    traffic *t = arg;
    double rate = 2.0 * LIMIT * 1000 / PERIOD_MS;
    uint64_t start = test_now_us(), end = start + t->ms * 1000;
    double due = (double)start;
    rl_attr attr = {"tenant", t->tenant, strlen(t->tenant)};
    for (long i = 0;; i++) {
        uint64_t now = test_now_us();
        while ((double)now < due) {
            usleep((useconds_t)(due - (double)now));
            now = test_now_us();
        }
        if (now >= end)
            break;
        due += 1e6 / rate;
        t->a.offered++;
        rl_decision d;
        if (rl_check(t->agents[i % AGENTS], &attr, 1, 1, &d) != RL_OK) {
            t->a.failed++;
            continue;
        }
        if (!d.allowed)
            continue;
        if (t->a.n == t->a.cap) {
            size_t cap = t->a.cap ? 2 * t->a.cap : 4096;
            uint64_t *grown = realloc(t->a.at_us, cap * sizeof *grown);
            if (grown == NULL) {
                t->a.failed++;
                break;
            }
            t->a.at_us = grown;
            t->a.cap = cap;
        }
        t->a.at_us[t->a.n++] = now;
    }
    return NULL;
}

/* The most admitted in any span of one period. */
static long worst_span(const admissions *a)
{
    long worst = 0;
    for (size_t i = 0, j = 0; j < a->n; j++) {
        while (a->at_us[j] - a->at_us[i] >= PERIOD_MS * 1000ULL)
            i++;
        if ((long)(j - i + 1) > worst)
            worst = (long)(j - i + 1);
    }
    return worst;
}

/* A subscriber to one aggregator's totals: when the key's totals came
 * from it. */
#define SEEN_MAX 8192

typedef struct watch {
    nng_socket sub;
    const char *rule, *tenant;
    atomic_bool stop;
    uint64_t seen_us[SEEN_MAX];
    size_t n;
} watch;

static bool names_key(const watch *w, nng_msg *m)
{
    const char *body = nng_msg_body(m);
    size_t len = nng_msg_len(m);
    const char *nul = memchr(body, '\0', len);
    rl_wire_msg t;
    const char *why;
    if (nul == NULL
        || rl_wire_decode(nul + 1, len - (size_t)(nul + 1 - body), &t, &why)
               != 0)
        return false;
    bool found = false;
    for (size_t i = 0; i < t.n_entries && !found; i++)
        found = t.entries[i].value.len == strlen(w->tenant)
                && memcmp(t.entries[i].value.ptr, w->tenant,
                          t.entries[i].value.len) == 0;
    rl_wire_msg_free(&t);
    return found;
}

static void *watch_totals(void *arg)
{
    watch *w = arg;
    while (!atomic_load(&w->stop)) {
        nng_msg *m;
        if (nng_recvmsg(w->sub, &m, 0) != 0)
            continue;
        if (names_key(w, m) && w->n < SEEN_MAX)
            w->seen_us[w->n++] = test_now_us();
        nng_msg_free(m);
    }
    return NULL;
}

static void watch_open(watch *w, const test_aggregator *agg, const char *rule,
                       const char *tenant)
{
    w->rule = rule;
    w->tenant = tenant;
    cr_assert_eq(nng_sub0_open(&w->sub), 0);
    nng_socket_set_ms(w->sub, NNG_OPT_RECVTIMEO, 50);
    /* The watch redials within 20 ms, not nng's second: the gaps timed are
     * the aggregators', not its own. */
    nng_socket_set_ms(w->sub, NNG_OPT_RECONNMINT, 10);
    nng_socket_set_ms(w->sub, NNG_OPT_RECONNMAXT, 20);
    char topic[RL_WIRE_NAME_MAX + 2];
    size_t n = rl_wire_topic(rule, topic, sizeof topic);
    cr_assert_eq(nng_socket_set(w->sub, NNG_OPT_SUB_SUBSCRIBE, topic, n), 0);
    cr_assert_eq(nng_dial(w->sub, agg->totals, NULL, NNG_FLAG_NONBLOCK), 0);
}

static int by_time(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The longest time in [from, to] without the key's totals from any of
 * the aggregators; *end is when it ended. */
static uint64_t longest_gap(const watch *w, size_t n, uint64_t from,
                            uint64_t to, uint64_t *end, long *messages)
{
    static uint64_t all[AGGREGATORS * SEEN_MAX];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < w[i].n; j++) {
            if (w[i].seen_us[j] >= from && w[i].seen_us[j] <= to)
                all[k++] = w[i].seen_us[j];
        }
    }
    qsort(all, k, sizeof *all, by_time);
    uint64_t worst = 0, last = from;
    *end = from;
    for (size_t i = 0; i <= k; i++) {
        uint64_t at = i < k ? all[i] : to;
        if (at - last > worst) {
            worst = at - last;
            *end = at;
        }
        last = at;
    }
    *messages = (long)k;
    return worst;
}

/* How many of the key's totals came from w after from. */
static long seen_after(const watch *w, uint64_t from)
{
    long n = 0;
    for (size_t j = 0; j < w->n; j++)
        n += w->seen_us[j] > from;
    return n;
}

/* The last time any aggregator but `owner` published the key, or 0. */
static uint64_t last_elsewhere(const watch *w, size_t n, size_t owner)
{
    uint64_t last = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; i != owner && j < w[i].n; j++)
            last = w[i].seen_us[j] > last ? w[i].seen_us[j] : last;
    }
    return last;
}

/* The key's sub-window counts as seen so far. The hash keeps a period
 * and a little of them (older fields are deleted as it grows, and it
 * expires two periods after its last write), so it is read every quarter
 * period: a sub-window's count is final once Redis's clock has left it
 * (reports are counted in the sub-window they are applied in), and it
 * stays in the hash for a period after that. */
#define FIELDS_MAX 4096

typedef struct windows_seen {
    const char *store, *key;
    uint64_t field[FIELDS_MAX];
    long long count[FIELDS_MAX];
    size_t n;
    bool overflow;
    atomic_bool stop;
} windows_seen;

/* Reads the hash on one server, or on whichever primary of a cluster holds
 * it. */
static void read_windows(windows_seen *ws)
{
    redisContext *c = test_redis_connect_holding(ws->store, ws->key);
    redisReply *r = c != NULL ? redisCommand(c, "HGETALL %s", ws->key) : NULL;
    bool found = r != NULL && r->type == REDIS_REPLY_ARRAY;
    for (size_t f = 0; found && f + 1 < r->elements; f += 2) {
        /* Sub-windows are named by their numbers; the head and sums
         * beside them (m, windows.c) are not counts. */
        const char *name = r->element[f]->str;
        if (name[0] < '0' || name[0] > '9')
            continue;
        uint64_t field = strtoull(name, NULL, 10);
        long long v = atoll(r->element[f + 1]->str);
        size_t k = 0;
        while (k < ws->n && ws->field[k] != field)
            k++;
        if (k == ws->n) {
            if (ws->n == FIELDS_MAX) {
                ws->overflow = true;
                continue;
            }
            ws->field[ws->n] = field;
            ws->count[ws->n++] = 0;
        }
        if (v > ws->count[k])
            ws->count[k] = v;
    }
    freeReplyObject(r);
    redisFree(c);
}

static void *watch_windows(void *arg)
{
    windows_seen *ws = arg;
    while (!atomic_load(&ws->stop)) {
        read_windows(ws);
        test_sleep_ms(PERIOD_MS / 4);
    }
    return NULL;
}

static long long windows_total(const windows_seen *ws)
{
    long long sum = 0;
    for (size_t k = 0; k < ws->n; k++)
        sum += ws->count[k];
    return sum;
}

/* The aggregator of n the tenant's key goes to while all are up. */
static size_t owner_of(const char *rule, const char *tenant, size_t n)
{
    bool up[AGGREGATORS] = {true, true, true};
    return rl_partition_owner(rl_partition_key(rule, tenant, strlen(tenant)),
                              up, n);
}

/* n aggregators on store (NULL: the runner's Redis) with one synced rule,
 * every one with Redis's clock read. */
static void start_ready(test_aggregator *aggs, size_t n, const char *store,
                        const char *rule, long limit, unsigned period_ms)
{
    char rules[200];
    snprintf(rules, sizeof rules, "  - {name: %s, match: tenant, limit: %ld, "
             "period: %ums, mode: synced}\n", rule, limit, period_ms);
    test_aggregators_start(aggs, n, store, rules, INTERVAL_MS);
    for (size_t i = 0; i < n; i++)
        test_aggregator_wait_ready(&aggs[i]);
}

/* store: NULL for the runner's Redis, or a cluster's seeds. */
static void failover(const char *store, const char *rule, const char *label)
{
    const char *tenant = "org_failover";
    test_aggregator aggs[AGGREGATORS];
    start_ready(aggs, AGGREGATORS, store, rule, LIMIT, PERIOD_MS);
    rl_agent *agents[AGENTS];
    rl_config *configs[AGENTS];
    for (int i = 0; i < AGENTS; i++)
        agents[i] = test_synced_agent(&aggs[0], &configs[i]);
    /* The agents know how many they are (presence) before the traffic. */
    test_sleep_ms(8 * INTERVAL_MS);
    size_t owner = owner_of(rule, tenant, AGGREGATORS);
    static watch w[AGGREGATORS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < AGGREGATORS; i++)
        watch_open(&w[i], &aggs[i], rule, tenant);
    uint64_t start = test_now_us();
    char key[128];
    if (store != NULL)
        snprintf(key, sizeof key, "{rl:tenant:%s}:w", tenant);
    else
        snprintf(key, sizeof key, "rl:tenant:%s:w", tenant);
    static windows_seen ws;
    memset(&ws, 0, sizeof ws);
    ws.store = store != NULL ? store : test_env("RL_TEST_REDIS");
    ws.key = key;
    pthread_t watchers[AGGREGATORS], offerer, reader;
    traffic t = {.agents = agents, .tenant = tenant, .ms = RUN_MS};
    pthread_create(&reader, NULL, watch_windows, &ws);
    for (int i = 0; i < AGGREGATORS; i++)
        pthread_create(&watchers[i], NULL, watch_totals, &w[i]);
    pthread_create(&offerer, NULL, offer, &t);
    test_sleep_ms(KILL_AT_MS);
    test_aggregator_kill(&aggs[owner]);
    uint64_t killed_us = test_now_us();
    test_sleep_ms(DOWN_MS);
    test_aggregator_start(&aggs[owner], NULL, NULL, 0, &aggs[owner]);
    /* Back once it answers: its store connected (the agents' pings are
     * answered from then on). */
    test_aggregator_wait_ready(&aggs[owner]);
    uint64_t back_us = test_now_us();
    pthread_join(offerer, NULL);
    uint64_t end_us = test_now_us();
    for (int i = 0; i < AGGREGATORS; i++) {
        atomic_store(&w[i].stop, true);
        pthread_join(watchers[i], NULL);
    }
    /* The gap is measured from half a period in (totals flow then) to the
     * end of the traffic. */
    uint64_t gap_end;
    long messages;
    uint64_t gap = longest_gap(w, AGGREGATORS,
                               start + PERIOD_MS * 1000ULL / 2, end_us,
                               &gap_end, &messages);
    /* Back, the owner has the key again within a few intervals. */
    long owner_back = seen_after(&w[owner], back_us + 3 * INTERVAL_MS * 1000);
    /* And every agent gave it back: no other aggregator publishes it. */
    uint64_t elsewhere = last_elsewhere(w, AGGREGATORS, owner);
    uint64_t lingered = elsewhere > back_us ? elsewhere - back_us : 0;
    /* Closing the agents sends their last reports. */
    for (int i = 0; i < AGENTS; i++) {
        rl_agent_close(agents[i]);
        rl_config_free(configs[i]);
    }
    /* The agents' last reports are in once closed: a last read. */
    atomic_store(&ws.stop, true);
    pthread_join(reader, NULL);
    read_windows(&ws);
    cr_assert_not(ws.overflow);
    long long held = windows_total(&ws);
    long worst = worst_span(&t.a);
    fprintf(stderr, "aggregators%s: aggregator %zu (the key's) killed at "
            "%.1f s, back at %.1f s; offered %ld, admitted %zu, Redis holds "
            "%lld (lost %lld, doubled %lld); worst span of one period %ld "
            "(limit %d, bound %d); key's totals: %ld messages, longest gap "
            "%llu ms ending at %.1f s (interval %d ms, at most %d), %ld "
            "from aggregator %zu once back, elsewhere until %llu ms after\n",
            label,
            owner, (double)(killed_us - start) / 1e6,
            (double)(back_us - start) / 1e6, t.a.offered, t.a.n, held,
            held < (long long)t.a.n ? (long long)t.a.n - held : 0,
            held > (long long)t.a.n ? held - (long long)t.a.n : 0, worst,
            LIMIT, LIMIT * 105 / 100, messages,
            (unsigned long long)(gap / 1000), (double)(gap_end - start) / 1e6,
            INTERVAL_MS, TOTALS_GAP_MAX_MS, owner_back, owner,
            (unsigned long long)(lingered / 1000));
    for (int i = 0; i < AGGREGATORS; i++)
        test_aggregator_stop(&aggs[i]);
    /* Only now: nng 1.5.2 can hang closing a SUB socket a message is
     * arriving on (sync.c). */
    for (int i = 0; i < AGGREGATORS; i++)
        nng_close(w[i].sub);
    cr_assert_eq(t.a.failed, 0, "checks failed");
    cr_expect_eq(held, (long long)t.a.n, "Redis holds %lld, the agents "
                 "admitted %zu", held, t.a.n);
    cr_expect_leq(worst, LIMIT * 105 / 100);
    cr_expect_leq(gap, TOTALS_GAP_MAX_MS * 1000ULL,
                  "the key's totals stopped for %llu ms",
                  (unsigned long long)(gap / 1000));
    /* Totals flowed all along (one message an interval from the owner). */
    cr_expect_geq(messages, (RUN_MS - PERIOD_MS / 2) / INTERVAL_MS / 2);
    /* Every agent redials, pings, hears the owner's totals and gives the
     * key back within a few intervals (nng's default redial alone waits up
     * to a second). */
    cr_expect_leq(lingered, KEY_BACK_MAX_MS * 1000ULL, "the key was still "
                  "published elsewhere %llu ms after aggregator %zu was back",
                  (unsigned long long)(lingered / 1000), owner);
    /* And the key went back to its owner once it was up again. */
    uint64_t after_back = (end_us - back_us) / 1000 - 3 * INTERVAL_MS;
    cr_expect_geq(owner_back, (long)(after_back / INTERVAL_MS / 2),
                  "aggregator %zu, back, published the key %ld times",
                  owner, owner_back);
    free(t.a.at_us);
}

Test(aggregators, the_keys_owner_killed_and_back_loses_and_doubles_nothing)
{
    failover(NULL, "fo", "");
}

Test(aggregators,
     the_keys_owner_killed_and_back_loses_and_doubles_nothing_on_a_cluster)
{
    failover(test_env("RL_TEST_CLUSTER"), "focl", " (cluster)");
}

/* --- A report its aggregator did not answer goes to another, once. ----- */

/* A copy of aggs[0]'s config for the agents, whose first aggregator's
 * reports go through a proxy on proxy_port. */
static void config_through(const test_aggregator *aggs, uint16_t proxy_port,
                           char *path, size_t cap)
{
    char text[8192], proxied[64];
    FILE *f = fopen(aggs[0].config, "r");
    cr_assert_not_null(f);
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    char *at = strstr(text, aggs[0].reports);
    cr_assert_not_null(at);
    snprintf(proxied, sizeof proxied, "tcp://127.0.0.1:%u", proxy_port);
    snprintf(path, cap, "%s.proxied", aggs[0].config);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "%.*s%s%s", (int)(at - text), text, proxied,
            at + strlen(aggs[0].reports));
    fclose(f);
}

static long check_many(rl_agent *a, const char *tenant, int n)
{
    long admitted = 0;
    rl_attr attr = {"tenant", tenant, strlen(tenant)};
    for (int i = 0; i < n; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
        admitted += d.allowed;
    }
    return admitted;
}

/* Two aggregators; the agent reaches the first, the owner of its key,
 * through a proxy that, from the first report naming the key on, stops
 * carrying the answers (applied: the aggregator applies the report, its
 * ack is lost) or everything (it never gets the report). Two intervals
 * later the report goes to the second, the same bytes: it is a duplicate
 * there, or applied there. Either way Redis holds what the agent
 * admitted. */
static void unanswered(const char *rule, bool applied)
{
    char tenant[32], path[600];
    test_aggregator aggs[2];
    start_ready(aggs, 2, NULL, rule, 1000000000, 60000);
    uint16_t port;
    test_proxy *p = test_proxy_start(
        (uint16_t)atoi(strrchr(aggs[0].reports, ':') + 1), &port);
    config_through(aggs, port, path, sizeof path);
    for (int i = 0;; i++) {
        snprintf(tenant, sizeof tenant, "org_%s_%d", rule, i);
        if (owner_of(rule, tenant, 2) == 0)
            break;
    }
    rl_config *cfg;
    rl_agent *a = test_agent_on(path, &cfg, NULL);
    long admitted = check_many(a, tenant, 50);
    test_sleep_ms(5 * INTERVAL_MS);
    cr_assert_geq(test_proxy_accepted(p), 1);
    /* In the next report to the first aggregator, the first to name the
     * key from now on, which goes unanswered (nothing in flight before it
     * does); two intervals on it goes to the second, and so do the key's
     * next counts. */
    test_proxy_silence_from(p, tenant, strlen(tenant), !applied);
    admitted += check_many(a, tenant, 50);
    test_sleep_ms(6 * INTERVAL_MS);
    cr_assert(test_proxy_silenced(p), "no report named the key");
    admitted += check_many(a, tenant, 50);
    test_sleep_ms(3 * INTERVAL_MS);
    rl_agent_close(a);
    rl_config_free(cfg);
    char key[96];
    snprintf(key, sizeof key, "rl:tenant:%s", tenant);
    cr_assert_eq(admitted, 150);
    test_expect_window_total(key, admitted, 5000);
    test_aggregator_stop(&aggs[0]);
    test_aggregator_stop(&aggs[1]);
    test_proxy_stop(p);
    unlink(path);
}

Test(aggregators, a_report_applied_but_not_answered_moves_and_counts_once)
{
    unanswered("unans", true);
}

Test(aggregators, a_report_never_received_moves_and_counts_once)
{
    unanswered("unrec", false);
}

/* --- rlctl agents with several aggregators ------------------------------ */

/* One agent whose two keys go one to each aggregator is one row, listed
 * with both; with one aggregator gone it is named in a warning and the
 * other's agents are still shown. */
Test(aggregators, rlctl_agents_shows_each_agent_with_its_aggregators)
{
    static const char rule[] = "ag";
    char tenant[2][32], out[8192];
    test_aggregator aggs[2];
    start_ready(aggs, 2, NULL, rule, 1000000, 60000);
    for (size_t k = 0; k < 2; k++) {
        for (int i = 0;; i++) {
            snprintf(tenant[k], sizeof tenant[k], "org_ag_%d", i);
            if (owner_of(rule, tenant[k], 2) == k)
                break;
        }
    }
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&aggs[0], &cfg);
    check_many(a, tenant[0], 3);
    check_many(a, tenant[1], 3);
    test_sleep_ms(5 * INTERVAL_MS);
    cr_assert_eq(test_rlctl(out, sizeof out, aggs[0].config, "agents"), 0,
                 "%s", out);
    cr_assert(strstr(out, "AGGREGATORS") != NULL, "%s", out);
    cr_assert(strstr(out, " 0,1\n") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, aggs[0].config, "--json agents"),
                 0, "%s", out);
    cr_assert(strstr(out, "\"aggregators\":[0,1]}]}") != NULL, "%s", out);
    cr_assert_null(strstr(out, "},{"), "one agent, two rows: %s", out);
    test_aggregator_kill(&aggs[1]);
    cr_assert_eq(test_rlctl(out, sizeof out, aggs[0].config, "agents"), 0,
                 "%s", out);
    cr_assert(strstr(out, "warning: cannot reach the aggregator at "
                          "127.0.0.1:") != NULL, "%s", out);
    cr_assert(strstr(out, "(aggregator 1)") != NULL, "%s", out);
    cr_assert(strstr(out, " 0\n") != NULL, "%s", out);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&aggs[0]);
}

/* --- rl-aggregator --index ----------------------------------------------- */

static int run_aggregator(const char *args, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", test_env("RL_TEST_AGGREGATOR"),
             args);
    return test_run(cmd, out, cap);
}

Test(aggregators, index_picks_an_entry_and_is_needed_with_several)
{
    char path[512], out[4096], args[1024];
    snprintf(path, sizeof path, "%s/index-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "aggregators:\n"
               "  - {reports: \"tcp://127.0.0.1:1\", totals: "
               "\"tcp://127.0.0.1:2\"}\n"
               "  - {reports: \"tcp://127.0.0.1:3\", totals: "
               "\"tcp://127.0.0.1:4\"}\n"
               "rules:\n"
               "  - {name: k, match: a, limit: 1, period: 1s, "
               "mode: synced}\n");
    fclose(f);
    snprintf(args, sizeof args, "--check-config --config %s --index 1", path);
    cr_assert_eq(run_aggregator(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "--check-config --config %s", path);
    cr_assert_eq(run_aggregator(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "lists 2 aggregators: say which one this is with "
                          "--index N (0 to 1)") != NULL, "%s", out);
    snprintf(args, sizeof args, "--check-config --config %s --index 2", path);
    cr_assert_eq(run_aggregator(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "--index: must be a whole number from 0 to 1, got "
                          "'2' (") != NULL, "%s", out);
    cr_assert(strstr(out, "lists 2 aggregators, numbered from 0)") != NULL,
              "%s", out);
    unlink(path);
}
