/*
 * rl-rls's ShouldRateLimit logic (rls/rls_service.c) against a real
 * redis-server, through a host-loop agent driven by the test's thread, as
 * rl-rls drives it: upstream's statuses, overall code, shadow modes,
 * hits_addend, replaces, unlimited, a descriptor's own limit and the
 * RateLimit headers, from requests packed with Envoy's field numbers.
 */
#include "envoy/service/ratelimit/v3/rls.pb-c.h"
#include "rls_service.h"
#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef Envoy__Service__Ratelimit__V3__RateLimitResponse response;
typedef Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor desc;
typedef Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor__Entry
    entry;

#define OK ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OK
#define OVER ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT

static const char limits[] =
    "domain: edge\n"
    "descriptors:\n"
    "  - key: client\n"
    "    rate_limit: {unit: minute, requests_per_unit: 20}\n"
    "  - key: path\n"
    "    value: /small\n"
    "    rate_limit: {unit: hour, requests_per_unit: 2, name: small}\n"
    "  - key: path\n"
    "    value: /free\n"
    "    rate_limit: {unlimited: true}\n"
    "  - key: path\n"
    "    value: /shadow\n"
    "    shadow_mode: true\n"
    "    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    "  - key: path\n"
    "    value: /closed\n"
    "    rate_limit: {unit: hour, requests_per_unit: 0}\n"
    "  - key: tier\n"
    "    value: base\n"
    "    rate_limit: {unit: hour, requests_per_unit: 1, name: base}\n"
    "  - key: tier\n"
    "    value: gold\n"
    "    rate_limit: {unit: hour, requests_per_unit: 5, replaces: "
    "[{name: base}]}\n";

typedef struct world {
    rl_agent *agent;
    rls_config *cfg;
    rls_options o;
    rls_pool pool;     /* the calls' memory */
    char id[32];       /* this run's, in every value */
} world;

static void open_world_stopping(world *w, bool shadow, bool headers,
                                bool stop)
{
    const char *path = test_store_config("rls-service",
        "  - {name: rls, match: d, limit: 1, period: 1s, "
        "algorithm: fixed_window, key_prefix: 'rls:t:'}\n");
    rl_options opts = {.config_path = path, .host_loop = 1};
    rl_error err;
    cr_assert_eq(rl_agent_open(&w->agent, &opts, &err), RL_OK, "%s",
                 err.message);
    char why[512];
    w->cfg = rls_config_new(false, false);
    cr_assert_eq(rls_config_add(w->cfg, "config.limits.yaml", limits,
                                strlen(limits), why, sizeof why), 0, "%s",
                 why);
    w->o = (rls_options){.rule = "rls", .shadow_mode = shadow,
                         .headers = headers,
                         .stop_increment_when_over = stop,
                         .limit_header = "RateLimit-Limit",
                         .remaining_header = "RateLimit-Remaining",
                         .reset_header = "RateLimit-Reset"};
    rls_pool_init(&w->pool);
    /* The limits count in windows of a minute or an hour: a test's calls
     * all land in one. */
    test_away_from_window_edge(60000, 2000);
    snprintf(w->id, sizeof w->id, "%d-%llu", (int)getpid(),
             (unsigned long long)test_now_us());
}

static void open_world(world *w, bool shadow, bool headers)
{
    open_world_stopping(w, shadow, headers, false);
}

static void close_world(world *w)
{
    rl_agent_close(w->agent);
    rls_config_free(w->cfg);
    rls_pool_fini(&w->pool);
}

typedef struct reply {
    bool done;
    rls_grpc_status status;
    char message[256];
    response *r;
} reply;

static void on_reply(void *arg, rls_grpc_status status, const uint8_t *msg,
                     size_t len, const char *message)
{
    reply *rp = arg;
    cr_assert(!rp->done, "answered twice");
    rp->done = true;
    rp->status = status;
    snprintf(rp->message, sizeof rp->message, "%s", message ? message : "");
    if (status == RLS_GRPC_OK)
        rp->r = envoy__service__ratelimit__v3__rate_limit_response__unpack(
            NULL, len, msg);
}

