/*
 * rl-gateway and issue 15's rules, over real HTTP on loopback: the
 * attributes the gateway supplies (method, path without its query, host
 * without its port, route, plan) reaching rules, the reject body naming the
 * override, shadow rejections logged once a second per rule under load, and
 * SIGHUP reloads (with requests flowing; an invalid config keeps the old
 * one).
 */
#include "redis_server.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_process.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Writes name into the test's folder; returns its path (static). */
static const char *write_file(const char *name, const char *text)
{
    static char path[8][600];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 600, "%s/%d-%s", test_env("RL_TEST_TMPDIR"), (int)getpid(),
             name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

/* One request on its own connection: METHOD target, extra header lines. */
static int request(uint16_t port, const char *method, const char *target,
                   const char *headers, test_http_response *r)
{
    char raw[2048];
    snprintf(raw, sizeof raw, "%s %s HTTP/1.1\r\n%s%s"
             "Content-Length: 0\r\nConnection: close\r\n\r\n", method,
             target, strstr(headers, "Host:") ? "" : "Host: t\r\n",
             headers);
    int fd = test_http_connect(port);
    test_http_exchange(fd, raw, r, 1);
    close(fd);
    r->body[r->body_len < sizeof r->body ? r->body_len
                                         : sizeof r->body - 1] = '\0';
    return r->status;
}

static int status_of(uint16_t port, const char *method, const char *target,
                     const char *headers)
{
    test_http_response r;
    return request(port, method, target, headers, &r);
}

/* Lines of a log matching a grep pattern. */
static int log_count(const char *log, const char *pattern)
{
    char cmd[1024], out[64];
    snprintf(cmd, sizeof cmd, "grep -c -- '%s' %s", pattern, log);
    test_run(cmd, out, sizeof out);
    return atoi(out);
}

/* Waits until the log holds n lines matching pattern (10 s at most). */
static void wait_count(const char *log, const char *pattern, int n)
{
    for (int i = 0; i < 1000 && log_count(log, pattern) < n; i++)
        usleep(10000);
    cr_assert_geq(log_count(log, pattern), n, "%s: fewer than %d '%s'",
                  log, n, pattern);
}

Test(gateway_rules, query_string_is_not_part_of_the_path)
{
    const char *cfg = write_file("path.yaml", "rules:\n"
        "  - {name: per-path, match: path, limit: 2, period: 1h, "
        "mode: local}\n");
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    cr_assert_eq(status_of(gw.port, "GET", "/a?page=1", ""), 200);
    cr_assert_eq(status_of(gw.port, "GET", "/a?page=2", ""), 200);
    cr_assert_eq(status_of(gw.port, "GET", "/a?page=3", ""), 429,
                 "the query string made a new bucket");
    cr_assert_eq(status_of(gw.port, "GET", "/a#frag", ""), 429);
    /* An absolute-form target is its path too. */
    cr_assert_eq(status_of(gw.port, "GET", "http://t/a?x", ""), 429);
    cr_assert_eq(status_of(gw.port, "GET", "/b?page=1", ""), 200);
    test_gateway_stop(&gw);
}

Test(gateway_rules, method_host_and_plan_are_attributes_not_headers)
{
    const char *map = write_file("plans.txt", "# api_key tenant plan\n"
                                 "ak_gold org_a gold\nak_free org_b\n"
                                 "ak_gold2\torg_c\tgold\n");
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "gateway: {tenant_map: %s}\nrules:\n"
             "  - {name: per-method, match: method, limit: 1, period: 1h, "
             "mode: local}\n"
             "  - {name: per-host, match: host, limit: 2, period: 1h, "
             "mode: local}\n"
             "  - {name: per-plan, match: plan, limit: 1, period: 1h, "
             "mode: local}\n", map);
    const char *cfg = write_file("attrs.yaml", yaml);
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    test_http_response r;
    /* method: one DELETE, then DELETE is spent whatever the path; a
     * "method" header does not make a request another method. */
    cr_assert_eq(status_of(gw.port, "DELETE", "/x", ""), 200);
    cr_assert_eq(request(gw.port, "DELETE", "/y", "method: PUT\r\n", &r),
                 429);
    cr_assert(strstr(r.body, "\"rule\":\"per-method\"") != NULL, "%s",
              r.body);
    /* host without its port: h.example:8080 and h.example are one host;
     * another host is another bucket. */
    cr_assert_eq(status_of(gw.port, "PUT", "/", "Host: h.example:8080\r\n"),
                 200);
    /* (PUT is now spent: per-host is counted before per-method says no,
     * so this is the host's second token.) */
    cr_assert_eq(request(gw.port, "PATCH", "/", "Host: h.example\r\n", &r),
                 200);
    cr_assert_eq(request(gw.port, "POST", "/", "Host: h.example:1\r\n", &r),
                 429);
    cr_assert(strstr(r.body, "\"rule\":\"per-host\"") != NULL, "%s",
              r.body);
    /* plan: from the tenant map's third column only. Two gold keys share
     * the gold bucket; a key without a plan is not limited by per-plan; a
     * "plan" header is not a plan. */
    cr_assert_eq(status_of(gw.port, "OPTIONS", "/", "X-Api-Key: ak_gold\r\n"
                           "Host: p1\r\n"), 200);
    cr_assert_eq(request(gw.port, "MKCOL", "/", "X-Api-Key: ak_gold2\r\n"
                         "Host: p2\r\n", &r), 429);
    cr_assert_eq(status_of(gw.port, "GET", "/", "X-Api-Key: ak_free\r\n"
                           "plan: gold\r\nHost: p3\r\n"), 200);
    test_gateway_stop(&gw);
}

