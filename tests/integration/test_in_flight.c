/*
 * in_flight rules (issue 31): at most N requests of a key at once across
 * the fleet, as slots in one Redis hash per key, a field per agent. Ten
 * agents never hold more than N at once, sampled where the requests are
 * served and in Redis, and come near N; nothing stays held after the
 * load; a gateway killed with SIGKILL frees its slots within the lease,
 * and not before its last renewal's lease; a request longer than the
 * lease keeps its slot; a rejected request and an expired hold give
 * theirs back at once; a plain check takes none. On a Redis Cluster
 * (the runner's), the same bounds hold over keys of several slots, and a
 * renewal is one call per slot, one write per primary.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"
#include "test_process.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The key of value under the rules' match: api_key. */
static void key_of(char key[96], const char *value)
{
    snprintf(key, 96, "rl:in_flight:key:%s", value);
}

/* A value no earlier run of the suite used (the test Redis is shared),
 * and its key under the rules' match: api_key. */
static void fresh(char value[64], char key[96], const char *what)
{
    snprintf(value, 64, "%s-%llu", what, (unsigned long long)test_now_us());
    key_of(key, value);
}

/* An agent on the store at addr (host:port, or a cluster's seeds
 * separated by commas) with top (top-level YAML lines, may be "") and
 * rules. */
static rl_agent *open_agent_on(const char *addr, rl_config **cfg,
                               const char *top, const char *rules)
{
    char yaml[2048];
    int n = snprintf(yaml, sizeof yaml,
                     strchr(addr, ',') != NULL
                         ? "store: {cluster: [%s], timeout_ms: 1000}\n"
                           "%srules:\n%s"
                         : "store:\n  url: redis://%s\n  timeout_ms: 1000\n"
                           "%srules:\n%s", addr, top, rules);
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", cfg, &err),
                 RL_OK, "%s", err.message);
    rl_options o = {.config = *cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    return a;
}

/* The same on the shared test Redis. */
static rl_agent *open_agent(rl_config **cfg, const char *top,
                            const char *rules)
{
    return open_agent_on(test_env("RL_TEST_REDIS"), cfg, top, rules);
}

static void close_agent(rl_agent *a, rl_config *cfg)
{
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* One hold's decision, waited for. */
typedef struct held {
    sem_t done;
    rl_decision decision;
    rl_hold *hold;
    atomic_int *serving, *peak; /* counted from the callback, if set */
} held;

static void note_peak(atomic_int *peak, int now)
{
    for (int p = atomic_load(peak);
         now > p && !atomic_compare_exchange_weak(peak, &p, now);)
        ;
}

static void on_held(const rl_decision *d, rl_hold *hold, void *arg)
{
    held *h = arg;
    h->decision = *d;
    h->hold = hold;
    if (hold != NULL && h->serving != NULL)
        note_peak(h->peak, atomic_fetch_add(h->serving, 1) + 1);
    sem_post(&h->done);
}

/* rl_check_hold of api_key value, waited for: the hold, or NULL. */
static rl_hold *hold_counted(rl_agent *a, const char *value,
                             atomic_int *serving, atomic_int *peak,
                             rl_decision *d)
{
    held h = {.serving = serving, .peak = peak};
    sem_init(&h.done, 0, 0);
    rl_attr attr = {"api_key", value, strlen(value)};
    cr_assert_eq(rl_check_hold(a, &attr, 1, 1, on_held, &h), RL_OK);
    while (sem_wait(&h.done) != 0)
        ;
    sem_destroy(&h.done);
    if (d != NULL)
        *d = h.decision;
    return h.hold;
}

static rl_hold *hold_of(rl_agent *a, const char *value)
{
    return hold_counted(a, value, NULL, NULL, NULL);
}

/* The slots held in key's hash, live fields summed; -1 when a field is
 * not "COUNT EXPIRY". */
static long long slots_in_redis(redisContext *c, const char *key)
{
    redisReply *r = test_redis_command(c, "HGETALL %s", key);
    uint64_t now = test_redis_time_ms(c);
    long long sum = 0;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        unsigned long long count, expiry;
        if (sscanf(r->element[i + 1]->str, "%llu %llu", &count, &expiry)
            != 2) {
            sum = -1;
            break;
        }
        if (expiry > now)
            sum += (long long)count;
    }
    freeReplyObject(r);
    return sum;
}

/* Whether key is on the store at addr (as open_agent_on's). */
static bool key_exists_on(const char *addr, const char *key)
{
    redisContext *c = test_redis_connect_holding(addr, key);
    cr_assert_not_null(c, "no node of %s serves %s", addr, key);
    redisReply *r = test_redis_command(c, "EXISTS %s", key);
    bool exists = r->integer != 0;
    freeReplyObject(r);
    redisFree(c);
    return exists;
}

static bool key_exists(const char *key)
{
    return key_exists_on(test_env("RL_TEST_REDIS"), key);
}

/* Waits up to timeout_ms for key to be gone from the store at addr
 * (every slot let go). */
static bool gone_from_within(const char *addr, const char *key,
                             int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 5) {
        if (!key_exists_on(addr, key))
            return true;
        test_sleep_ms(5);
    }
    return !key_exists_on(addr, key);
}

static bool gone_within(const char *key, int timeout_ms)
{
    return gone_from_within(test_env("RL_TEST_REDIS"), key, timeout_ms);
}

