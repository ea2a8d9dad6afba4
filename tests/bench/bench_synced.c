/*
 * bench_synced.c: what a synced check costs on the hot path, against the
 * floor for "count this key" measured in the same binary, built as rl
 * counts; the aggregator's ingest rate in (key, count) pairs per second
 * against pipelined INCRBY on the same Redis; and the sync lag. Run by
 * `make bench` under with-redis; rl-aggregator is started here.
 */
#include "bench_redis.h"
#include "bench_report.h"
#include "bench_stats.h"
#include "keys.h"
#include "rl.h"
#include "thread_slot.h"
#include "wire.h"

#include <hiredis/hiredis.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KEYS 1000
#define FLOOR_KEYS 4096
#define MAX_RUNS 5

static char values[KEYS][16];
static size_t value_lens[KEYS];
static long checks = 2000000; /* per thread per run; fewer in a quick run */
static int runs = MAX_RUNS;

/* The floor: a key counted as rl counts a synced key (synced.h), and
 * nothing else. Per key, a counter for each thread slot and the shared one
 * on the key's own cache lines; a check hashes the value with rl's hash,
 * sums the counters of the slots handed out (rl's own slots: the floor's
 * threads take theirs as rl's do), compares the sum with a mark and adds
 * one to its own slot with a plain load and store. What rl does besides:
 * check its arguments, match rules, probe the table and compare the key,
 * fill the decision, count statistics. */
typedef struct floor_key {
    _Alignas(RL_CACHE_LINE) atomic_uint_least64_t counts[RL_THREAD_SLOTS
                                                         + 1];
} floor_key;
static floor_key floor_keys[FLOOR_KEYS];
static atomic_uint_least64_t floor_mark = UINT64_MAX / 2;

/* arg: the thread's number; threads share every key, starting half a
 * round apart rather than in step. */
static void *floor_count(void *arg)
{
    long from = (long)(intptr_t)arg * KEYS / 2, refused = 0;
    for (long i = from; i < from + checks; i++) {
        uint64_t h = rl_key_hash(1, values[i % KEYS], value_lens[i % KEYS]);
        floor_key *k = &floor_keys[h & (FLOOR_KEYS - 1)];
        unsigned used = atomic_load_explicit(&rl_thread_slots_used,
                                             memory_order_acquire);
        uint64_t n = atomic_load_explicit(&k->counts[RL_THREAD_SLOT_SHARED],
                                          memory_order_relaxed);
        for (unsigned s = 0; s < used; s++)
            n += atomic_load_explicit(&k->counts[s], memory_order_relaxed);
        if (n + 1 > atomic_load_explicit(&floor_mark, memory_order_acquire))
            refused++;
        else
            rl_slot_add(k->counts, rl_thread_slot(), 1);
    }
    if (refused > 0)
        fprintf(stderr, "bench: the floor refused %ld\n", refused);
    return NULL;
}

static rl_agent *agent;

static void *synced(void *arg)
{
    long from = (long)(intptr_t)arg * KEYS / 2, failed = 0;
    for (long i = from; i < from + checks; i++) {
        rl_attr a = {"tenant", values[i % KEYS], value_lens[i % KEYS]};
        rl_decision d;
        if (rl_check(agent, &a, 1, 1, &d) != RL_OK || !d.allowed)
            failed++;
    }
    if (failed > 0)
        fprintf(stderr, "bench: %ld synced checks not allowed\n", failed);
    return NULL;
}

/* ns per call per thread, with threads running fn at once. */
static double ns_per_call(void *(*fn)(void *), int threads)
{
    pthread_t t[2];
    double start = bench_now_s();
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, fn, (void *)(intptr_t)i);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    return (bench_now_s() - start) * 1e9 / (double)checks;
}

static void row(const char *what, const double *v, const char *unit)
{
    bench_summary s = bench_summarize(v, runs);
    printf("| %s | %.1f | %.1f | %.1f | %s |\n", what, s.min, s.median,
           s.max, unit);
}