/* Issue 15's example: POSTs to /v1/login limited per ip, nothing else. */
Test(gateway_rules, a_when_rule_limits_only_posts_to_its_path)
{
    const char *cfg = write_file("login.yaml", "rules:\n"
        "  - name: login-per-ip\n"
        "    match: ip\n"
        "    when: {method: POST, path: /v1/login}\n"
        "    limit: 2\n    period: 1m\n    mode: local\n");
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(status_of(gw.port, "POST", "/v1/login?next=/", ""), 200);
    test_http_response r;
    cr_assert_eq(request(gw.port, "POST", "/v1/login", "", &r), 429);
    cr_assert(strstr(r.body, "\"rule\":\"login-per-ip\"") != NULL, "%s",
              r.body);
    /* Not a POST, or not that path: the rule does not apply at all. */
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(request(gw.port, "GET", "/v1/login", "", &r), 200);
        cr_assert_null(test_http_header(&r, "RateLimit-Limit"));
        cr_assert_eq(status_of(gw.port, "POST", "/v1/logout", ""), 200);
    }
    test_gateway_stop(&gw);
}

Test(gateway_rules, a_route_scoped_composite_rule_counts_per_key_per_route)
{
    const char *cfg = write_file("routes.yaml",
        "gateway:\n  routes:\n"
        "    - {prefix: /v1/orders, route: orders}\n"
        "    - {prefix: /v1/orders/export, route: export}\n"
        "rules:\n"
        "  - {name: per-key-per-route, match: [api_key, route], limit: 2, "
        "period: 1h, mode: local}\n");
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    const char *k1 = "X-Api-Key: ak_r1\r\n", *k2 = "X-Api-Key: ak_r2\r\n";
    /* /v1/orders/7 and /v1/orders?x are one route, "orders". */
    cr_assert_eq(status_of(gw.port, "GET", "/v1/orders/7", k1), 200);
    cr_assert_eq(status_of(gw.port, "GET", "/v1/orders?x=1", k1), 200);
    cr_assert_eq(status_of(gw.port, "GET", "/v1/orders/8", k1), 429);
    /* The longest prefix wins: export is its own route. */
    cr_assert_eq(status_of(gw.port, "GET", "/v1/orders/export/1", k1), 200);
    /* Another key, same route: its own bucket. */
    cr_assert_eq(status_of(gw.port, "GET", "/v1/orders/7", k2), 200);
    /* No route prefix: the path is the route. */
    cr_assert_eq(status_of(gw.port, "GET", "/v2/a", k1), 200);
    cr_assert_eq(status_of(gw.port, "GET", "/v2/a", k1), 200);
    cr_assert_eq(status_of(gw.port, "GET", "/v2/a", k1), 429);
    cr_assert_eq(status_of(gw.port, "GET", "/v2/b", k1), 200);
    /* Without a key the composite rule does not apply. */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(status_of(gw.port, "GET", "/v1/orders/7", ""), 200);
    test_gateway_stop(&gw);
}