/* --- The fleet: ten agents, in_flight: 20 ---------------------------- */

#define AGENTS 10
#define N 20
#define CLIENTS_PER_AGENT 4 /* 40 wanted at once: twice N */
#define SERVE_MS 200
#define RUN_MS 2000

typedef struct client {
    rl_agent *agent;
    const char *value;
    atomic_int *serving, *peak;
    atomic_bool *stop;
    int served, refused;
} client;

/* Each client wants one request in flight all the time: a request is
 * served 200 ms; a refused one tries again 200 ms later, so the fleet
 * offers twice what N admits. */
static void *serve_requests(void *arg)
{
    client *c = arg;
    while (!atomic_load(c->stop)) {
        rl_decision d;
        rl_hold *h = hold_counted(c->agent, c->value, c->serving, c->peak,
                                  &d);
        cr_assert(!d.degraded, "the store did not answer");
        if (h == NULL) {
            c->refused++;
            test_sleep_ms(SERVE_MS);
            continue;
        }
        c->served++;
        test_sleep_ms(SERVE_MS);
        atomic_fetch_sub(c->serving, 1);
        cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    }
    return NULL;
}

typedef struct sampler {
    const char *key;
    atomic_bool *stop;
    atomic_int *serving;
    long long redis_peak;
    long long samples, serving_sum;
} sampler;

/* Every 10 ms: the slots Redis holds, and the requests being served. */
static void *sample(void *arg)
{
    sampler *s = arg;
    redisContext *c = test_redis_connect(NULL);
    while (!atomic_load(s->stop)) {
        long long slots = slots_in_redis(c, s->key);
        if (slots > s->redis_peak || slots < 0)
            s->redis_peak = slots < 0 ? 1000000 : slots;
        s->serving_sum += atomic_load(s->serving);
        s->samples++;
        test_sleep_ms(10);
    }
    redisFree(c);
    return NULL;
}

Test(in_flight, ten_agents_hold_at_most_n_at_once)
{
    char value[64], key[96];
    fresh(value, key, "fleet");
    rl_agent *agents[AGENTS];
    rl_config *cfgs[AGENTS];
    for (int i = 0; i < AGENTS; i++)
        agents[i] = open_agent(&cfgs[i], "in_flight_lease_ms: 1000\n",
                               "  - {name: f, match: api_key, "
                               "in_flight: 20}\n");
    atomic_int serving = 0, peak = 0;
    atomic_bool stop = false;
    client clients[AGENTS * CLIENTS_PER_AGENT];
    pthread_t threads[AGENTS * CLIENTS_PER_AGENT];
    sampler s = {key, &stop, &serving, 0, 0, 0};
    pthread_t sampler_thread;
    cr_assert_eq(pthread_create(&sampler_thread, NULL, sample, &s), 0);
    for (int i = 0; i < AGENTS * CLIENTS_PER_AGENT; i++) {
        clients[i] = (client){agents[i / CLIENTS_PER_AGENT], value,
                              &serving, &peak, &stop, 0, 0};
        cr_assert_eq(pthread_create(&threads[i], NULL, serve_requests,
                                    &clients[i]), 0);
    }
    test_sleep_ms(RUN_MS);
    atomic_store(&stop, true);
    int served = 0, refused = 0;
    for (int i = 0; i < AGENTS * CLIENTS_PER_AGENT; i++) {
        pthread_join(threads[i], NULL);
        served += clients[i].served;
        refused += clients[i].refused;
    }
    pthread_join(sampler_thread, NULL);
    double mean = (double)s.serving_sum / (double)s.samples;
    fprintf(stderr, "in_flight fleet: %d served, %d refused, at most %d "
            "served at once (Redis: %lld), %.1f on average\n", served,
            refused, atomic_load(&peak), s.redis_peak, mean);
    cr_assert_leq(atomic_load(&peak), N, "%d requests served at once",
                  atomic_load(&peak));
    cr_assert_leq(s.redis_peak, N, "Redis held %lld slots", s.redis_peak);
    cr_assert_gt(refused, 0, "the load never reached N");
    /* The fleet comes near N: a slot freed is written in the agent's
     * next loop turn, and a refused client waits 200 ms to try again. */
    cr_assert_geq(atomic_load(&peak), N - 1, "at most %d at once",
                  atomic_load(&peak));
    cr_assert_geq(mean, 0.7 * N, "%.1f at once on average", mean);
    cr_assert(gone_within(key, 500), "slots left held after the load");
    for (int i = 0; i < AGENTS; i++)
        close_agent(agents[i], cfgs[i]);
}

/* --- A gateway killed holding slots --------------------------------- */

/* The holder renews every 250 ms with a lease of 1000 ms: killed, its
 * slots stay at least until 750 ms after the kill (its last renewal's
 * lease) and are free 1000 ms after it at most. */