static void hot_path(const char *config)
{
    rl_config *cfg;
    rl_error err;
    rl_options o = {0};
    if (rl_config_load(config, &cfg, &err) != RL_OK
        || (o.config = cfg, rl_agent_open(&agent, &o, &err)) != RL_OK) {
        fprintf(stderr, "bench: %s\n", err.message);
        exit(1);
    }
    double b1[MAX_RUNS], b2[MAX_RUNS], s1[MAX_RUNS], s2[MAX_RUNS];
    double ratio[MAX_RUNS], ratio2[MAX_RUNS], scale[MAX_RUNS];
    double floor_scale[MAX_RUNS];
    synced(NULL); /* first sightings out of the way */
    for (int r = 0; r < runs; r++) {
        b1[r] = ns_per_call(floor_count, 1);
        b2[r] = ns_per_call(floor_count, 2);
        s1[r] = ns_per_call(synced, 1);
        s2[r] = ns_per_call(synced, 2);
        ratio[r] = s1[r] / b1[r];
        ratio2[r] = s2[r] / b2[r];
        scale[r] = s2[r] / s1[r];
        floor_scale[r] = b2[r] / b1[r];
    }
    printf("## Synced path hot path (%d runs of %ld checks per thread, %d "
           "keys)\n\nThe floor counts a key as rl does (per-thread slots "
           "on the key's own cache lines, the slots in use summed on every "
           "check, a plain store to the thread's own) and does nothing "
           "else.\n\n| figure | min | median | max | unit |\n"
           "|---|---|---|---|---|\n", runs, checks, KEYS);
    row("rl_check, synced rule, 1 thread", s1, "ns per check");
    row("rl_check, synced rule, 2 threads", s2, "ns per check, each thread");
    row("floor: rl's counting alone, 1 thread", b1, "ns");
    row("floor: rl's counting alone, 2 threads", b2, "ns, each thread");
    row("synced check / floor, 1 thread", ratio, "x");
    row("synced check / floor, 2 threads", ratio2, "x");
    row("synced check 2 threads / 1 thread", scale, "x (1.0 = scales)");
    row("floor 2 threads / 1 thread", floor_scale, "x");
    char rl[128], floor[128];
    snprintf(rl, sizeof rl, "`rl_check` %.1f / %.1f",
             bench_summarize(s1, runs).median,
             bench_summarize(s2, runs).median);
    snprintf(floor, sizeof floor, "floor, rl's counting alone: %.1f / %.1f",
             bench_summarize(b1, runs).median,
             bench_summarize(b2, runs).median);
    bench_figure("synced check, ns, 1 thread / 2 threads (each)", rl, floor);
    bench_target("synced hot path, 1 thread, ns per check",
                 bench_summarize(s1, runs).median, "<", 25, "ns");
    rl_agent_close(agent);
    rl_config_free(cfg);
}

static pid_t start_aggregator(const char *bin, const char *config)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl(bin, bin, "--config", config, "--log-level", "error",
              (char *)NULL);
        _exit(127);
    }
    usleep(500 * 1000);
    return pid;
}

#define PAIRS 1000
#define REPORTS 200
#define SENDERS 4

/* One agent's share of the ingest load: its own id and socket, reports
 * of PAIRS pairs sent one at a time, each after the last one's ack, as an
 * agent sends them. */
typedef struct sender {
    const char *url;
    char id[48];
    int reports;
} sender;

static void *send_reports(void *arg)
{
    sender *me = arg;
    nng_socket s;
    nng_req0_open(&s);
    if (nng_dial(s, me->url, NULL, 0) != 0) {
        fprintf(stderr, "bench: cannot reach the aggregator\n");
        exit(1);
    }
    rl_wire_writer *w = rl_wire_writer_new();
    for (int r = 0; r < me->reports; r++) {
        rl_wire_writer_reset(w);
        rl_wire_begin_report(w, me->id, (uint64_t)r + 1, PAIRS);
        for (int i = 0; i < PAIRS; i++)
            rl_wire_put_count(w, "per-tenant", values[i], value_lens[i], 1);
        size_t len;
        const void *data = rl_wire_writer_data(w, &len);
        char *buf;
        size_t size;
        if (nng_send(s, (void *)data, len, 0) != 0
            || nng_recv(s, &buf, &size, NNG_FLAG_ALLOC) != 0)
            exit(1);
        nng_free(buf, size);
    }
    rl_wire_writer_free(w);
    nng_close(s);
    return NULL;
}