/* One call of the packed request bytes; the host loop runs until it is
 * answered. */
static reply call_bytes(world *w, const uint8_t *msg, size_t len)
{
    reply rp = {0};
    rls_should_rate_limit(w->agent, &w->pool, w->cfg, &w->o, msg, len,
                          on_reply, &rp);
    uint64_t deadline = test_now_ms() + 5000;
    while (!rp.done)
        test_host_turn(w->agent, deadline);
    return rp;
}

/* A descriptor of up to four "key=value" entries (NULL-terminated);
 * hits: -1 for none of its own. */
typedef struct one {
    const char *kv[4];
    long long hits;
    uint32_t limit_rpu; /* a descriptor's own limit, per hour, if not 0 */
} one;

static reply call(world *w, const char *domain, uint32_t hits,
                  const one *ds, size_t n)
{
    Envoy__Service__Ratelimit__V3__RateLimitRequest req =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_REQUEST__INIT;
    desc d[8], *dp[8];
    entry e[8][4], *ep[8][4];
    char values[8][4][128], keys[8][4][64];
    Google__Protobuf__UInt64Value h[8];
    Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor__RateLimitOverride
        lo[8];
    for (size_t i = 0; i < n; i++) {
        d[i] = (desc)ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__INIT;
        size_t k = 0;
        for (; k < 4 && ds[i].kv[k] != NULL; k++) {
            const char *eq = strchr(ds[i].kv[k], '=');
            snprintf(keys[i][k], 64, "%.*s", (int)(eq - ds[i].kv[k]),
                     ds[i].kv[k]);
            /* client values are this run's own */
            snprintf(values[i][k], 128, "%s%s%s", eq + 1,
                     strcmp(keys[i][k], "client") == 0 ? "-" : "",
                     strcmp(keys[i][k], "client") == 0 ? w->id : "");
            e[i][k] = (entry)ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__ENTRY__INIT;
            e[i][k].key = keys[i][k];
            e[i][k].value = values[i][k];
            ep[i][k] = &e[i][k];
        }
        d[i].n_entries = k;
        d[i].entries = ep[i];
        if (ds[i].hits >= 0) {
            h[i] = (Google__Protobuf__UInt64Value)GOOGLE__PROTOBUF__UINT64_VALUE__INIT;
            h[i].value = (uint64_t)ds[i].hits;
            d[i].hits_addend = &h[i];
        }
        if (ds[i].limit_rpu != 0) {
            lo[i] = (Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor__RateLimitOverride)
                ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__RATE_LIMIT_OVERRIDE__INIT;
            lo[i].requests_per_unit = ds[i].limit_rpu;
            lo[i].unit = ENVOY__TYPE__V3__RATE_LIMIT_UNIT__HOUR;
            d[i].limit = &lo[i];
        }
        dp[i] = &d[i];
    }
    req.domain = (char *)domain;
    req.n_descriptors = n;
    req.descriptors = dp;
    req.hits_addend = hits;
    uint8_t buf[4096];
    size_t len = envoy__service__ratelimit__v3__rate_limit_request__pack(&req,
                                                                          buf);
    return call_bytes(w, buf, len);
}

static void free_reply(reply *rp)
{
    if (rp->r != NULL)
        envoy__service__ratelimit__v3__rate_limit_response__free_unpacked(
            rp->r, NULL);
}

static response *ok(reply *rp)
{
    cr_assert_eq(rp->status, RLS_GRPC_OK, "status %d: %s", rp->status,
                 rp->message);
    cr_assert_not_null(rp->r);
    return rp->r;
}

#define D(...) ((one){{__VA_ARGS__}, -1, 0})

