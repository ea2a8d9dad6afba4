/*
 * test_agent.c: agents for integration tests, always on a real Redis.
 */
#include "test_agent.h"

#include "config.h"
#include "redis_server.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t test_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

uint64_t test_now_ms(void)
{
    return test_now_us() / 1000;
}

static void *probe(void *arg)
{
    test_sched_probe *p = arg;
    struct timespec ms = {0, 1000000};
    while (!atomic_load(&p->stop)) {
        uint64_t before = test_now_us();
        nanosleep(&ms, NULL);
        uint64_t late = test_now_us() - before - 1000;
        if (late > atomic_load(&p->worst_us))
            atomic_store(&p->worst_us, late);
    }
    return NULL;
}

void test_sched_probe_start(test_sched_probe *p)
{
    atomic_init(&p->stop, false);
    atomic_init(&p->worst_us, 0);
    cr_assert_eq(pthread_create(&p->thread, NULL, probe, p), 0);
}

uint64_t test_sched_probe_stop(test_sched_probe *p)
{
    atomic_store(&p->stop, true);
    pthread_join(p->thread, NULL);
    return atomic_load(&p->worst_us);
}

uint64_t test_deadline_latest_us(unsigned deadline_ms, uint64_t overslept_us)
{
    return (deadline_ms + TEST_DEADLINE_MARGIN_MS) * 1000ULL
           + 2 * overslept_us;
}

void test_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

uint64_t test_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void test_away_from_window_edge(uint64_t period_ms, uint64_t need_ms)
{
    uint64_t left = period_ms - test_wall_ms() % period_ms;
    if (left < need_ms)
        test_sleep_ms((unsigned)left + 20);
}

void test_log_init(test_log *l)
{
    pthread_mutex_init(&l->lock, NULL);
    l->len = 0;
    l->text[0] = '\0';
    l->cut = false;
}

void test_log_capture(rl_log_level level, const char *line, void *arg)
{
    (void)level;
    test_log *l = arg;
    pthread_mutex_lock(&l->lock);
    size_t room = sizeof l->text - l->len;
    int n = snprintf(l->text + l->len, room, "%s\n", line);
    if (n < 0 || (size_t)n >= room) {
        l->text[l->len] = '\0';
        l->cut = true;
    } else {
        l->len += (size_t)n;
    }
    pthread_mutex_unlock(&l->lock);
}

static bool log_has(test_log *l, const char *what, const char *then)
{
    pthread_mutex_lock(&l->lock);
    bool has = false;
    for (const char *at = strstr(l->text, what); at != NULL && !has;
         at = strstr(at + 1, what)) {
        const char *eol = strchr(at, '\n');
        const char *found = then != NULL ? strstr(at, then) : at;
        has = found != NULL && (eol == NULL || found < eol);
    }
    pthread_mutex_unlock(&l->lock);
    return has;
}

bool test_log_wait(test_log *l, const char *what, const char *then,
                   int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        if (log_has(l, what, then))
            return true;
        test_sleep_ms(10);
    }
    return log_has(l, what, then);
}

void test_log_lacks(test_log *l, const char *text, const char *where)
{
    pthread_mutex_lock(&l->lock);
    bool cut = l->cut, has = strstr(l->text, text) != NULL;
    pthread_mutex_unlock(&l->lock);
    cr_assert(!cut, "%s: more than %zu bytes were logged", where,
              sizeof l->text);
    cr_assert(!has, "%s holds \"%s\":\n%s", where, text, l->text);
}

rl_agent *test_agent_on(const char *path, rl_config **config, test_log *log)
{
    rl_error err;
    cr_assert_eq(rl_config_load(path, config, &err), RL_OK, "%s",
                 err.message);
    rl_options o = {.config = *config, .log = log ? test_log_capture : NULL,
                    .log_arg = log, .log_level = RL_LOG_DEBUG};
    rl_agent *agent;
    cr_assert_eq(rl_agent_open(&agent, &o, &err), RL_OK, "%s", err.message);
    return agent;
}

/* The agent's errors go to stderr, where Criterion shows them next to a
 * failing test; with RL_TEST_VERBOSE set, every line does. */