/* Pairs per second through the aggregator with SENDERS agents reporting
 * at once over the same keys, as a fleet's agents do: the aggregator has
 * reports in flight to Redis while it decodes and answers others. */
static double ingest_rate(const char *url)
{
    static unsigned run;
    sender senders[SENDERS];
    pthread_t t[SENDERS];
    run++;
    double start = bench_now_s();
    for (int i = 0; i < SENDERS; i++) {
        senders[i] = (sender){.url = url, .reports = REPORTS / SENDERS};
        snprintf(senders[i].id, sizeof senders[i].id, "bench-%u-%d-%d", run,
                 (int)getpid(), i);
        pthread_create(&t[i], NULL, send_reports, &senders[i]);
    }
    for (int i = 0; i < SENDERS; i++)
        pthread_join(t[i], NULL);
    return (double)PAIRS * REPORTS / (bench_now_s() - start);
}

/* The reference: the same pairs as pipelined INCRBY, 1,000 per round trip. */
static double incrby_rate(const char *addr)
{
    redisContext *c = bench_connect(addr);
    double start = bench_now_s();
    for (int r = 0; r < REPORTS; r++) {
        for (int i = 0; i < PAIRS; i++)
            redisAppendCommand(c, "INCRBY bench:%s 1", values[i]);
        for (int i = 0; i < PAIRS; i++) {
            void *reply;
            if (redisGetReply(c, &reply) != REDIS_OK)
                exit(1);
            freeReplyObject(reply);
        }
    }
    double rate = (double)PAIRS * REPORTS / (bench_now_s() - start);
    redisFree(c);
    return rate;
}

#define LAG_SAMPLES 20
#define LAG_TIMEOUT_S 5.0

/* Whether a TOTALS message holds value with a count. */
static bool totals_hold(const char *buf, size_t len, const char *value)
{
    const char *nul = memchr(buf, '\0', len);
    rl_wire_msg m;
    const char *why;
    if (nul == NULL || rl_wire_decode(nul + 1, len - (size_t)(nul + 1 - buf),
                                      &m, &why) != 0)
        return false;
    bool found = false;
    for (size_t i = 0; i < m.n_entries && !found; i++)
        found = m.entries[i].value.len == strlen(value)
                && memcmp(m.entries[i].value.ptr, value,
                          m.entries[i].value.len) == 0
                && m.entries[i].current > 0;
    rl_wire_msg_free(&m);
    return found;
}

/* From a count in one agent to the totals another agent hears (this
 * program's SUB socket stands for the other agent). */
static void sync_lag(const char *config, const char *totals_url)
{
    rl_config *cfg;
    rl_error err;
    rl_options o = {0};
    if (rl_config_load(config, &cfg, &err) != RL_OK
        || (o.config = cfg, rl_agent_open(&agent, &o, &err)) != RL_OK)
        exit(1);
    nng_socket sub;
    nng_sub0_open(&sub);
    nng_socket_set(sub, NNG_OPT_SUB_SUBSCRIBE, "per-tenant", 11);
    nng_socket_set_ms(sub, NNG_OPT_RECVTIMEO, 500);
    nng_dial(sub, totals_url, NULL, 0);
    double lag[LAG_SAMPLES];
    int n = 0, timeouts = 0, samples = bench_quick() ? 3 : LAG_SAMPLES;
    for (int i = 0; i < samples; i++) {
        char value[32];
        snprintf(value, sizeof value, "lag_%d_%d", i, (int)getpid());
        rl_attr a = {"tenant", value, strlen(value)};
        rl_decision d;
        double start = bench_now_s();
        rl_check(agent, &a, 1, 1, &d);
        /* Totals of other keys keep coming: the deadline is the sample's. */
        bool seen = false;
        while (!seen && bench_now_s() < start + LAG_TIMEOUT_S) {
            char *buf;
            size_t size;
            if (nng_recv(sub, &buf, &size, NNG_FLAG_ALLOC) != 0)
                continue;
            seen = totals_hold(buf, size, value);
            nng_free(buf, size);
        }
        if (seen)
            lag[n++] = (bench_now_s() - start) * 1000;
        else
            timeouts++;
    }
    nng_close(sub);
    rl_agent_close(agent);
    rl_config_free(cfg);
    qsort(lag, (size_t)n, sizeof lag[0], bench_cmp_double);
    double p50 = n ? lag[n / 2] : 0.0;
    double p99 = n ? lag[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] : 0.0;
    printf("\n## Sync lag (%d samples, sync_interval_ms 1000)\n\n"
           "| figure | p50 | p99 | unit | samples not heard within %.0f s "
           "|\n|---|---|---|---|---|\n"
           "| a count in one agent to the totals another hears | %.0f | %.0f "
           "| ms (of the samples heard) | %d |\n", samples, LAG_TIMEOUT_S,
           p50, p99, timeouts);
    char rl[128], others[64];
    snprintf(rl, sizeof rl, "p50 %s ms, p99 %s ms; %d of %d samples not "
             "heard within %.0f s", bench_int(p50), bench_int(p99), timeouts,
             samples, LAG_TIMEOUT_S);
    snprintf(others, sizeof others, "interval 1,000 ms");
    bench_figure("sync lag, one agent's count to the totals another hears",
                 rl, others);
}