Test(in_flight, a_killed_gateways_slots_are_free_within_the_lease)
{
    char value[64], key[96], log[512], count[8];
    fresh(value, key, "killed");
    test_log_path(log, sizeof log, "in-flight-holder");
    snprintf(count, sizeof count, "%d", 3);
    char *argv[] = {(char *)test_env("RL_TEST_HOLDER"),
                    (char *)test_env("RL_TEST_REDIS"), value, "3", count,
                    "1000", NULL};
    pid_t pid = test_spawn(argv, log);
    test_wait_for_log(&pid, log, "held 3", 5000);
    /* Past a renewal or two: the fields are the renewals', not the
     * takes'. */
    test_sleep_ms(600);
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "in_flight_lease_ms: 1000\n",
                             "  - {name: f, match: api_key, "
                             "in_flight: 3}\n");
    cr_assert_null(hold_of(a, value), "a slot was free while the holder "
                   "lived");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    uint64_t killed = test_now_us();
    test_sleep_ms(600);
    cr_assert_null(hold_of(a, value), "the dead gateway's slots went "
                   "before its last renewal's lease");
    rl_hold *h = NULL;
    while (h == NULL && test_now_us() - killed < 2000000) {
        test_sleep_ms(20);
        h = hold_of(a, value);
    }
    uint64_t free_ms = (test_now_us() - killed) / 1000;
    fprintf(stderr, "in_flight: a killed gateway's slots free after %llu "
            "ms (lease 1000)\n", (unsigned long long)free_ms);
    cr_assert_not_null(h, "the dead gateway's slots were kept");
    cr_assert_leq(free_ms, 1000 + 60, "free after %llu ms",
                  (unsigned long long)free_ms);
    cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    close_agent(a, cfg);
}

/* --- A long request keeps its slot ----------------------------------- */

/* in_flight: 1 with a lease of 1000 ms: a request of 3 s keeps its slot
 * (its agent renews it), so another agent is refused throughout. */
Test(in_flight, a_request_longer_than_the_lease_keeps_its_slot)
{
    char value[64], key[96];
    fresh(value, key, "long");
    const char *rules = "  - {name: f, match: api_key, in_flight: 1}\n";
    rl_config *cfg_a, *cfg_b;
    rl_agent *a = open_agent(&cfg_a, "in_flight_lease_ms: 1000\n", rules);
    rl_agent *b = open_agent(&cfg_b, "in_flight_lease_ms: 1000\n", rules);
    rl_hold *h = hold_of(a, value);
    cr_assert_not_null(h);
    uint64_t start = test_now_us();
    while (test_now_us() - start < 3000000) {
        rl_hold *other = hold_of(b, value);
        cr_assert_null(other, "another agent took the slot after %llu ms",
                       (unsigned long long)(test_now_us() - start) / 1000);
        test_sleep_ms(100);
    }
    cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    rl_hold *next = NULL;
    for (int i = 0; i < 40 && next == NULL; i++) {
        test_sleep_ms(5);
        next = hold_of(b, value);
    }
    cr_assert_not_null(next, "the slot was not let go at the end");
    cr_assert_eq(rl_hold_end(next, 1), RL_OK);
    close_agent(a, cfg_a);
    close_agent(b, cfg_b);
}

/* Agents with leases of their own: one of 10 s holds a slot (renewed
 * every 2.5 s); one of 1 s takes and lets go of another. Its write must
 * not shorten the hash's expiry to its own 1.25 s, or the hash, the long
 * lease's live field with it, would expire before that agent's next
 * renewal. */
Test(in_flight, a_shorter_lease_keeps_the_longer_leases_slots)
{
    char value[64], key[96];
    fresh(value, key, "leases");
    const char *rules = "  - {name: f, match: api_key, in_flight: 2}\n";
    rl_config *cfg_long, *cfg_short;
    rl_agent *slow = open_agent(&cfg_long, "in_flight_lease_ms: 10000\n",
                                rules);
    rl_agent *fast = open_agent(&cfg_short, "in_flight_lease_ms: 1000\n",
                                rules);
    rl_hold *kept = hold_of(slow, value);
    cr_assert_not_null(kept);
    rl_hold *brief = hold_of(fast, value);
    cr_assert_not_null(brief);
    cr_assert_eq(rl_hold_end(brief, 1), RL_OK);
    test_sleep_ms(1400);
    redisContext *c = test_redis_connect(NULL);
    cr_assert_eq(slots_in_redis(c, key), 1, "the long lease's slot went "
                 "with the short lease's expiry");
    redisFree(c);
    rl_hold *one = hold_of(fast, value);
    cr_assert_not_null(one);
    cr_assert_null(hold_of(fast, value), "a third slot of two was taken");
    cr_assert_eq(rl_hold_end(one, 1), RL_OK);
    cr_assert_eq(rl_hold_end(kept, 1), RL_OK);
    close_agent(slow, cfg_long);
    close_agent(fast, cfg_short);
}

/* A reload of the agent opened by open_agent onto rules (its store the
 * test Redis's); the agent owns the new config. */
static void reload_rules(rl_agent *a, const char *rules)
{
    char yaml[1024];
    int n = snprintf(yaml, sizeof yaml, "store:\n  url: redis://%s\n"
                     "  timeout_ms: 1000\nrules:\n%s",
                     test_env("RL_TEST_REDIS"), rules);
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", &cfg, &err),
                 RL_OK, "%s", err.message);
    cr_assert_eq(rl_agent_reload_config(a, cfg, &err), RL_OK, "%s",
                 err.message);
}

/* A rule reloaded from exact to in_flight and back, by the same default
 * prefix: its slots are a hash, its buckets a string, and each must not
 * find the other's key (Redis's WRONGTYPE: a degraded answer until the
 * key expired). With a slot held across the reload back, and a bucket
 * spent before the one to in_flight. */