static void test_log_line(rl_log_level level, const char *line, void *arg)
{
    (void)arg;
    if (level >= RL_LOG_ERROR || getenv("RL_TEST_VERBOSE") != NULL)
        fprintf(stderr, "agent: %s\n", line);
}

static void flush_scripts(const char *addr, test_scripts mode)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, mode == TEST_FCALL
                                              ? "FUNCTION FLUSH"
                                              : "SCRIPT FLUSH");
    cr_assert_eq(r->type, REDIS_REPLY_STATUS, "flush failed");
    freeReplyObject(r);
    redisFree(c);
}

void test_agent_open(test_agent *t, const char *addr, test_scripts mode,
                     const char *store_extra, const char *charge,
                     const char *rules_yaml)
{
    memset(t, 0, sizeof *t);
    snprintf(t->addr, sizeof t->addr, "%s",
             addr != NULL ? addr : test_env("RL_TEST_REDIS"));
    /* Unless a test is about the deadline, give it one that a loaded
     * machine (sanitizers, a parallel run) cannot miss: these tests are
     * about decisions, not speed. */
    bool timeout_given = store_extra != NULL
                         && strstr(store_extra, "timeout_ms") != NULL;
    char yaml[8192];
    int n = snprintf(yaml, sizeof yaml,
                     "store:\n"
                     "  url: redis://%s\n"
                     "  scripts: %s\n"
                     "%s%s"
                     "charge: %s\n"
                     "rules:\n%s",
                     t->addr, mode == TEST_FCALL ? "function" : "eval",
                     store_extra != NULL ? store_extra : "",
                     timeout_given ? "" : "  timeout_ms: 1000\n",
                     charge != NULL ? charge : "all", rules_yaml);
    cr_assert_lt((size_t)n, sizeof yaml);
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", &t->config, &err),
                 RL_OK, "%s", err.message);
    rl_options o = {.config = t->config, .log = test_log_line};
    cr_assert_eq(rl_agent_open(&t->agent, &o, &err), RL_OK, "%s",
                 err.message);
    /* Warm up on a key no test uses, so the scripts are loaded... */
    rl_attr warm[RL_ATTRS_MAX];
    size_t n_warm = 0;
    for (size_t i = 0; i < t->config->n_rules; i++) {
        const rl_rule *r = &t->config->rules[i];
        /* Every part of a composite key (the rule's when may still keep
         * it out of the warm-up: others load the scripts then). */
        for (size_t p = 0; p < r->n_parts; p++) {
            const char *match = r->parts[p];
            bool seen = false;
            for (size_t j = 0; j < n_warm; j++)
                seen = seen || strcmp(warm[j].name, match) == 0;
            if (!seen && n_warm < RL_ATTRS_MAX)
                warm[n_warm++] = (rl_attr){match, "warm-up", 7};
        }
    }
    /* A deadline of tens of ms may pass before the first connection and
     * its handshake are done on a loaded machine (a sanitizer build): the
     * warm-up is not a test of the deadline, and tries for up to 2 s. */
    rl_decision d = {.degraded = true};
    for (int i = 0; i < 100 && d.degraded; i++) {
        if (i > 0)
            test_sleep_ms(20);
        cr_assert_eq(rl_check(t->agent, warm, n_warm, 1, &d), RL_OK);
    }
    cr_assert(!d.degraded, "the test Redis at %s did not answer", t->addr);
    /* ...then take them away again. */
    flush_scripts(t->addr, mode);
}

