/*
 * test_fleet.c: agents on one aggregator, and requests offered to them
 * (test_fleet.h).
 */
#include "test_fleet.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void test_fleet_start(test_fleet *f, size_t n, const char *redis,
                      const char *rules_yaml, unsigned interval_ms,
                      const char *warm_tenant, test_log *logs,
                      const char *aggregator_extra)
{
    cr_assert_leq(n, TEST_FLEET_MAX);
    memset(f, 0, sizeof *f);
    f->n = n;
    test_aggregator tpl = TEST_AGGREGATOR_EXTRA(aggregator_extra);
    test_aggregator_start(&f->agg, redis, rules_yaml, interval_ms,
                          aggregator_extra != NULL ? &tpl : NULL);
    test_aggregator_wait_ready(&f->agg);
    for (size_t i = 0; i < n; i++)
        f->agents[i] = test_agent_on(f->agg.config, &f->configs[i],
                                     logs != NULL ? &logs[i] : NULL);
    for (size_t i = 0; i < n; i++)
        cr_assert(test_fleet_allowed(f->agents[i], warm_tenant));
    test_sleep_ms(8 * interval_ms);
}

void test_fleet_stop(test_fleet *f)
{
    for (size_t i = 0; i < f->n; i++) {
        rl_agent_close(f->agents[i]);
        rl_config_free(f->configs[i]);
    }
    if (f->agg.pid > 0)
        test_aggregator_stop(&f->agg);
}

bool test_fleet_allowed(rl_agent *agent, const char *tenant)
{
    rl_attr a = {"tenant", tenant, strlen(tenant)};
    rl_decision d;
    int rc = rl_check(agent, &a, 1, 1, &d);
    cr_assert_eq(rc, RL_OK, "rl_check for %s: %s", tenant, rl_strerror(rc));
    return d.allowed;
}

static void push_to(uint64_t **at, size_t *n, size_t *cap, uint64_t us)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 4096;
        *at = realloc(*at, *cap * sizeof **at);
        cr_assert_not_null(*at);
    }
    (*at)[(*n)++] = us;
}

void test_admissions_push(test_admissions *a, uint64_t at_us)
{
    push_to(&a->at_us, &a->n, &a->cap, at_us);
}

void test_admissions_free(test_admissions *a)
{
    free(a->at_us);
    free(a->refused_us);
    memset(a, 0, sizeof *a);
}

#define OFFERS_MAX 4

void test_fleet_offer_all(test_fleet *f, const test_offer *offers, size_t n,
                          uint64_t ms)
{
    cr_assert_leq(n, OFFERS_MAX);
    uint64_t start = test_now_us(), end = start + ms * 1000;
    double due[OFFERS_MAX];
    size_t turn[OFFERS_MAX] = {0};
    for (size_t k = 0; k < n; k++)
        due[k] = (double)start;
    for (;;) {
        size_t k = 0;
        for (size_t j = 1; j < n; j++)
            k = due[j] < due[k] ? j : k;
        uint64_t now = test_now_us();
        while ((double)now < due[k]) {
            usleep((useconds_t)(due[k] - (double)now));
            now = test_now_us();
        }
        if (now >= end)
            break;
        due[k] += 1e6 / offers[k].rate;
        test_admissions *out = offers[k].out;
        out->offered++;
        rl_agent *agent = f->agents[turn[k]++ % f->n];
        if (test_fleet_allowed(agent, offers[k].tenant))
            test_admissions_push(out, now);
        else
            push_to(&out->refused_us, &out->n_refused, &out->cap_refused,
                    now);
    }
}

void test_fleet_offer(test_fleet *f, const char *tenant, double rate,
                      uint64_t ms, test_admissions *out)
{
    test_offer one = {tenant, rate, out};
    test_fleet_offer_all(f, &one, 1, ms);
}

long test_worst_span(const test_admissions *a, uint64_t period_ms)
{
    long worst = 0;
    for (size_t i = 0, j = 0; j < a->n; j++) {
        while (a->at_us[j] - a->at_us[i] >= period_ms * 1000ULL)
            i++;
        if ((long)(j - i + 1) > worst)
            worst = (long)(j - i + 1);
    }
    return worst;
}

static long between(const uint64_t *at, size_t n, uint64_t from_us,
                    uint64_t to_us)
{
    long k = 0;
    for (size_t i = 0; i < n; i++)
        k += at[i] >= from_us && at[i] < to_us;
    return k;
}

long test_admitted_between(const test_admissions *a, uint64_t from_us,
                           uint64_t to_us)
{
    return between(a->at_us, a->n, from_us, to_us);
}

long test_refused_between(const test_admissions *a, uint64_t from_us,
                          uint64_t to_us)
{
    return between(a->refused_us, a->n_refused, from_us, to_us);
}