Test(in_flight, a_reload_between_exact_and_in_flight_keeps_answering)
{
    char value[64], key[96];
    fresh(value, key, "kind");
    static const char exact[] =
        "  - {name: f, match: api_key, limit: 100, period: 1h}\n";
    static const char slots[] =
        "  - {name: f, match: api_key, in_flight: 1}\n";
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "", exact);
    rl_attr attr = {"api_key", value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    cr_assert(d.allowed && !d.degraded);
    reload_rules(a, slots);
    rl_hold *h = hold_counted(a, value, NULL, NULL, &d);
    cr_assert_not_null(h, "the in_flight rule refused: %s",
                       d.degraded ? "degraded" : "rejected");
    cr_assert(!d.degraded, "the in_flight rule found the bucket's key");
    reload_rules(a, exact);
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    cr_assert(d.allowed && !d.degraded, "the exact rule found the slots' "
              "key");
    cr_assert_eq(d.remaining, 98, "the bucket was not the same");
    cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    close_agent(a, cfg);
}

/* A given key_prefix is the user's: a reload that would turn its keys
 * from buckets to slots is refused, saying why, and the old rule stays. */
Test(in_flight, a_reload_that_gives_a_buckets_prefix_to_slots_is_refused)
{
    char value[64], key[96], yaml[1024];
    fresh(value, key, "kind-given");
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "", "  - {name: f, match: api_key, "
                             "limit: 100, period: 1h, key_prefix: \"t:k:\"}\n");
    int n = snprintf(yaml, sizeof yaml, "store:\n  url: redis://%s\n"
                     "rules:\n  - {name: g, match: api_key, in_flight: 1, "
                     "key_prefix: \"t:k:\"}\n", test_env("RL_TEST_REDIS"));
    rl_config *next;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", &next, &err),
                 RL_OK, "%s", err.message);
    cr_assert_eq(rl_agent_reload_config(a, next, &err), RL_ECONFIG);
    cr_assert_str_eq(err.message, "rl_agent_reload: rule \"g\" (in_flight) "
                     "would use key_prefix 't:k:' of rule \"f\" (exact): "
                     "the in_flight slots and the buckets under it are keys "
                     "of two kinds, and each would meet the other's; give it "
                     "another key_prefix, or remove the rule and add it back "
                     "once its keys have expired");
    rl_config_free(next);
    rl_attr attr = {"api_key", value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    cr_assert(d.allowed && !d.degraded);
    cr_assert_str_eq(d.rule, "f");
    close_agent(a, cfg);
}

/* --- Rejection and expiry give slots back ---------------------------- */

/* Two rules: in_flight: 1 per api_key, 1 an hour per ip. A request the
 * ip rule rejects took the api_key's slot in the same call; it is let go
 * at once, so a request from another ip passes. */
Test(in_flight, a_rejected_request_releases_its_slot_at_once)
{
    char value[64], key[96];
    fresh(value, key, "rejected");
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "",
                             "  - {name: f, match: api_key, in_flight: 1}\n"
                             "  - {name: r, match: ip, limit: 1, "
                             "period: 1h}\n");
    rl_attr attrs[2] = {{"api_key", value, strlen(value)},
                        {"ip", value, strlen(value)}};
    held h = {0};
    sem_init(&h.done, 0, 0);
    cr_assert_eq(rl_check_hold(a, attrs, 2, 1, on_held, &h), RL_OK);
    while (sem_wait(&h.done) != 0)
        ;
    cr_assert_not_null(h.hold);
    cr_assert_eq(rl_hold_end(h.hold, 1), RL_OK);
    cr_assert(gone_within(key, 200));
    /* The ip's hour is spent: rejected by r, allowed by f. */
    cr_assert_eq(rl_check_hold(a, attrs, 2, 1, on_held, &h), RL_OK);
    while (sem_wait(&h.done) != 0)
        ;
    cr_assert_null(h.hold);
    cr_assert_str_eq(h.decision.rule, "r");
    cr_assert(gone_within(key, 50), "the rejected request kept its slot");
    char other[80];
    snprintf(other, sizeof other, "%s-other", value);
    rl_attr from_other[2] = {attrs[0], {"ip", other, strlen(other)}};
    cr_assert_eq(rl_check_hold(a, from_other, 2, 1, on_held, &h), RL_OK);
    while (sem_wait(&h.done) != 0)
        ;
    cr_assert_not_null(h.hold, "refused by %s", h.decision.rule);
    cr_assert_eq(rl_hold_end(h.hold, 1), RL_OK);
    sem_destroy(&h.done);
    close_agent(a, cfg);
}

/* A hold never ended: hold_timeout_ms (1 s) ends it, and its slot is let
 * go then, not a lease later. */
Test(in_flight, an_expired_hold_releases_its_slot)
{
    char value[64], key[96];
    fresh(value, key, "expired");
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "hold_timeout_ms: 1000\n"
                             "in_flight_lease_ms: 10000\n",
                             "  - {name: f, match: api_key, in_flight: 1}\n");
    rl_hold *h = hold_of(a, value);
    cr_assert_not_null(h);
    uint64_t start = test_now_us();
    test_sleep_ms(800);
    cr_assert_null(hold_of(a, value), "the slot went before the hold "
                   "expired");
    rl_hold *next = NULL;
    while (next == NULL && test_now_us() - start < 2000000) {
        test_sleep_ms(20);
        next = hold_of(a, value);
    }
    cr_assert_not_null(next, "the expired hold kept its slot");
    cr_assert_leq((test_now_us() - start) / 1000, 1200);
    cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    cr_assert_eq(rl_hold_end(next, 1), RL_OK);
    close_agent(a, cfg);
}

