/*
 * The metrics pages follow Prometheus's conventions: rl-gateway's and
 * rl-aggregator's, fetched after traffic that fills their histograms and
 * labelled series, pass `promtool check metrics` (base units, counters
 * ending in _total, help on every family; any complaint fails), and their
 * histograms hold together (cumulative buckets, le="+Inf" equal to the
 * count) and count what happened. The nginx module has no metrics page.
 */
#include "redis_server.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_gateway.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* GET /metrics into text, which starts with a newline (test_prom_sample's
 * form). */
static void fetch(uint16_t port, char *text, size_t cap)
{
    test_http_response r;
    test_http_get(port, "/metrics", "", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_lt(r.body_len + 2, cap);
    text[0] = '\n';
    memcpy(text + 1, r.body, r.body_len);
    text[r.body_len + 1] = '\0';
}

/* promtool (Debian's prometheus package, from make deps) lints the page:
 * it exits non-zero and says why on any problem. */
static void assert_promtool_passes(const char *text, const char *what)
{
    char path[600], cmd[800], out[4096];
    snprintf(path, sizeof path, "%s/metrics-%s-%d.txt",
             test_env("RL_TEST_TMPDIR"), what, (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text + 1, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    int status = test_run(cmd, out, sizeof out);
    cr_assert(status == 0 && out[0] == '\0', "promtool check metrics on "
              "%s's page: exit %d\n%s\n--- the page:%s", what, status, out,
              text);
    unlink(path);
}

static char text[65536];

Test(metrics, gateway_page_passes_promtool_check_metrics)
{
    const char *cfg = test_store_config(
        "metrics", "  - {name: per-key, match: api_key, limit: 3, "
                   "period: 1h}\n"
                   "  - {name: per-ip, match: ip, limit: 100, period: 1h, "
                   "mode: local}\n"
                   "  - {name: cap, match: ip, limit: 1, period: 1h, "
                   "mode: local, shadow: true, key_prefix: \"rl:cap:\"}\n");
    char metrics[32], key[96], raw[512];
    uint16_t port = test_free_port();
    snprintf(metrics, sizeof metrics, "127.0.0.1:%u", port);
    snprintf(key, sizeof key, "ak_metrics_%d_%ld", (int)getpid(),
             (long)time(NULL));
    test_gateway gw;
    test_gateway_start(&gw, cfg, "--metrics", metrics, NULL);
    /* 10 keyed requests wait for the store (3 allowed, 7 rejected), 2
     * without a key do not; all 12 go past the shadow rule's limit of 1. */
    snprintf(raw, sizeof raw, "GET / HTTP/1.1\r\nHost: t\r\n"
             "X-Api-Key: %s\r\n\r\n", key);
    int fd = test_http_connect(gw.port);
    test_http_response r;
    double longest_s = 0, total_s = 0;
    for (int i = 0; i < 10; i++) {
        double started = now_s();
        test_http_exchange(fd, raw, &r, 1);
        double took = now_s() - started;
        total_s += took;
        longest_s = took > longest_s ? took : longest_s;
        cr_assert_eq(r.status, i < 3 ? 200 : 429);
    }
    close(fd);
    test_http_get(gw.port, "/", "", &r);
    test_http_get(gw.port, "/", "", &r);
    fetch(port, text, sizeof text);
    test_gateway_stop(&gw);

    assert_promtool_passes(text, "rl-gateway");
    cr_assert_eq(test_prom_sample(text, "rl_rule_checks_total{rule="
                                  "\"per-key\",verdict=\"rejected\"}"), 7,
                 "%s", text);
    cr_assert_eq(test_prom_sample(text, "rl_rule_shadow_rejected_total{rule="
                                  "\"cap\"}"), 11);
    test_prom_histogram h;
    test_prom_histogram_read(text, "rl_exact_check_duration_seconds", &h);
    cr_assert_eq(h.count, 10, "the keyed requests, and only they, waited "
                 "for the store: %s", text);
    /* Seconds: no check took longer than its round trip seen here, nor
     * less than a microsecond (a Redis round trip). */
    for (int i = 0; i < h.n; i++) {
        if (h.le[i] >= longest_s)
            cr_assert_eq(h.buckets[i], 10, "le=\"%g\" holds %lld of 10, none "
                         "took over %g s", h.le[i], h.buckets[i], longest_s);
    }
    cr_assert(h.sum > 10 * 1e-6 && h.sum <= total_s, "_sum %g s for checks "
              "that took %g s in all (and a microsecond each at least)",
              h.sum, total_s);
    /* The le labels are plain decimals, alike in every process. */
    cr_assert_neq(test_prom_sample(text, "rl_exact_check_duration_seconds_"
                                   "bucket{le=\"0.00001\"}"), -1);
    cr_assert_neq(test_prom_sample(text, "rl_exact_check_duration_seconds_"
                                   "bucket{le=\"2.5\"}"), -1);
}

/* Reports reach the aggregator and totals go out: the page is fetched once
 * a broadcast has counted its lag (the page is rendered at each publish). */
Test(metrics, aggregator_page_passes_promtool_check_metrics)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, "  - {name: per-tenant, match: tenant, "
                          "limit: 1000, period: 1m, mode: synced}\n", 200,
                          NULL);
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&agg, &cfg);
    rl_attr t = {"tenant", "org_metrics_page", 16};
    rl_decision d;
    for (int i = 0; i < 20; i++)
        cr_assert_eq(rl_check(a, &t, 1, 1, &d), RL_OK);
    double until = now_s() + 10;
    do {
        usleep(200 * 1000);
        fetch(agg.metrics, text, sizeof text);
    } while (test_prom_sample(text, "rl_agg_broadcast_lag_seconds_count") < 1
             && now_s() < until);
    /* Scrapers go by the content type: only /metrics is the exposition
     * format, /agents (rlctl agents' tab-separated lines) is not. */
    test_http_response r;
    test_http_get(agg.metrics, "/metrics", "", &r);
    cr_assert_str_eq(test_http_header(&r, "Content-Type"),
                     "text/plain; version=0.0.4");
    test_http_get(agg.metrics, "/agents", "", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(test_http_header(&r, "Content-Type"),
                     "text/tab-separated-values");
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);

    assert_promtool_passes(text, "rl-aggregator");
    test_prom_histogram h;
    test_prom_histogram_read(text, "rl_agg_redis_write_seconds", &h);
    long long reports = 0;
    const char *results[] = {"applied", "duplicate", "retry"};
    for (int i = 0; i < 3; i++) {
        char series[96];
        snprintf(series, sizeof series, "rl_agg_reports_total{result=\"%s\"}",
                 results[i]);
        reports += test_prom_sample(text, series);
    }
    cr_assert(reports >= 1 && h.count == reports, "%lld Redis writes timed "
              "for %lld reports Redis answered: %s", h.count, reports, text);
    /* Seconds: a loopback round trip is more than a microsecond and less
     * than a second. */
    cr_assert(h.sum / (double)h.count > 1e-6 && h.sum / (double)h.count < 1,
              "mean Redis write %g s", h.sum / (double)h.count);
    test_prom_histogram_read(text, "rl_agg_broadcast_lag_seconds", &h);
    long long published = test_prom_sample(text,
                                           "rl_agg_totals_published_total");
    cr_assert(h.count >= 1 && h.count <= published, "%lld broadcast lags "
              "for %lld totals messages: %s", h.count, published, text);
    /* A total waits for the next publish: at most an interval (200 ms),
     * give or take a late timer. */
    for (int i = 0; i < h.n; i++) {
        if (h.le[i] >= 0.5)
            cr_assert_eq(h.buckets[i], h.count, "le=\"%g\": %lld of %lld "
                         "broadcasts", h.le[i], h.buckets[i], h.count);
    }
}