void test_agent_private_redis(struct test_redis *srv, char *addr,
                              size_t cap)
{
    char err[512];
    test_redis_options o = {0};
    cr_assert_eq(test_redis_start(srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    snprintf(addr, cap, "127.0.0.1:%u", srv->port);
}

void test_agent_close(test_agent *t)
{
    rl_agent_close(t->agent);
    rl_config_free(t->config);
    t->agent = NULL;
    t->config = NULL;
}

rl_decision test_check(test_agent *t, ...)
{
    rl_attr attrs[RL_ATTRS_MAX];
    char names[RL_ATTRS_MAX][64];
    size_t n = 0;
    va_list ap;
    va_start(ap, t);
    for (const char *kv; (kv = va_arg(ap, const char *)) != NULL; n++) {
        const char *eq = strchr(kv, '=');
        cr_assert_not_null(eq, "attribute '%s' is not name=value", kv);
        snprintf(names[n], sizeof names[n], "%.*s", (int)(eq - kv), kv);
        attrs[n] = (rl_attr){names[n], eq + 1, strlen(eq + 1)};
    }
    va_end(ap);
    rl_decision d;
    int rc = rl_check(t->agent, attrs, n, 1, &d);
    cr_assert_eq(rc, RL_OK, "rl_check: %s", rl_strerror(rc));
    return d;
}

long long test_fixed_window_count(const char *addr, const char *key)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *keys = test_redis_command(c, "KEYS %s:*", key);
    long long sum = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *v = test_redis_command(c, "GET %s", keys->element[i]->str);
        if (v->type == REDIS_REPLY_STRING)
            sum += atoll(v->str);
        freeReplyObject(v);
    }
    freeReplyObject(keys);
    redisFree(c);
    return sum;
}

void test_fixed_window_expect(const char *addr, const char *key,
                              long long want)
{
    long long got = test_fixed_window_count(addr, key);
    for (int i = 0; i < 200 && got != want; i++) {
        test_sleep_ms(10);
        got = test_fixed_window_count(addr, key);
    }
    cr_assert_eq(got, want, "%s counts %lld, not %lld", key, got, want);
}

long long test_window_total(const char *addr, const char *prefix_value)
{
    redisContext *c = test_redis_connect(addr);
    /* A synced client's counts: one hash, a field per sub-window, named
     * by its number; the head and sums beside them (m, windows.c) are
     * not counts. */
    redisReply *keys = test_redis_command(c, "KEYS %s:w*", prefix_value);
    long long sum = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *v = test_redis_command(c, "HGETALL %s",
                                           keys->element[i]->str);
        for (size_t f = 0;
             v->type == REDIS_REPLY_ARRAY && f + 1 < v->elements; f += 2) {
            const char *name = v->element[f]->str;
            if (name[0] >= '0' && name[0] <= '9')
                sum += atoll(v->element[f + 1]->str);
        }
        freeReplyObject(v);
    }
    freeReplyObject(keys);
    redisFree(c);
    return sum;
}

void test_expect_window_total(const char *prefix_value, long long want,
                              unsigned timeout_ms)
{
    uint64_t start = test_now_ms();
    long long got;
    while ((got = test_window_total(NULL, prefix_value)) != want) {
        cr_assert_lt(test_now_ms() - start, timeout_ms,
                     "Redis holds %lld for %s, the agents counted %lld", got,
                     prefix_value, want);
        test_sleep_ms(50);
    }
}

void test_host_turn(rl_agent *a, uint64_t deadline)
{
    uint64_t now = test_now_ms();
    cr_assert_lt(now, deadline, "the host loop ran past its deadline");
    int timeout = rl_agent_loop_timeout(a);
    int left = (int)(deadline - now);
    struct pollfd p = {.fd = rl_agent_loop_fd(a), .events = POLLIN};
    cr_assert_geq(p.fd, 0);
    poll(&p, 1, timeout < 0 || timeout > left ? left : timeout);
    cr_assert_eq(rl_agent_run(a), RL_OK);
}

void test_on_held(const rl_decision *d, rl_hold *hold, void *arg)
{
    test_held *h = arg;
    h->decision = *d;
    h->hold = hold;
    h->null_when_rejected = d->allowed || hold == NULL;
    sem_post(&h->done);
}

rl_hold *test_hold_on(rl_agent *a, const char *name, const char *value,
                      uint32_t estimate, rl_decision *d)
{
    test_held h = {0};
    sem_init(&h.done, 0, 0);
    rl_attr attr = {name, value, strlen(value)};
    cr_assert_eq(rl_check_hold(a, &attr, 1, estimate, test_on_held, &h),
                 RL_OK);
    while (sem_wait(&h.done) != 0)
        ;
    sem_destroy(&h.done);
    cr_assert(h.null_when_rejected, "a refused request got a hold");
    cr_assert(!h.decision.allowed || h.hold != NULL,
              "an allowed request got no hold");
    if (d != NULL)
        *d = h.decision;
    return h.hold;
}