/* --- Plain checks and the close -------------------------------------- */

/* rl_check takes no slot: it says whether one is free. */
Test(in_flight, a_plain_check_takes_no_slot)
{
    char value[64], key[96];
    fresh(value, key, "plain");
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "",
                             "  - {name: f, match: api_key, in_flight: 1}\n");
    rl_attr attr = {"api_key", value, strlen(value)};
    rl_decision d;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
        cr_assert(d.allowed && !d.degraded);
    }
    cr_assert(!key_exists(key), "a plain check took a slot");
    rl_hold *h = hold_of(a, value);
    cr_assert_not_null(h);
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    cr_assert(!d.allowed, "a plain check passed with the slot held");
    cr_assert_str_eq(d.rule, "f");
    cr_assert_eq(d.limit, 1);
    cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    close_agent(a, cfg);
}

/* A close lets go of every slot its agent holds, in its last calls. */
Test(in_flight, close_releases_every_slot)
{
    char value[64], key[96];
    fresh(value, key, "close");
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "",
                             "  - {name: f, match: api_key, in_flight: 5}\n");
    rl_hold *h[3];
    for (int i = 0; i < 3; i++)
        cr_assert_not_null(h[i] = hold_of(a, value));
    redisContext *c = test_redis_connect(NULL);
    cr_assert_eq(slots_in_redis(c, key), 3);
    redisFree(c);
    close_agent(a, cfg);
    cr_assert(!key_exists(key), "the close left slots held");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(rl_hold_end(h[i], 1), RL_OK);
}

/* An override gives its own N. */
Test(in_flight, an_override_gives_its_own_n)
{
    char value[64], key[96], rules[256];
    fresh(value, key, "override");
    snprintf(rules, sizeof rules,
             "  - {name: f, match: api_key, in_flight: 1, overrides: "
             "[{values: [%s], in_flight: 2}]}\n", value);
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "", rules);
    rl_hold *h1 = hold_of(a, value), *h2 = hold_of(a, value);
    cr_assert_not_null(h1);
    cr_assert_not_null(h2, "the override's N was not applied");
    cr_assert_null(hold_of(a, value));
    cr_assert_eq(rl_hold_end(h1, 1), RL_OK);
    cr_assert_eq(rl_hold_end(h2, 1), RL_OK);
    close_agent(a, cfg);
}

/* A shadow rule takes its slot and never rejects: the second hold of
 * in_flight: 1 passes, counted as one the rule would have rejected. */
Test(in_flight, a_shadow_rule_takes_slots_and_never_rejects)
{
    char value[64], key[96];
    fresh(value, key, "shadow");
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "",
                             "  - {name: f, match: api_key, in_flight: 1, "
                             "shadow: true}\n");
    rl_hold *h1 = hold_of(a, value);
    rl_decision d;
    rl_hold *h2 = hold_counted(a, value, NULL, NULL, &d);
    cr_assert_not_null(h1);
    cr_assert_not_null(h2, "a shadow rule rejected");
    cr_assert_eq(d.shadow_rejected, 1);
    redisContext *c = test_redis_connect(NULL);
    cr_assert_eq(slots_in_redis(c, key), 1);
    redisFree(c);
    cr_assert_eq(rl_hold_end(h1, 1), RL_OK);
    cr_assert_eq(rl_hold_end(h2, 1), RL_OK);
    close_agent(a, cfg);
}

/* With the store away, on_error: local admits this agent's share at
 * once, ceil(5 / 2) = 3, counted in the agent: a slot ended is free
 * again; deny admits none, allow all. */
Test(in_flight, on_error_decides_while_the_store_is_away)
{
    char yaml[512];
    const char *policy[] = {"local", "deny", "allow"};
    int want[] = {3, 0, 6};
    for (int p = 0; p < 3; p++) {
        int n = snprintf(yaml, sizeof yaml,
                         "store:\n  url: redis://127.0.0.1:1\n"
                         "  timeout_ms: 50\nfleet_size: 2\nrules:\n"
                         "  - {name: f, match: api_key, in_flight: 5, "
                         "on_error: %s}\n", policy[p]);
        rl_config *cfg;
        rl_error err;
        cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", &cfg, &err),
                     RL_OK, "%s", err.message);
        rl_options o = {.config = cfg};
        rl_agent *a;
        cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
        rl_hold *h[6];
        int admitted = 0;
        for (int i = 0; i < 6; i++) {
            rl_decision d;
            h[i] = hold_counted(a, "away", NULL, NULL, &d);
            cr_assert(d.degraded);
            admitted += h[i] != NULL;
        }
        cr_assert_eq(admitted, want[p], "on_error: %s admitted %d of 6",
                     policy[p], admitted);
        if (p == 0) {
            cr_assert_eq(rl_hold_end(h[0], 1), RL_OK);
            rl_hold *again = NULL;
            for (int i = 0; i < 40 && again == NULL; i++) {
                test_sleep_ms(5);
                again = hold_of(a, "away");
            }
            cr_assert_not_null(again, "an ended hold's local slot stayed");
            h[0] = again;
        }
        for (int i = 0; i < 6; i++) {
            if (h[i] != NULL)
                cr_assert_eq(rl_hold_end(h[i], 1), RL_OK);
        }
        rl_agent_close(a);
        rl_config_free(cfg);
    }
}