Test(rls_service, twenty_a_minute_count_down_then_over_the_limit)
{
    world w;
    open_world(&w, false, false);
    one d = D("client=a");
    for (int i = 0; i < 21; i++) {
        reply rp = call(&w, "edge", 0, &d, 1);
        response *r = ok(&rp);
        cr_assert_eq(r->n_statuses, 1);
        const Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus
            *s = r->statuses[0];
        cr_assert_eq(s->code, i < 20 ? OK : OVER, "call %d", i + 1);
        cr_assert_eq(r->overall_code, s->code);
        cr_assert_eq(s->limit_remaining, i < 20 ? (uint32_t)(19 - i) : 0);
        cr_assert_not_null(s->current_limit);
        cr_assert_eq(s->current_limit->requests_per_unit, 20);
        cr_assert_eq(s->current_limit->unit, 2 /* MINUTE */);
        cr_assert_not_null(s->duration_until_reset);
        cr_assert(s->duration_until_reset->seconds >= 1
                      && s->duration_until_reset->seconds <= 60,
                  "reset in %lld s",
                  (long long)s->duration_until_reset->seconds);
        free_reply(&rp);
    }
    close_world(&w);
}

Test(rls_service, errors_and_requests_no_limit_applies_to)
{
    world w;
    open_world(&w, false, false);
    one d = D("client=a");
    reply rp = call(&w, "", 0, &d, 1);
    cr_assert_eq(rp.status, RLS_GRPC_UNKNOWN);
    cr_assert_str_eq(rp.message, "rate limit domain must not be empty");
    rp = call(&w, "edge", 0, &d, 0);
    cr_assert_eq(rp.status, RLS_GRPC_UNKNOWN);
    cr_assert_str_eq(rp.message,
                     "rate limit descriptor list must not be empty");
    rp = call_bytes(&w, (const uint8_t *)"\x0a\xff\xff", 3);
    cr_assert_eq(rp.status, RLS_GRPC_INTERNAL);
    /* An unknown domain, an unknown key, a deeper request: OK, no
     * limit. */
    one none[] = {D("client=a"), D("nope=x"), D("client=a", "path=/small")};
    const char *domains[] = {"elsewhere", "edge", "edge"};
    for (int i = 0; i < 3; i++) {
        rp = call(&w, domains[i], 0, &none[i], 1);
        response *r = ok(&rp);
        cr_assert_eq(r->overall_code, OK);
        cr_assert_eq(r->statuses[0]->code, OK);
        cr_assert_null(r->statuses[0]->current_limit, "case %d", i);
        cr_assert_eq(r->statuses[0]->limit_remaining, 0);
        free_reply(&rp);
    }
    close_world(&w);
}

Test(rls_service, statuses_in_order_one_tripping_the_other_counted)
{
    world w;
    open_world(&w, false, false);
    /* /small is 2 an hour for everyone: this run's own path value is not
     * possible (it is a fixed value), so its count is read first. */
    one pair[] = {D("client=b"), D("path=/small")};
    reply rp = call(&w, "edge", 0, pair, 2);
    response *r = ok(&rp);
    uint32_t small_left = r->statuses[1]->limit_remaining;
    free_reply(&rp);
    for (uint32_t i = 0; i < small_left + 1; i++) {
        rp = call(&w, "edge", 0, pair, 2);
        free_reply(&rp);
    }
    rp = call(&w, "edge", 0, pair, 2);
    r = ok(&rp);
    cr_assert_eq(r->overall_code, OVER);
    cr_assert_eq(r->statuses[0]->code, OK);
    cr_assert_eq(r->statuses[1]->code, OVER);
    cr_assert_str_eq(r->statuses[1]->current_limit->name, "small");
    /* client=b counted every call, the refused ones too. */
    cr_assert_eq(r->statuses[0]->limit_remaining, 20 - (small_left + 3));
    free_reply(&rp);
    close_world(&w);
}