Test(gateway_rules, the_reject_body_names_the_override_and_its_limit)
{
    const char *map = write_file("tiers.txt", "ak_ent org_e enterprise\n"
                                 "ak_basic org_b basic\n");
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "gateway: {tenant_map: %s}\nrules:\n"
             "  - name: per-key\n    match: api_key\n    limit: 1\n"
             "    period: 1h\n    mode: local\n    overrides:\n"
             "      - {when: {plan: enterprise}, limit: 3, name: premium}\n"
             "      - {values: [ak_partner], limit: 2}\n", map);
    const char *cfg = write_file("tiers.yaml", yaml);
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    test_http_response r;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(status_of(gw.port, "GET", "/", "X-Api-Key: ak_ent\r\n"),
                     200);
    cr_assert_eq(request(gw.port, "GET", "/", "X-Api-Key: ak_ent\r\n", &r),
                 429);
    cr_assert_str_eq(r.body, "{\"error\":\"rate_limited\",\"rule\":"
                     "\"per-key\",\"limit\":3,\"period_ms\":3600000,"
                     "\"override\":\"premium\",\"retry_after_s\":1200}\n");
    cr_assert_str_eq(test_http_header(&r, "RateLimit-Policy"),
                     "\"per-key\";q=3;w=3600");
    for (int i = 0; i < 2; i++)
        cr_assert_eq(status_of(gw.port, "GET", "/",
                               "X-Api-Key: ak_partner\r\n"), 200);
    cr_assert_eq(request(gw.port, "GET", "/", "X-Api-Key: ak_partner\r\n",
                         &r), 429);
    cr_assert_str_eq(r.body, "{\"error\":\"rate_limited\",\"rule\":"
                     "\"per-key\",\"limit\":2,\"period_ms\":3600000,"
                     "\"override\":\"overrides[1]\",\"retry_after_s\":1800}\n");
    cr_assert_eq(status_of(gw.port, "GET", "/", "X-Api-Key: ak_basic\r\n"),
                 200);
    cr_assert_eq(request(gw.port, "GET", "/", "X-Api-Key: ak_basic\r\n", &r),
                 429);
    cr_assert_str_eq(r.body, "{\"error\":\"rate_limited\",\"rule\":"
                     "\"per-key\",\"limit\":1,\"period_ms\":3600000,"
                     "\"override\":\"default\",\"retry_after_s\":3600}\n");
    test_gateway_stop(&gw);
}

/* 400 requests a shadow rule would reject, in about 2 s: a handful of
 * lines, whose counts add up to every one of them. */
Test(gateway_rules, shadow_rejections_are_logged_once_a_second_per_rule)
{
    const char *cfg = write_file("shadow.yaml", "rules:\n"
        "  - {name: cap, match: ip, limit: 1, period: 1h, mode: local, "
        "shadow: true}\n");
    char metrics[32];
    test_gateway gw;
    uint16_t mport = test_free_port();
    snprintf(metrics, sizeof metrics, "127.0.0.1:%u", mport);
    test_gateway_start(&gw, cfg, "--metrics", metrics, NULL);
    int fd = test_http_connect(gw.port);
    test_http_response r;
    const char *raw = "GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    int sent = 0;
    do {
        test_http_exchange(fd, raw, &r, 1);
        cr_assert_eq(r.status, 200, "a shadow rule rejected");
        cr_assert_null(test_http_header(&r, "RateLimit-Policy"),
                       "a shadow rule is in the headers");
        sent++;
        if (sent % 200 == 0)
            usleep(1000 * 1000);
    } while (sent < 401);
    close(fd);
    /* The first request is within the limit: 400 would-be rejections. */
    test_http_get(mport, "/metrics", "", &r);
    r.body[r.body_len] = '\0';
    cr_assert_eq(test_prom_sample(r.body, "rl_rule_shadow_rejected_total"
                                  "{rule=\"cap\"}"), 400, "%s", r.body);
    /* Stopping flushes what the limiter held back. */
    test_gateway_stop(&gw);
    int lines = log_count(gw.log, "event=shadow_rejected");
    cr_assert(lines >= 2 && lines <= 6, "%d shadow lines for 400 rejections "
              "in ~2 s", lines);
    /* Every shadow_rejected line is one rejection; its suppressed= and
     * the suppressed lines' count= are the ones held back. */
    char cmd[1024], out[256];
    snprintf(cmd, sizeof cmd, "awk '/event=shadow_rejected rule=cap /"
             "{n++; match($0, /suppressed=[0-9]+/); "
             "h += substr($0, RSTART + 11, RLENGTH - 11)} "
             "/event=shadow_rejected_suppressed rule=cap /"
             "{match($0, /count=[0-9]+/); "
             "h += substr($0, RSTART + 6, RLENGTH - 6)} "
             "END {print n + 0, h + 0}' %s", gw.log);
    test_run(cmd, out, sizeof out);
    int logged = -1, held = -1;
    cr_assert_eq(sscanf(out, "%d %d", &logged, &held), 2, "%s", out);
    cr_assert_geq(logged, 2, "%s", out);
    cr_assert_eq(logged + held, 400, "logged %d + held back %d", logged,
                 held);
}