/* --- Config ----------------------------------------------------------- */

static void refused(const char *top, const char *rule, const char *want)
{
    char yaml[512];
    int n = snprintf(yaml, sizeof yaml,
                     "store:\n  url: redis://127.0.0.1:1\n%srules:\n%s", top,
                     rule);
    rl_config *cfg = NULL;
    rl_error err;
    cr_assert_neq(rl_config_parse(yaml, (size_t)n, "<test>", &cfg, &err),
                  RL_OK, "taken: %s%s", top, rule);
    cr_assert(strstr(err.message, want) != NULL, "%s", err.message);
}

Test(in_flight, what_cannot_apply_is_refused)
{
    const char *f = "  - {name: f, match: k, in_flight: 3";
    char rule[160];
    const char *extra[] = {"limit: 1", "period: 1s", "burst: 2",
                           "algorithm: gcra"};
    const char *field[] = {"limit", "period", "burst", "algorithm"};
    for (int i = 0; i < 4; i++) {
        snprintf(rule, sizeof rule, "%s, %s}\n", f, extra[i]);
        refused("", rule, field[i]);
    }
    snprintf(rule, sizeof rule, "%s, mode: exact}\n", f);
    refused("", rule, "mode");
    refused("", "  - {name: f, match: k, mode: in_flight}\n",
            "needs in_flight");
    snprintf(rule, sizeof rule, "%s, overrides: [{values: [a], limit: 2}]}"
             "\n", f);
    refused("", rule, "limit");
    refused("", "  - {name: f, match: k, limit: 1, period: 1s, overrides: "
            "[{values: [a], in_flight: 2}]}\n", "in_flight");
    snprintf(rule, sizeof rule, "%s}\n", f);
    refused("in_flight_lease_ms: 999\n", rule, "in_flight_lease_ms");
    refused("in_flight_lease_ms: 600001\n", rule, "in_flight_lease_ms");
}

/* --- rlctl bucket ----------------------------------------------------- */

/* An in_flight rule is a key of the request's multi call: holds on an
 * exact rule and an in_flight rule cost one call each, as checks of the
 * exact rule alone do. */
Test(in_flight, a_check_is_one_call_with_the_exact_rules)
{
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    rl_config *cfg;
    rl_agent *a = open_agent_on(addr, &cfg, "",
                                "  - {name: f, match: api_key, "
                                "in_flight: 100}\n"
                                "  - {name: r, match: ip, limit: 1000, "
                                "period: 1h}\n");
    rl_attr attrs[2] = {{"api_key", "one-call", 8}, {"ip", "one-call", 8}};
    held h = {0};
    sem_init(&h.done, 0, 0);
    rl_hold *holds[11];
    long long before = 0;
    /* The first loads the library: counted from the second on. */
    for (int i = 0; i < 11; i++) {
        if (i == 1)
            before = test_redis_calls(addr, "fcall");
        cr_assert_eq(rl_check_hold(a, attrs, 2, 1, on_held, &h), RL_OK);
        while (sem_wait(&h.done) != 0)
            ;
        cr_assert_not_null(holds[i] = h.hold);
    }
    long long calls = test_redis_calls(addr, "fcall") - before;
    cr_assert_eq(calls, 10, "10 holds made %lld calls", calls);
    for (int i = 0; i < 11; i++)
        cr_assert_eq(rl_hold_end(holds[i], 1), RL_OK);
    sem_destroy(&h.done);
    close_agent(a, cfg);
    test_redis_stop(&srv);
}

/* rlctl bucket shows the slots held, by which agent (its id names this
 * process's pid), and until when. */
Test(in_flight, rlctl_bucket_shows_the_slots_by_agent)
{
    char value[64], key[96], out[4096], pid[32];
    fresh(value, key, "rlctl");
    const char *rules = "  - {name: f, match: api_key, in_flight: 5}\n";
    rl_config *cfg;
    rl_agent *a = open_agent(&cfg, "", rules);
    rl_hold *h[2];
    for (int i = 0; i < 2; i++)
        cr_assert_not_null(h[i] = hold_of(a, value));
    const char *path = test_store_config("in-flight-rlctl", rules);
    cr_assert_eq(test_rlctl(out, sizeof out, path, "bucket f %s", value), 0,
                 "%s", out);
    snprintf(pid, sizeof pid, "/%d/", (int)getpid());
    cr_assert(strstr(out, "rule:        f (in_flight, 5 at once)") != NULL,
              "%s", out);
    cr_assert(strstr(out, "held:        2 of 5 at once, 3 free") != NULL,
              "%s", out);
    const char *line = strstr(out, "agent:       ");
    cr_assert(line != NULL && strstr(line, pid) != NULL
                  && strstr(line, " holds 2, expires in ") != NULL,
              "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, path, "--json bucket f %s",
                            value), 0, "%s", out);
    cr_assert(strstr(out, "\"in_flight\":5,\"held\":2,\"agents\":[{\"agent\":")
                  != NULL && strstr(out, "\"slots\":2,\"expires_in_ms\":")
                                 != NULL, "%s", out);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(rl_hold_end(h[i], 1), RL_OK);
    close_agent(a, cfg);
}