Test(rls_service, unlimited_shadow_closed_replaces_and_own_limits)
{
    world w;
    open_world(&w, false, false);
    one free_path = D("path=/free");
    reply rp = call(&w, "edge", 0, &free_path, 1);
    response *r = ok(&rp);
    cr_assert_eq(r->statuses[0]->limit_remaining, 4294967295u);
    cr_assert_null(r->statuses[0]->current_limit);
    free_reply(&rp);

    /* shadow_mode: over, yet OK. */
    one shadow = D("path=/shadow");
    for (int i = 0; i < 3; i++) {
        rp = call(&w, "edge", 0, &shadow, 1);
        r = ok(&rp);
        cr_assert_eq(r->overall_code, OK);
        cr_assert_eq(r->statuses[0]->code, OK);
        free_reply(&rp);
    }
    /* requests_per_unit: 0 is always over. */
    one closed = D("path=/closed");
    rp = call(&w, "edge", 0, &closed, 1);
    cr_assert_eq(ok(&rp)->statuses[0]->code, OVER);
    free_reply(&rp);

    /* gold replaces base: base's limit of 1 is not applied. */
    one tiers[] = {D("tier=base"), D("tier=gold")};
    for (int i = 0; i < 3; i++) {
        rp = call(&w, "edge", 0, tiers, 2);
        r = ok(&rp);
        cr_assert_null(r->statuses[0]->current_limit, "base was applied");
        cr_assert_eq(r->statuses[1]->current_limit->requests_per_unit, 5);
        free_reply(&rp);
    }

    /* A descriptor's own limit, used directly: 3 an hour. */
    one own = {{"client=own", NULL}, -1, 3};
    int over = 0;
    for (int i = 0; i < 5; i++) {
        rp = call(&w, "edge", 0, &own, 1);
        r = ok(&rp);
        cr_assert_eq(r->statuses[0]->current_limit->requests_per_unit, 3);
        over += r->statuses[0]->code == OVER;
        free_reply(&rp);
    }
    cr_assert_eq(over, 2);
    close_world(&w);
}

Test(rls_service, hits_addend_of_the_request_and_descriptor)
{
    world w;
    open_world(&w, false, false);
    one d = D("client=h");
    reply rp = call(&w, "edge", 5, &d, 1);
    cr_assert_eq(ok(&rp)->statuses[0]->limit_remaining, 15);
    free_reply(&rp);
    /* A descriptor's 0: looked at, not counted. */
    one zero = {{"client=h", NULL}, 0, 0};
    rp = call(&w, "edge", 5, &zero, 1);
    cr_assert_eq(ok(&rp)->statuses[0]->limit_remaining, 15);
    cr_assert_eq(rp.r->statuses[0]->code, OK);
    free_reply(&rp);
    one seven = {{"client=h", NULL}, 16, 0};
    rp = call(&w, "edge", 0, &seven, 1);
    cr_assert_eq(ok(&rp)->statuses[0]->code, OVER);
    free_reply(&rp);
    close_world(&w);
}

Test(rls_service, global_shadow_mode_and_the_ratelimit_headers)
{
    world w;
    open_world(&w, true, true);
    one d = D("client=g");
    reply rp = call(&w, "edge", 20, &d, 1);
    response *r = ok(&rp);
    cr_assert_eq(r->overall_code, OK);
    cr_assert_eq(r->n_response_headers_to_add, 3);
    cr_assert_str_eq(r->response_headers_to_add[0]->key, "RateLimit-Limit");
    cr_assert_str_eq(r->response_headers_to_add[0]->value, "20");
    /* Failed once under TSan in CI (2026-12-06), not reproduced: what
     * the answer said, for the next time. */
    cr_assert_str_eq(r->response_headers_to_add[1]->value, "0",
                     "RateLimit-Remaining %s after 20 of 20 a minute: the "
                     "status said code %d, %u remaining, reset in %lld s",
                     r->response_headers_to_add[1]->value,
                     (int)r->statuses[0]->code,
                     r->statuses[0]->limit_remaining,
                     (long long)r->statuses[0]->duration_until_reset->seconds);
    long reset = atol(r->response_headers_to_add[2]->value);
    cr_assert(reset >= 1 && reset <= 60, "reset %ld", reset);
    free_reply(&rp);
    rp = call(&w, "edge", 0, &d, 1);
    r = ok(&rp);
    cr_assert_eq(r->statuses[0]->code, OVER, "the status keeps its code");
    cr_assert_eq(r->overall_code, OK, "SHADOW_MODE answers OK");
    free_reply(&rp);
    close_world(&w);
}

/* STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, upstream's integration test's
 * case: two limits in one request, 20 a minute (client) and 2 an hour
 * (/small, shared by every run: its count is read first). Once /small
 * would go over, client's count stops: its remaining stays where it was,
 * and it answers OK; /small is counted (over) as upstream counts it. */
Test(rls_service, stop_increment_when_overlimit_counts_nothing_else)
{
    world w;
    open_world_stopping(&w, false, false, true);
    one pair[] = {D("client=s"), D("path=/small")};
    one small = D("path=/small");
    reply rp = call(&w, "edge", 0, &small, 1);
    uint32_t small_left = ok(&rp)->statuses[0]->limit_remaining;
    free_reply(&rp);
    for (uint32_t i = 0; i < small_left; i++) {
        rp = call(&w, "edge", 0, pair, 2);
        cr_assert_eq(ok(&rp)->overall_code, OK);
        cr_assert_eq(rp.r->statuses[0]->limit_remaining, 19 - i);
        free_reply(&rp);
    }
    uint32_t client_left = 20 - small_left;
    for (int i = 0; i < 3; i++) {
        rp = call(&w, "edge", 0, pair, 2);
        response *r = ok(&rp);
        cr_assert_eq(r->overall_code, OVER, "call %d", i);
        cr_assert_eq(r->statuses[0]->code, OK);
        cr_assert_eq(r->statuses[0]->limit_remaining, client_left,
                     "client counted while /small was over (call %d)", i);
        cr_assert_eq(r->statuses[1]->code, OVER);
        cr_assert_eq(r->statuses[1]->limit_remaining, 0);
        free_reply(&rp);
    }
    /* Alone, client counts again from where it stopped. */
    one client = D("client=s");
    rp = call(&w, "edge", 0, &client, 1);
    cr_assert_eq(ok(&rp)->statuses[0]->limit_remaining, client_left - 1);
    free_reply(&rp);
    close_world(&w);
}

/* A request whose hits would take a limit over counts that limit (a
 * refused hit is counted in a fixed window, as upstream's INCRBY counts
 * it) and not the others; hits that fit are counted whole. */
Test(rls_service, stop_increment_when_overlimit_reads_before_counting)
{
    world w;
    open_world_stopping(&w, false, false, true);
    one a = {{"client=r", NULL}, 15, 0};
    reply rp = call(&w, "edge", 0, &a, 1);
    cr_assert_eq(ok(&rp)->statuses[0]->limit_remaining, 5);
    free_reply(&rp);
    /* 6 would go over 20: counted (21), over. */
    one pair[] = {{{"client=q", NULL}, 1, 0}, {{"client=r", NULL}, 6, 0}};
    rp = call(&w, "edge", 0, pair, 2);
    response *r = ok(&rp);
    cr_assert_eq(r->overall_code, OVER);
    cr_assert_eq(r->statuses[0]->code, OK);
    cr_assert_eq(r->statuses[0]->limit_remaining, 20);
    cr_assert_eq(r->statuses[1]->code, OVER);
    free_reply(&rp);
    /* client=r holds 21 now: 1 more is over, though 5 were left before. */
    one one_more = D("client=r");
    rp = call(&w, "edge", 0, &one_more, 1);
    cr_assert_eq(ok(&rp)->statuses[0]->code, OVER);
    free_reply(&rp);
    /* client=q was never counted: 20 left, 19 after this. */
    one q = D("client=q");
    rp = call(&w, "edge", 0, &q, 1);
    cr_assert_eq(ok(&rp)->statuses[0]->limit_remaining, 19);
    free_reply(&rp);
    close_world(&w);
}