int main(int argc, char **argv)
{
    const char *addr = getenv("RL_TEST_REDIS");
    const char *tmp = getenv("RL_TEST_TMPDIR");
    if (addr == NULL || tmp == NULL || argc < 2) {
        fprintf(stderr, "bench: run through `make bench`\n");
        return 1;
    }
    if (bench_quick()) {
        checks = 200000;
        runs = 3;
    }
    for (int i = 0; i < KEYS; i++)
        value_lens[i] = (size_t)snprintf(values[i], sizeof values[i],
                                         "org_%d", i);
    char config[512];
    snprintf(config, sizeof config, "%s/bench-synced.yaml", tmp);
    FILE *f = fopen(config, "w");
    fprintf(f, "store: {url: \"redis://%s\"}\n"
               "aggregator: {reports: \"tcp://127.0.0.1:%d\", "
               "totals: \"tcp://127.0.0.1:%d\"}\n"
               "rules:\n  - {name: per-tenant, match: tenant, "
               "limit: 1000000000000, period: 1s, mode: synced}\n",
            addr, 20000 + getpid() % 20000, 40000 + getpid() % 20000);
    fclose(f);
    hot_path(config);

    pid_t agg = start_aggregator(argv[1], config);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", 20000 + getpid() % 20000);
    double in[MAX_RUNS], ref[MAX_RUNS], ratio[MAX_RUNS];
    for (int r = 0; r < runs; r++) {
        in[r] = ingest_rate(url);
        ref[r] = incrby_rate(addr);
        ratio[r] = in[r] / ref[r];
    }
    char totals_url[64];
    snprintf(totals_url, sizeof totals_url, "tcp://127.0.0.1:%d",
             40000 + getpid() % 20000);
    sync_lag(config, totals_url);
    kill(agg, SIGTERM);
    waitpid(agg, NULL, 0);
    printf("\n## Aggregator ingest (%d reports of %d pairs from %d agents at "
           "once, %d runs)\n\n"
           "| figure | min | median | max | unit |\n|---|---|---|---|---|\n",
           REPORTS, PAIRS, SENDERS, runs);
    row("rl-aggregator ingest", in, "(key, count) pairs per second");
    row("reference: pipelined INCRBY, 1,000 per round trip", ref,
        "pairs per second");
    bench_summary rs = bench_summarize(ratio, runs);
    printf("| ingest / INCRBY | %.2f | %.2f | %.2f | x |\n", rs.min,
           rs.median, rs.max);
    char rl[64], others[128];
    snprintf(rl, sizeof rl, "%s (key, count) pairs/s",
             bench_int(bench_summarize(in, runs).median));
    snprintf(others, sizeof others, "pipelined `INCRBY`: %s pairs/s "
             "(%.2f×)", bench_int(bench_summarize(ref, runs).median),
             rs.median);
    bench_figure("rl-aggregator ingest", rl, others);
    bench_target("rl-aggregator ingest / pipelined `INCRBY` on the same "
                 "Redis, pairs per second", rs.median, ">=", 0.5, "x");
    return 0;
}