/* --- On a Redis Cluster ------------------------------------------------ */

/* Keys spread over the runner's cluster (RL_TEST_CLUSTER): GROUPS hash
 * tags, so GROUPS slots, PER_GROUP keys in each. */
#define GROUPS 8
#define PER_GROUP 5
#define CLUSTER_KEYS (GROUPS * PER_GROUP)

typedef struct spread {
    char values[CLUSTER_KEYS][64], keys[CLUSTER_KEYS][96];
} spread;

/* Value i is in group i % GROUPS: taken in that order, neighbours in the
 * agent's list of due keys are of different slots. A renewal lists them
 * in its table's order, a hash of the whole key: with the group's number
 * at the key's end ("{renew-T-g}-j"), that order came out grouped by slot
 * (8 calls a renewal unsorted, against 40 with j first). */
static void spread_keys(spread *sp, const char *what)
{
    unsigned long long now = (unsigned long long)test_now_us();
    for (int i = 0; i < CLUSTER_KEYS; i++) {
        char value[64];
        snprintf(value, sizeof value, "%d-{%s-%llu-%d}", i / GROUPS, what,
                 now, i % GROUPS);
        memcpy(sp->values[i], value, sizeof value);
        key_of(sp->keys[i], value);
    }
}

/* The calls and writes (batches) an agent has sent to the cluster. */
static void sent(rl_agent *a, uint64_t *calls, uint64_t *batches)
{
    rl_shard_counters shards[8];
    size_t n = rl_agent_shards(a, shards, 8);
    *calls = *batches = 0;
    for (size_t i = 0; i < n; i++) {
        *calls += shards[i].calls;
        *batches += shards[i].batches;
    }
}

/* in_flight: 1 on 40 keys in 8 slots, held by one agent past the lease
 * (1 s): every renewal writes each slot's keys in one call, sent in one
 * write per primary (so calls = slots x renewals, writes = primaries x
 * renewals), and keeps every key's slot (another agent is refused on
 * each throughout, and Redis holds one of each); ended, every key is
 * let go. */
Test(in_flight_cluster, a_renewal_is_one_call_per_slot_and_keeps_every_key)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    static spread sp;
    spread_keys(&sp, "renew");
    const char *rules = "  - {name: f, match: api_key, in_flight: 1}\n";
    rl_config *cfg_a, *cfg_b;
    uint64_t opened = test_now_us();
    rl_agent *a = open_agent_on(seeds, &cfg_a, "in_flight_lease_ms: 1000\n",
                                rules);
    rl_agent *b = open_agent_on(seeds, &cfg_b, "in_flight_lease_ms: 1000\n",
                                rules);
    rl_hold *h[CLUSTER_KEYS];
    for (int i = 0; i < CLUSTER_KEYS; i++)
        cr_assert_not_null(h[i] = hold_of(a, sp.values[i]), "%s",
                           sp.values[i]);
    /* Counted once the store has read the slot map again (500 ms after
     * it first did, as not every primary was connected then): the
     * calls are the renewals' only. */
    uint64_t calls0, batches0, calls1, batches1;
    test_sleep_ms(600 - (int)((test_now_us() - opened) / 1000));
    sent(a, &calls0, &batches0);
    rl_shard_counters shards[8];
    size_t primaries = rl_agent_shards(a, shards, 8);
    uint64_t start = test_now_us();
    while (test_now_us() - start < 1300000) {
        for (int i = 0; i < CLUSTER_KEYS; i += GROUPS + 1)
            cr_assert_null(hold_of(b, sp.values[i]), "%s was taken after "
                           "%llu ms", sp.values[i], (unsigned long long)
                           (test_now_us() - start) / 1000);
        test_sleep_ms(50);
    }
    /* b's refusals went through b: a sent renewals only. */
    sent(a, &calls1, &batches1);
    uint64_t calls = calls1 - calls0, batches = batches1 - batches0;
    uint64_t renewals = batches / primaries;
    fprintf(stderr, "in_flight on a cluster: %d keys in %d slots on %zu "
            "primaries: %llu calls in %llu writes in 1300 ms\n",
            CLUSTER_KEYS, GROUPS, primaries, (unsigned long long)calls,
            (unsigned long long)batches);
    cr_assert_geq(renewals, 4, "%llu writes on %zu primaries in 1300 ms, "
                  "renewing every 250 ms", (unsigned long long)batches,
                  primaries);
    cr_assert_eq(batches, renewals * primaries, "%llu writes",
                 (unsigned long long)batches);
    cr_assert_eq(calls, renewals * GROUPS, "%llu renewals made %llu calls "
                 "for %d slots", (unsigned long long)renewals,
                 (unsigned long long)calls, GROUPS);
    for (int i = 0; i < CLUSTER_KEYS; i++) {
        redisContext *c = test_redis_connect_holding(seeds, sp.keys[i]);
        cr_assert_not_null(c);
        cr_assert_eq(slots_in_redis(c, sp.keys[i]), 1, "%s", sp.keys[i]);
        redisFree(c);
    }
    for (int i = 0; i < CLUSTER_KEYS; i++)
        cr_assert_eq(rl_hold_end(h[i], 1), RL_OK);
    for (int i = 0; i < CLUSTER_KEYS; i++)
        cr_assert(gone_from_within(seeds, sp.keys[i], 200),
                  "%s kept its slot", sp.keys[i]);
    close_agent(a, cfg_a);
    close_agent(b, cfg_b);
}