/* --- reload -------------------------------------------------------------- */

static const char reload_a[] = "rules:\n"
    "  - {name: per-key, match: api_key, limit: 3, period: 1h, "
    "mode: local}\n";
static const char reload_b[] = "rules:\n"
    "  - {name: per-key, match: api_key, limit: 5, period: 1h, "
    "mode: local}\n"
    "  - {name: per-path, match: path, limit: 1000000, period: 1h, "
    "mode: local}\n";

static int allowed_of(uint16_t port, const char *key, int n)
{
    char h[128];
    snprintf(h, sizeof h, "X-Api-Key: %s\r\n", key);
    int allowed = 0;
    for (int i = 0; i < n; i++)
        allowed += status_of(port, "GET", "/", h) == 200;
    return allowed;
}

Test(gateway_rules, an_invalid_config_on_sighup_keeps_the_old_one)
{
    const char *cfg = write_file("keep.yaml", reload_a);
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    write_file("keep.yaml", "rules:\n  - {name: per-key, match: api_key, "
               "limit: 0, period: 1h}\n");
    kill(gw.pid, SIGHUP);
    wait_count(gw.log, "event=reload_failed", 1);
    write_file("keep.yaml", "rules: [\n");
    kill(gw.pid, SIGHUP);
    wait_count(gw.log, "event=reload_failed", 2);
    cr_assert_eq(log_count(gw.log, "keep.yaml:1"), 1, "the YAML error "
                 "names the file and line");
    cr_assert_eq(log_count(gw.log, "event=reloaded"), 0);
    /* Still serving, under the old limit. */
    cr_assert_eq(allowed_of(gw.port, "ak_keep", 6), 3);
    test_gateway_stop(&gw);
}

typedef struct load {
    uint16_t port;
    atomic_bool stop;
    atomic_int sent, failed;
} load;

/* Keep-alive requests, one connection per thread, until told to stop. */
static void *send_load(void *arg)
{
    load *l = arg;
    int fd = test_http_connect(l->port);
    test_http_response r;
    char raw[256];
    snprintf(raw, sizeof raw, "GET /load HTTP/1.1\r\nHost: t\r\n"
             "X-Api-Key: ak_load_%lu\r\n\r\n",
             (unsigned long)pthread_self() % 1000);
    while (!atomic_load(&l->stop)) {
        test_http_exchange(fd, raw, &r, 1);
        atomic_fetch_add(&l->sent, 1);
        if (r.status != 200 && r.status != 429)
            atomic_fetch_add(&l->failed, 1);
    }
    close(fd);
    return NULL;
}

Test(gateway_rules, sighup_under_load_drops_nothing_and_the_new_limit_holds)
{
    const char *cfg = write_file("live.yaml", reload_a);
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    load l = {.port = gw.port};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, send_load, &l);
    for (int i = 1; i <= 20; i++) {
        write_file("live.yaml", i % 2 ? reload_b : reload_a);
        kill(gw.pid, SIGHUP);
        wait_count(gw.log, "event=reloaded ", i);
        /* Right after the reload: the limit of the config just loaded,
         * on a key no one has used. */
        char key[64];
        snprintf(key, sizeof key, "ak_after_%d_%d", (int)getpid(), i);
        cr_assert_eq(allowed_of(gw.port, key, 7), i % 2 ? 5 : 3,
                     "reload %d: the new limit is not in force", i);
    }
    atomic_store(&l.stop, true);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_assert_gt(atomic_load(&l.sent), 100);
    cr_assert_eq(atomic_load(&l.failed), 0);
    /* The diff was logged: per-path came and went ten times each. */
    cr_assert_eq(log_count(gw.log, "change=\"rule per-path added: path, "
                           "1000000 per 1h, local\""), 10);
    cr_assert_eq(log_count(gw.log, "change=\"rule per-key: limit 3 -> 5\""),
                 10);
    cr_assert_eq(log_count(gw.log, "change=\"rule per-path removed\""), 10);
    test_gateway_stop(&gw);
}