/* Three agents on the cluster, in_flight: 3 on four keys of four slots,
 * each key wanted by six clients at once (twice N): at most 3 of each key
 * served at once, near 3, and nothing left held after the load. */
#define FLEET_KEYS 4
#define FLEET_AGENTS 3
#define FLEET_N 3

Test(in_flight_cluster, agents_hold_at_most_n_of_each_key_at_once)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    static spread sp;
    spread_keys(&sp, "fleet");
    rl_agent *agents[FLEET_AGENTS];
    rl_config *cfgs[FLEET_AGENTS];
    for (int i = 0; i < FLEET_AGENTS; i++)
        agents[i] = open_agent_on(seeds, &cfgs[i],
                                  "in_flight_lease_ms: 1000\n",
                                  "  - {name: f, match: api_key, "
                                  "in_flight: 3}\n");
    atomic_int serving[FLEET_KEYS] = {0}, peak[FLEET_KEYS] = {0};
    atomic_bool stop = false;
    enum { CLIENTS = FLEET_KEYS * FLEET_AGENTS * 2 };
    client clients[CLIENTS];
    pthread_t threads[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        int k = i % FLEET_KEYS;
        clients[i] = (client){agents[i / (2 * FLEET_KEYS)], sp.values[k],
                              &serving[k], &peak[k], &stop, 0, 0};
        cr_assert_eq(pthread_create(&threads[i], NULL, serve_requests,
                                    &clients[i]), 0);
    }
    test_sleep_ms(1500);
    atomic_store(&stop, true);
    int refused = 0;
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(threads[i], NULL);
        refused += clients[i].refused;
    }
    cr_assert_gt(refused, 0, "the load never reached N");
    for (int k = 0; k < FLEET_KEYS; k++) {
        int p = atomic_load(&peak[k]);
        fprintf(stderr, "in_flight on a cluster: %s: at most %d at once\n",
                sp.values[k], p);
        cr_assert_leq(p, FLEET_N, "%s: %d served at once", sp.values[k], p);
        cr_assert_geq(p, FLEET_N - 1, "%s: at most %d at once",
                      sp.values[k], p);
        cr_assert(gone_from_within(seeds, sp.keys[k], 500),
                  "%s: slots left held after the load", sp.keys[k]);
    }
    for (int i = 0; i < FLEET_AGENTS; i++)
        close_agent(agents[i], cfgs[i]);
}

/* A holder on the cluster with one slot of each of eight keys in eight
 * slots, in_flight: 1, lease 1000 ms, killed: every key stays held until
 * its last renewal's lease (750 ms after the kill at least) and each is
 * free 1000 ms after the kill at most. */
Test(in_flight_cluster, a_killed_holders_slots_free_within_the_lease)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    static spread sp;
    spread_keys(&sp, "killed");
    char values[GROUPS * 64] = "", log[512];
    for (int i = 0; i < GROUPS; i++)
        snprintf(values + strlen(values), sizeof values - strlen(values),
                 "%s%s", i > 0 ? "," : "", sp.values[i]);
    test_log_path(log, sizeof log, "in-flight-holder-cluster");
    char *argv[] = {(char *)test_env("RL_TEST_HOLDER"), (char *)seeds,
                    values, "1", "1", "1000", NULL};
    pid_t pid = test_spawn(argv, log);
    test_wait_for_log(&pid, log, "held 8", 5000);
    test_sleep_ms(600);
    rl_config *cfg;
    rl_agent *a = open_agent_on(seeds, &cfg, "in_flight_lease_ms: 1000\n",
                                "  - {name: f, match: api_key, "
                                "in_flight: 1}\n");
    for (int i = 0; i < GROUPS; i++)
        cr_assert_null(hold_of(a, sp.values[i]), "%s was free while the "
                       "holder lived", sp.values[i]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    uint64_t killed = test_now_us();
    test_sleep_ms(600);
    for (int i = 0; i < GROUPS; i++)
        cr_assert_null(hold_of(a, sp.values[i]), "%s went before its last "
                       "renewal's lease", sp.values[i]);
    rl_hold *h[GROUPS] = {0};
    int freed = 0;
    while (freed < GROUPS && test_now_us() - killed < 2000000) {
        test_sleep_ms(20);
        for (int i = 0; i < GROUPS; i++) {
            if (h[i] == NULL && (h[i] = hold_of(a, sp.values[i])) != NULL)
                freed++;
        }
    }
    uint64_t free_ms = (test_now_us() - killed) / 1000;
    fprintf(stderr, "in_flight on a cluster: a killed holder's %d keys "
            "free after %llu ms (lease 1000)\n", freed,
            (unsigned long long)free_ms);
    cr_assert_eq(freed, GROUPS, "%d of %d keys freed", freed, GROUPS);
    cr_assert_leq(free_ms, 1000 + 80, "free after %llu ms",
                  (unsigned long long)free_ms);
    for (int i = 0; i < GROUPS; i++)
        cr_assert_eq(rl_hold_end(h[i], 1), RL_OK);
    close_agent(a, cfg);
}
