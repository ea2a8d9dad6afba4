/*
 * ngx_http_rl_module inside Debian's nginx, end to end: real nginx
 * processes (master and workers) on loopback, each in its own prefix with
 * its own config, pid file and error log, started and stopped by the test
 * (also when it fails: see nginx_fini). Three instances sharing one exact
 * bucket, the 429's headers and body, `nginx -t` on a bad rules file,
 * synced and local rules, a silent Redis, a reload under traffic, a
 * request checked once through internal redirects and subrequests, and
 * the workers' own files: a TLS key only root can read refused at
 * `nginx -t`, a start and a reload, and a worker whose agent cannot open
 * serving by on_error until it can; rl_cost_after charging what a slow
 * upstream's X-Cost says, and a request's estimate when its client goes;
 * in_flight slots held while the upstream has a request.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_process.h"
#include "test_upstream.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NGINX_BIN "/usr/sbin/nginx"
#define NGINX_MAX 4

/* What nginx runs under: "env" with, in a sanitizer build, the sanitizer's
 * runtime preloaded (RL_TEST_NGINX_PRELOAD, from the Makefile). The module
 * is built with the tests' sanitizer but nginx is not, and a sanitizer's
 * runtime must be loaded before any library that needs it. Leak detection
 * is off for nginx: it leaves its cycle's memory to the process's exit,
 * which LeakSanitizer would report as nginx's leaks, not the module's. */
static const char *nginx_env(void)
{
    static char env[1024];
    const char *preload = getenv("RL_TEST_NGINX_PRELOAD");
    const char *asan = getenv("ASAN_OPTIONS");
    if (preload == NULL || preload[0] == '\0')
        return "env";
    snprintf(env, sizeof env,
             "env LD_PRELOAD=%s ASAN_OPTIONS=%s%sdetect_leaks=0", preload, asan != NULL ? asan : "",
             asan != NULL && asan[0] != '\0' ? ":" : "");
    return env;
}

typedef struct test_nginx {
    pid_t pid;          /* the master, in its own process group */
    uint16_t port;
    char dir[512];      /* prefix: nginx.conf, html/, nginx.pid */
    char conf[600];
    char log[600];      /* error_log and stderr, in RL_TEST_LOGDIR */
    /* An [alert] or [emerg] line holding this is the test's own doing
     * (a worker it killed, a reload it made fail), not a failure; NULL:
     * none. */
    const char *expected_alert;
} test_nginx;

/* The process groups of every nginx this test process started, for
 * nginx_fini: workers do not die with the test (only the master gets
 * PR_SET_PDEATHSIG), so a failed test must still stop them all. Kept
 * here, not in the test's own (stack) structs, which a failed assertion
 * leaves behind. */
static pid_t started[NGINX_MAX];

static void nginx_fini(void)
{
    for (int i = 0; i < NGINX_MAX; i++) {
        if (started[i] > 0) {
            kill(-started[i], SIGKILL);
            waitpid(started[i], NULL, WNOHANG);
            started[i] = 0;
        }
    }
}

TestSuite(nginx, .fini = nginx_fini);

/* A key no other test (or earlier run) has used. */
static void unique(char *buf, size_t cap, const char *stem)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, cap, "%s_%d_%ld%09ld", stem, (int)getpid(),
             (long)ts.tv_sec, ts.tv_nsec);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

/* The config of one instance: the module, workers, its own paths, the rl
 * block (rl_config, rl_attr lines) and server-level lines. An access log
 * records each request's decision. */
static void nginx_prepare(test_nginx *ngx, int workers, const char *rules,
                          const char *http, const char *server)
{
    static int serial;
    memset(ngx, 0, sizeof *ngx);
    snprintf(ngx->dir, sizeof ngx->dir, "%s/nginx-%d-%d",
             test_env("RL_TEST_TMPDIR"), (int)getpid(), ++serial);
    snprintf(ngx->conf, sizeof ngx->conf, "%s/nginx.conf", ngx->dir);
    test_log_path(ngx->log, sizeof ngx->log, "nginx");
    char path[700];
    cr_assert_eq(mkdir(ngx->dir, 0755), 0);
    /* Workers run as another user when the tests run as root: the
     * prefix must be theirs to read. */
    chmod(test_env("RL_TEST_TMPDIR"), 0755);
    snprintf(path, sizeof path, "%s/html", ngx->dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/html/index.html", ngx->dir);
    write_file(path, "hello\n");
    snprintf(path, sizeof path, "%s/html/fallback.html", ngx->dir);
    write_file(path, "fallback\n");
    snprintf(path, sizeof path, "%s/html/auth.html", ngx->dir);
    write_file(path, "yes\n");
    snprintf(path, sizeof path, "%s/html/api", ngx->dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/html/api/index.html", ngx->dir);
    write_file(path, "api\n");
    ngx->port = test_free_port();
    cr_assert_neq(ngx->port, 0);
    char conf[8192];
    snprintf(conf, sizeof conf,
             "load_module %s;\n"
             "worker_processes %d;\n"
             "error_log %s info;\n"
             "pid %s/nginx.pid;\n"
             "events { worker_connections 512; }\n"
             "http {\n"
             "    log_format rl '$status $rl_decision $rl_rule $rl_remaining';\n"
             "    access_log %s/access.log rl;\n"
             "    client_body_temp_path %s/body;\n"
             "    proxy_temp_path %s/proxy;\n"
             "    fastcgi_temp_path %s/fastcgi;\n"
             "    uwsgi_temp_path %s/uwsgi;\n"
             "    scgi_temp_path %s/scgi;\n"
             "    rl_config %s;\n"
             "    rl_attr api_key $http_x_api_key;\n"
             "    rl_attr tenant $http_x_tenant;\n"
             "    rl_attr ip $remote_addr;\n"
             "%s"
             "    server {\n"
             "        listen 127.0.0.1:%u;\n"
             "        root %s/html;\n"
             "        add_header X-RL-Decision $rl_decision always;\n"
             "        add_header X-RL-Remaining $rl_remaining always;\n"
             "%s"
             "    }\n"
             "}\n",
             test_env("RL_TEST_NGINX_MODULE"), workers, ngx->log, ngx->dir,
             ngx->dir, ngx->dir, ngx->dir, ngx->dir, ngx->dir, ngx->dir,
             rules, http, ngx->port, ngx->dir, server);
    write_file(ngx->conf, conf);
}

static bool port_answers(uint16_t port)
{
    char cmd[128], out[64];
    snprintf(cmd, sizeof cmd, "exec 3<>/dev/tcp/127.0.0.1/%u", port);
    char full[256];
    snprintf(full, sizeof full, "bash -c '%s' 2>/dev/null", cmd);
    return test_run(full, out, sizeof out) == 0;
}

/* Starts nginx in the foreground (its master is our child) in a process
 * group of its own, and waits until it accepts connections with all its
 * workers started. */
static void nginx_start(test_nginx *ngx, int workers)
{
    cr_assert_eq(access(NGINX_BIN, X_OK), 0, NGINX_BIN " is not installed: "
                 "make test installs nginx through make deps (as root)");
    char cmd_line[2400];
    snprintf(cmd_line, sizeof cmd_line, "exec %s /usr/bin/setsid %s -p %s "
             "-c %s -g 'daemon off;'", nginx_env(), NGINX_BIN, ngx->dir,
             ngx->conf);
    char *argv[] = {"/bin/sh", "-c", cmd_line, NULL};
    ngx->pid = test_spawn(argv, ngx->log);
    for (int i = 0; i < NGINX_MAX; i++) {
        if (started[i] == 0) {
            started[i] = ngx->pid;
            break;
        }
    }
    char want[32];
    snprintf(want, sizeof want, "%d", workers);
    char cmd[800], out[64];
    snprintf(cmd, sizeof cmd, "grep -c 'start worker process' %s", ngx->log);
    for (int waited = 0; waited < 15000; waited += 20) {
        if (waitpid(ngx->pid, NULL, WNOHANG) != 0) {
            ngx->pid = 0;
            test_show_log(ngx->log);
            cr_assert_fail("nginx exited at start; see %s", ngx->log);
        }
        test_run(cmd, out, sizeof out);
        if (atoi(out) >= workers && port_answers(ngx->port))
            return;
        usleep(20 * 1000);
    }
    test_show_log(ngx->log);
    cr_assert_fail("nginx did not listen on %u with %d workers within 15 s",
                   ngx->port, workers);
}

/* Graceful stop (SIGQUIT: the workers finish their requests and close
 * their agents, flushing synced counts). Asserts a clean exit and no
 * alert in the error log (nginx logs one for a socket left open). */
static void nginx_stop(test_nginx *ngx)
{
    if (ngx->pid <= 0)
        return;
    pid_t pid = ngx->pid;
    kill(pid, SIGQUIT);
    int status = 0;
    pid_t done = 0;
    for (int waited = 0; waited < 20000 && done == 0; waited += 20) {
        done = waitpid(pid, &status, WNOHANG);
        if (done == 0)
            usleep(20 * 1000);
    }
    if (done == 0) {
        test_show_log(ngx->log);
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        ngx->pid = 0;
        cr_assert_fail("nginx did not stop within 20 s of SIGQUIT");
    }
    ngx->pid = 0;
    /* the workers are gone with the master; anything left is killed */
    kill(-pid, SIGKILL);
    for (int i = 0; i < NGINX_MAX; i++) {
        if (started[i] == pid)
            started[i] = 0;
    }
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "nginx exited with status %d", status);
    char cmd[700], out[4096];
    snprintf(cmd, sizeof cmd, "grep -E '\\[(alert|emerg|crit)\\]' %s%s%s%s",
             ngx->log, ngx->expected_alert != NULL ? " | grep -vF '" : "",
             ngx->expected_alert != NULL ? ngx->expected_alert : "",
             ngx->expected_alert != NULL ? "'" : "");
    if (test_run(cmd, out, sizeof out) == 0)
        cr_assert_fail("nginx logged:\n%s", out);
}

/* One GET on its own connection with an API key (and more header lines,
 * or ""). */
static void get(uint16_t port, const char *path, const char *key,
                const char *more, test_http_response *r)
{
    char headers[512];
    snprintf(headers, sizeof headers, "X-Api-Key: %s\r\n%s", key, more);
    test_http_get(port, path, headers, r);
}

static long header_num(const test_http_response *r, const char *name)
{
    const char *v = test_http_header(r, name);
    cr_assert_not_null(v, "no %s header (status %d)", name, r->status);
    return atol(v);
}

/* --- (a) Three instances, two workers each, one exact bucket. ---------- */

/* The period is an hour, not a minute: at 100 a minute a token comes back
 * every 0.6 s, and 200 requests on a loaded machine may take longer. */
Test(nginx, three_instances_share_one_exact_bucket)
{
    const char *cfg = test_store_config("nginx-exact",
        "  - {name: per-key, match: api_key, limit: 100, period: 1h}\n");
    test_nginx ngx[3];
    for (int i = 0; i < 3; i++) {
        nginx_prepare(&ngx[i], 2, cfg, "",
                      "        location / { rl on; }\n");
        nginx_start(&ngx[i], 2);
    }
    char key[96];
    unique(key, sizeof key, "ak_ngx");
    int allowed = 0, rejected = 0;
    test_http_response r, last_429 = {0};
    for (int i = 0; i < 200; i++) {
        get(ngx[i % 3].port, "/index.html", key, "", &r);
        cr_assert(r.status == 200 || r.status == 429, "status %d", r.status);
        if (r.status == 200) {
            allowed++;
            r.body[r.body_len] = '\0';
            cr_assert_str_eq(r.body, "hello\n");
            cr_assert_eq(header_num(&r, "RateLimit-Remaining"), 100 - allowed,
                         "the allowed response's RateLimit headers");
            cr_assert_str_eq(test_http_header(&r, "X-RL-Decision"),
                             "allowed");
        } else {
            rejected++;
            last_429 = r;
        }
    }
    cr_assert_eq(allowed, 100, "three nginx let %d through", allowed);
    cr_assert_eq(rejected, 100);

    /* rl-gateway's 429, word for word: Retry-After in whole seconds
     * rounded up (a token per 36 s), the RateLimit headers, the body. */
    cr_assert_not_null(test_http_header(&last_429, "RateLimit"));
    cr_assert_str_eq(test_http_header(&last_429, "X-RL-Decision"),
                     "rejected");
    test_expect_rate_limited(&last_429, "per-key", 100, 3600);
    for (int i = 0; i < 3; i++)
        nginx_stop(&ngx[i]);
}

/* --- (b) nginx -t. ---------------------------------------------------- */

Test(nginx, config_test_fails_on_a_bad_rules_file_with_rls_message)
{
    const char *bad = test_write_config("nginx-bad",
        "store: {url: \"redis://127.0.0.1:1\"}\n"
        "rules:\n"
        "  - {name: per-key, match: api_key, limit: -3, period: 1m}\n");
    char bad_path[600];
    snprintf(bad_path, sizeof bad_path, "%s", bad);
    test_nginx ngx;
    nginx_prepare(&ngx, 1, bad_path, "", "        location / { rl on; }\n");
    char cmd[2400], out[8192];
    snprintf(cmd, sizeof cmd, "%s %s -t -p %s -c %s 2>&1", nginx_env(),
             NGINX_BIN, ngx.dir, ngx.conf);
    cr_assert_neq(test_run(cmd, out, sizeof out), 0, "nginx -t passed: %s",
                  out);
    char want[700];
    snprintf(want, sizeof want, "rl_config: %s:3:", bad_path);
    cr_assert(strstr(out, want) != NULL, "no '%s' in: %s", want, out);
    cr_assert(strstr(out, "rules[0].limit") != NULL, "no field in: %s", out);
    cr_assert(strstr(out, "test failed") != NULL, "%s", out);

    /* The same nginx config with good rules passes, and nginx -t opens no
     * agent: the store's address is a closed port, and no worker runs. */
    const char *good = test_write_config("nginx-good",
        "store: {url: \"redis://127.0.0.1:1\"}\n"
        "rules:\n"
        "  - {name: per-key, match: api_key, limit: 3, period: 1m}\n");
    test_nginx ok;
    nginx_prepare(&ok, 1, good, "", "        location / { rl on; }\n");
    snprintf(cmd, sizeof cmd, "%s %s -t -p %s -c %s 2>&1", nginx_env(),
             NGINX_BIN, ok.dir, ok.conf);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);

    /* "rl on" without rules is a config error too, naming the fix. */
    test_nginx none;
    nginx_prepare(&none, 1, good, "", "        location / { rl on; }\n");
    snprintf(cmd, sizeof cmd, "sed -i '/rl_config/d' %s && %s %s -t -p %s "
             "-c %s 2>&1", none.conf, nginx_env(), NGINX_BIN, none.dir,
             none.conf);
    cr_assert_neq(test_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"rl on\" needs the rules") != NULL, "%s", out);
}

/* --- (c) Synced and local rules. -------------------------------------- */

/* The synced rules here have names no other test uses: an aggregator
 * counts a rule's fleet in the Redis every test shares (by rule name), and
 * these workers would make another test's one agent one of many. */

Test(nginx, synced_counts_reach_the_aggregator_and_a_local_bucket_binds_in_its_worker)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: nginx-synced, match: tenant, limit: 1000, "
                          "period: 1h, mode: synced}\n"
                          "  - {name: per-ip, match: ip, limit: 5, period: 1h, "
                          "mode: local}\n", 200, NULL);
    test_aggregator_wait_ready(&agg);
    test_nginx ngx;
    nginx_prepare(&ngx, 1, agg.config, "",
                  "        location / { rl on; }\n");
    nginx_start(&ngx, 1);

    char tenant[96], more[160];
    unique(tenant, sizeof tenant, "org_ngx");
    snprintf(more, sizeof more, "X-Tenant: %s\r\n", tenant);
    test_http_response r;
    /* The local rule (5 per ip in this worker) and the synced rule both
     * apply to every request from 127.0.0.1: the local one binds. */
    int allowed = 0;
    for (int i = 0; i < 8; i++) {
        get(ngx.port, "/index.html", "", more, &r);
        cr_assert(r.status == 200 || r.status == 429, "status %d", r.status);
        allowed += r.status == 200;
        if (r.status == 429) {
            r.body[r.body_len] = '\0';
            cr_assert(strstr(r.body, "\"rule\":\"per-ip\"") != NULL, "%s",
                      r.body);
        }
    }
    cr_assert_eq(allowed, 5, "one worker's local bucket of 5 let %d through",
                 allowed);
    nginx_stop(&ngx);
    /* The 8 requests were all counted by the synced rule (charge: all),
     * and the agent's close flushed them to the aggregator. */
    char key[160];
    snprintf(key, sizeof key, "rl:tenant:%s", tenant);
    test_expect_window_total(key, 8, 10000);
    test_aggregator_stop(&agg);
}

/* --- (d) A silent Redis. ---------------------------------------------- */

static uint64_t now_ms(void)
{
    return test_now_ms();
}

static void send_raw(int fd, const char *raw)
{
    size_t len = strlen(raw);
    cr_assert_eq(write(fd, raw, len), (ssize_t)len);
}

Test(nginx, a_silent_redis_delays_only_checked_requests_and_degrades_them)
{
    test_redis srv;
    char err[512];
    test_redis_options o = {0};
    cr_assert_eq(test_redis_start(&srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://127.0.0.1:%u\", timeout_ms: 1000}\n"
             "rules:\n"
             "  - {name: per-key, match: api_key, limit: 100, period: 1h, "
             "on_error: allow}\n", srv.port);
    const char *cfg = test_write_config("nginx-silent", yaml);
    test_nginx ngx;
    /* one worker: the unchecked location is served by the very worker
     * whose checked requests wait */
    nginx_prepare(&ngx, 1, cfg, "",
                  "        location /api/ { rl on; }\n"
                  "        location / { }\n");
    nginx_start(&ngx, 1);
    char key[96];
    unique(key, sizeof key, "ak_silent");
    test_http_response r;
    get(ngx.port, "/api/index.html", key, "", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(test_http_header(&r, "X-RL-Decision"), "allowed");
    r.body[r.body_len] = '\0';
    cr_assert_str_eq(r.body, "api\n");

    test_redis_pause(&srv);
    enum { WAITING = 5 };
    int fds[WAITING];
    char raw[256];
    snprintf(raw, sizeof raw, "GET /api/index.html HTTP/1.1\r\nHost: t\r\n"
             "X-Api-Key: %s\r\n\r\n", key);
    uint64_t sent = now_ms();
    for (int i = 0; i < WAITING; i++) {
        fds[i] = test_http_connect(ngx.port);
        send_raw(fds[i], raw);
    }
    /* Meanwhile the same worker serves the location without rl. */
    int served = 0;
    uint64_t slowest = 0;
    for (int i = 0; i < 20; i++) {
        uint64_t t0 = now_ms();
        get(ngx.port, "/index.html", key, "", &r);
        cr_assert_eq(r.status, 200);
        uint64_t took = now_ms() - t0;
        slowest = took > slowest ? took : slowest;
        served++;
    }
    uint64_t free_done = now_ms() - sent;
    struct pollfd pfd[WAITING];
    for (int i = 0; i < WAITING; i++)
        pfd[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    int ready = poll(pfd, WAITING, 0);
    fprintf(stderr, "nginx: Redis stopped: 20 unchecked requests in %llu ms "
            "(slowest %llu ms) while 5 checked ones waited\n",
            (unsigned long long)free_done, (unsigned long long)slowest);
    cr_assert_eq(served, 20);
    if (free_done < 800)
        cr_assert_eq(ready, 0, "a checked request was answered within "
                     "%llu ms of a stopped Redis, before its deadline",
                     (unsigned long long)free_done);
    cr_assert_lt(free_done, 1000, "the unchecked location waited for the "
                 "store: 20 requests took %llu ms",
                 (unsigned long long)free_done);

    for (int i = 0; i < WAITING; i++) {
        test_http_exchange(fds[i], "", &r, 1);
        uint64_t after = now_ms() - sent;
        cr_assert_eq(r.status, 200);
        cr_assert_str_eq(test_http_header(&r, "X-RL-Decision"), "degraded");
        cr_assert_not_null(test_http_header(&r, "RateLimit-Degraded"));
        cr_assert_leq(after, 1000 + 750, "answered %llu ms after the "
                      "request, deadline 1000 ms",
                      (unsigned long long)after);
        close(fds[i]);
    }
    test_redis_resume(&srv);
    nginx_stop(&ngx);
    char cmd[700], out[256];
    snprintf(cmd, sizeof cmd, "grep -c ' degraded per-key' %s/access.log",
             ngx.dir);
    test_run(cmd, out, sizeof out);
    cr_assert_eq(atoi(out), WAITING, "access log: %s", out);
    test_redis_stop(&srv);
}

/* --- (e) A reload under traffic. -------------------------------------- */

typedef struct traffic {
    uint16_t port;
    char tenant[96];
    atomic_bool stop;
    atomic_int ok, failed, sent;
} traffic;

/* A client without Criterion asserts (they belong to the test's thread):
 * one request per connection, as clients across a reload would; the
 * status, or -1 when the connection failed. */
static int one_request(const traffic *t)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(t->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char buf[4096];
    int len = snprintf(buf, sizeof buf, "GET /index.html HTTP/1.1\r\n"
                       "Host: t\r\nX-Tenant: %s\r\nConnection: close\r\n"
                       "\r\n", t->tenant);
    int status = -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0
        && write(fd, buf, (size_t)len) == len) {
        size_t got = 0;
        ssize_t n;
        while (got < sizeof buf - 1
               && (n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
            got += (size_t)n;
        buf[got] = '\0';
        if (sscanf(buf, "HTTP/1.1 %d", &status) != 1)
            status = -1;
    }
    close(fd);
    return status;
}

static void *send_traffic(void *arg)
{
    traffic *t = arg;
    while (!atomic_load(&t->stop)) {
        atomic_fetch_add(&t->sent, 1);
        if (one_request(t) == 200)
            atomic_fetch_add(&t->ok, 1);
        else
            atomic_fetch_add(&t->failed, 1);
    }
    return NULL;
}

/* A closing worker gives its last report two sync intervals for its ack:
 * under a sanitizer on a busy machine 2 x 200 ms can pass before the
 * aggregator answers, which is an aggregator not taking reports, not a
 * count lost at a reload. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define RELOAD_SYNC_MS 500
#else
#define RELOAD_SYNC_MS 200
#endif

Test(nginx, reload_under_traffic_fails_no_request_and_loses_no_synced_count)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: nginx-reload, match: tenant, "
                          "limit: 1000000, period: 1h, mode: synced}\n",
                          RELOAD_SYNC_MS, NULL);
    test_aggregator_wait_ready(&agg);
    test_nginx ngx;
    nginx_prepare(&ngx, 2, agg.config, "", "        location / { rl on; }\n");
    nginx_start(&ngx, 2);
    traffic t = {.port = ngx.port};
    unique(t.tenant, sizeof t.tenant, "org_reload");
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, send_traffic, &t);
    test_sleep_ms(500);
    kill(ngx.pid, SIGHUP);
    test_sleep_ms(1000);
    kill(ngx.pid, SIGHUP);
    test_sleep_ms(1000);
    atomic_store(&t.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    int ok = atomic_load(&t.ok), failed = atomic_load(&t.failed);
    fprintf(stderr, "nginx: two reloads under traffic: %d answered 200, "
            "%d failed\n", ok, failed);
    cr_assert_eq(failed, 0, "%d of %d requests failed across the reloads",
                 failed, atomic_load(&t.sent));
    cr_assert_gt(ok, 20, "too little traffic to show anything: %d", ok);
    char cmd[700], out[64];
    snprintf(cmd, sizeof cmd, "grep -c 'SIGHUP) received' %s", ngx.log);
    test_run(cmd, out, sizeof out);
    cr_assert_eq(atoi(out), 2, "nginx did not reload twice");
    nginx_stop(&ngx);
    char key[160];
    snprintf(key, sizeof key, "rl:tenant:%s", t.tenant);
    test_expect_window_total(key, ok, 10000);
    test_aggregator_stop(&agg);
}

/* --- (f) Once per client request. ------------------------------------- */

Test(nginx, internal_redirects_and_subrequests_are_checked_once)
{
    /* per-tenant applies to no request here (none has an X-Tenant): an
     * empty attribute value is no key, not a request to refuse. */
    const char *cfg = test_store_config("nginx-once",
        "  - {name: per-key, match: api_key, limit: 100, period: 1h}\n"
        "  - {name: per-tenant, match: tenant, limit: 1, period: 1h}\n");
    test_nginx ngx;
    nginx_prepare(&ngx, 1, cfg, "",
                  "        location /try/ { rl on; try_files $uri "
                  "/fallback.html; }\n"
                  "        location = /fallback.html { rl on; }\n"
                  "        location /missing/ { rl on; error_page 404 "
                  "/fallback.html; }\n"
                  "        location /guarded/ { rl on; auth_request "
                  "/auth.html; try_files $uri /index.html; }\n"
                  "        location = /auth.html { rl on; }\n"
                  "        location /rewritten/ { rl on; rewrite ^ "
                  "/index.html last; }\n"
                  "        location = /index.html { rl on; }\n"
                  "        location /api/ { auth_request /auth.html; }\n");
    nginx_start(&ngx, 1);
    char key[96];
    unique(key, sizeof key, "ak_once");
    static const struct {
        const char *path;
        int status;
        const char *body;
    } cases[] = {
        {"/try/nothing-here", 200, "fallback\n"},
        {"/missing/nothing-here", 404, "fallback\n"},
        {"/guarded/x", 200, "hello\n"},
        {"/rewritten/x", 200, "hello\n"},
        {"/fallback.html", 200, "fallback\n"},
    };
    test_http_response r;
    long expect = 100;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        get(ngx.port, cases[i].path, key, "", &r);
        expect--;
        cr_assert_eq(r.status, cases[i].status, "%s: %d", cases[i].path,
                     r.status);
        r.body[r.body_len] = '\0';
        cr_assert_str_eq(r.body, cases[i].body, "%s", cases[i].path);
        cr_assert_eq(header_num(&r, "RateLimit-Remaining"), expect,
                     "%s charged %ld times", cases[i].path,
                     expect + 1 - header_num(&r, "RateLimit-Remaining"));
        cr_assert_eq(header_num(&r, "X-RL-Remaining"), expect,
                     "%s: $rl_remaining", cases[i].path);
    }
    /* A location without rl is not checked, nor is its auth_request
     * subrequest to a location with rl: subrequests are never checked. */
    get(ngx.port, "/api/index.html", key, "", &r);
    cr_assert_eq(r.status, 200, "/api/index.html: %d", r.status);
    get(ngx.port, "/index.html", key, "", &r);
    cr_assert_eq(header_num(&r, "RateLimit-Remaining"), expect - 1,
                 "the auth_request subrequest of /api/index.html was "
                 "charged");
    nginx_stop(&ngx);
}

/* --- (g) The workers' own files. -------------------------------------- */

/* The tests run as root, so nginx's workers run as nginx's default user,
 * nobody (group nogroup): a file of mode 0600 owned by root is the
 * master's to read and not theirs. */

/* A self-signed certificate and its key in a folder of their own (every
 * user may enter it), and a config whose agents dial a tls+tcp://
 * aggregator with them: an agent reads them at open, before any dial (no
 * aggregator needs to listen). per-key is exact, on_error: deny, on the
 * tests' Redis; per-tenant is synced, so that the agent dials at all. */
typedef struct tls_rules {
    char dir[512];
    char key[600];
    const char *config;
} tls_rules;

static void tls_rules_write(tls_rules *t, const char *name)
{
    static int serial;
    snprintf(t->dir, sizeof t->dir, "%s/%s-%d-%d", test_env("RL_TEST_TMPDIR"),
             name, (int)getpid(), ++serial);
    cr_assert_eq(mkdir(t->dir, 0755), 0);
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "cd %s && openssl req -x509 -newkey rsa:2048 "
             "-nodes -days 2 -subj /CN=localhost -keyout k.key -out k.pem "
             "2>&1 && chmod 644 k.pem", t->dir);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(t->key, sizeof t->key, "%s/k.key", t->dir);
    char yaml[4096];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 1000}\n"
             "aggregator:\n"
             "  reports: \"tls+tcp://127.0.0.1:%u\"\n"
             "  totals: \"tls+tcp://127.0.0.1:%u\"\n"
             "  tls: {ca: %s/k.pem, cert: %s/k.pem, key: %s}\n"
             "rules:\n"
             "  - {name: per-key, match: api_key, limit: 100, period: 1h, "
             "on_error: deny}\n"
             "  - {name: nginx-files, match: tenant, limit: 100, "
             "period: 1h, mode: synced}\n",
             test_env("RL_TEST_REDIS"), test_free_port(), test_free_port(),
             t->dir, t->dir, t->key);
    t->config = test_write_config(name, yaml);
}

static void key_mode(const tls_rules *t, const char *mode)
{
    char cmd[1600], out[256];
    snprintf(cmd, sizeof cmd, "chown root:root %s && chmod %s %s", t->key,
             mode, t->key);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
}

static int config_test(const test_nginx *ngx, char *out, size_t cap)
{
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "%s %s -t -p %s -c %s 2>&1", nginx_env(),
             NGINX_BIN, ngx->dir, ngx->conf);
    return test_run(cmd, out, cap);
}

/* The worker processes' ids, in ascending order, as one string. */
static void worker_pids(const test_nginx *ngx, char *out, size_t cap)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd, "pgrep -P $(cat %s/nginx.pid) | sort -n | "
             "tr '\\n' ' '", ngx->dir);
    test_run(cmd, out, cap);
}

/* Lines of the error log holding text. */
static int log_count(const test_nginx *ngx, const char *text)
{
    char cmd[1200], out[64];
    snprintf(cmd, sizeof cmd, "grep -cF \"%s\" %s", text, ngx->log);
    test_run(cmd, out, sizeof out);
    return atoi(out);
}

Test(nginx, a_key_only_root_can_read_fails_nginx_t_and_a_start_naming_it)
{
    tls_rules t;
    tls_rules_write(&t, "nginx-rootkey");
    key_mode(&t, "600");
    test_nginx ngx;
    nginx_prepare(&ngx, 2, t.config, "", "        location / { rl on; }\n");
    char out[8192], want[2400];
    /* Before: `nginx -t` passed (the master reads as root), and neither
     * of the two workers stayed up. */
    cr_assert_neq(config_test(&ngx, out, sizeof out), 0,
                  "nginx -t passed with a key its workers cannot read: %s",
                  out);
    snprintf(want, sizeof want, "rl_config: %s: aggregator.tls.key: cannot "
             "read '%s': Permission denied (as the workers' user \"nobody\"",
             t.config, t.key);
    cr_assert(strstr(out, want) != NULL, "no '%s' in: %s", want, out);
    cr_assert(strstr(out, "test failed") != NULL, "%s", out);

    /* A start is refused the same way: the master exits at once, 1. */
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "%s %s -p %s -c %s -g 'daemon off;' 2>&1",
             nginx_env(), NGINX_BIN, ngx.dir, ngx.conf);
    cr_assert_eq(test_run(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, want) != NULL, "no '%s' in: %s", want, out);

    /* Readable by the workers' group (nogroup), not by others: the check
     * goes by the workers' groups too; both workers start and serve. */
    snprintf(cmd, sizeof cmd, "chgrp nogroup %s && chmod 640 %s", t.key,
             t.key);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert_eq(config_test(&ngx, out, sizeof out), 0, "%s", out);
    nginx_start(&ngx, 2);
    char key[96];
    unique(key, sizeof key, "ak_rootkey");
    test_http_response r;
    for (int i = 0; i < 4; i++) {
        get(ngx.port, "/index.html", key, "", &r);
        cr_assert_eq(r.status, 200, "request %d: %d", i, r.status);
        cr_assert_str_eq(test_http_header(&r, "X-RL-Decision"), "allowed");
    }
    cr_assert_eq(log_count(&ngx, "the agent did not open"), 0);
    nginx_stop(&ngx);
}

Test(nginx, a_reload_with_a_key_the_workers_cannot_read_keeps_the_old_workers)
{
    tls_rules t;
    tls_rules_write(&t, "nginx-reloadkey");
    key_mode(&t, "644");
    test_nginx ngx;
    nginx_prepare(&ngx, 2, t.config, "", "        location / { rl on; }\n");
    ngx.expected_alert = "aggregator.tls.key: cannot read";
    nginx_start(&ngx, 2);
    /* Both workers' agents open (a slow, sanitizer, worker may still be
     * opening it when the port answers) before the key is taken away. */
    for (int waited = 0; waited < 10000
         && log_count(&ngx, "event=store_ready") < 2; waited += 50)
        test_sleep_ms(50);
    cr_assert_geq(log_count(&ngx, "event=store_ready"), 2, "the workers' "
                  "agents did not open");
    char before[256], after[256];
    worker_pids(&ngx, before, sizeof before);

    key_mode(&t, "600");
    kill(ngx.pid, SIGHUP);
    for (int waited = 0; waited < 10000
         && log_count(&ngx, "aggregator.tls.key: cannot read") == 0;
         waited += 50)
        test_sleep_ms(50);
    cr_assert_eq(log_count(&ngx, "aggregator.tls.key: cannot read"), 1,
                 "the reload was not refused with rl's reason");
    char key[96];
    unique(key, sizeof key, "ak_reloadkey");
    test_http_response r;
    for (int i = 0; i < 4; i++) {
        get(ngx.port, "/index.html", key, "", &r);
        cr_assert_eq(r.status, 200, "request %d: %d", i, r.status);
        cr_assert_str_eq(test_http_header(&r, "X-RL-Decision"), "allowed");
    }
    worker_pids(&ngx, after, sizeof after);
    cr_assert_str_eq(after, before, "the workers changed on a refused "
                     "reload");
    cr_assert_eq(log_count(&ngx, "the agent did not open"), 0);

    /* Readable again: the next reload is taken up by new workers. */
    key_mode(&t, "644");
    kill(ngx.pid, SIGHUP);
    for (int waited = 0; waited < 10000
         && log_count(&ngx, "start worker process ") < 4; waited += 50)
        test_sleep_ms(50);
    cr_assert_eq(log_count(&ngx, "start worker process "), 4,
                 "no new workers after the key was readable again");
    get(ngx.port, "/index.html", key, "", &r);
    cr_assert_eq(r.status, 200);
    nginx_stop(&ngx);
}

/* A worker that nginx respawns (one killed, say) opens its agent without
 * the master's check: a key made unreadable since then is the realistic
 * way for an agent not to open (a Redis or an aggregator that is away is
 * no failure to open). */
Test(nginx, a_worker_whose_agent_cannot_open_serves_by_on_error_and_recovers)
{
    tls_rules t;
    tls_rules_write(&t, "nginx-noagent");
    key_mode(&t, "644");
    test_nginx ngx;
    nginx_prepare(&ngx, 1, t.config, "", "        location / { rl on; }\n");
    ngx.expected_alert = "exited on signal 9";
    nginx_start(&ngx, 1);
    char key[96], first[64], now[64];
    unique(key, sizeof key, "ak_noagent");
    test_http_response r;
    get(ngx.port, "/index.html", key, "", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(header_num(&r, "RateLimit-Remaining"), 99);

    key_mode(&t, "600");
    worker_pids(&ngx, first, sizeof first);
    kill(atoi(first), SIGKILL);
    for (int waited = 0; waited < 10000
         && log_count(&ngx, "the agent did not open (try 1)") == 0;
         waited += 20)
        test_sleep_ms(20);
    worker_pids(&ngx, now, sizeof now);
    cr_assert(atoi(now) > 0 && strcmp(now, first) != 0,
              "no worker in place of %s: %s", first, now);
    cr_assert_eq(log_count(&ngx, "the agent did not open (try 1)"), 1,
                 "the respawned worker's agent opened with a key it cannot "
                 "read");
    /* Served, by per-key's on_error (deny): rl-gateway's 503, nothing
     * charged; a request no rule applies to is simply served. */
    for (int i = 0; i < 3; i++) {
        get(ngx.port, "/index.html", key, "", &r);
        cr_assert_eq(r.status, 503, "without an agent: %d", r.status);
        r.body[r.body_len] = '\0';
        cr_assert(strstr(r.body, "\"error\":\"rate_limiter_unavailable\","
                         "\"rule\":\"per-key\"") != NULL, "%s", r.body);
        cr_assert_str_eq(test_http_header(&r, "X-RL-Decision"), "rejected");
        cr_assert_not_null(test_http_header(&r, "RateLimit-Degraded"));
    }
    test_http_get(ngx.port, "/index.html", "", &r);
    cr_assert_eq(r.status, 200);

    /* The key readable again: the worker's next try opens the agent
     * (tries back off from 100 ms, and the key was unreadable for less
     * than a second), and per-key counts on from the store's 99. */
    key_mode(&t, "644");
    uint64_t fixed = test_now_ms();
    int status = 0;
    while (test_now_ms() - fixed < 5000) {
        get(ngx.port, "/index.html", key, "", &r);
        status = r.status;
        if (status == 200)
            break;
        test_sleep_ms(50);
    }
    uint64_t took = test_now_ms() - fixed;
    fprintf(stderr, "nginx: the worker's agent opened %llu ms after its key "
            "was readable again\n", (unsigned long long)took);
    cr_assert_eq(status, 200, "no agent 5 s after the key was readable");
    cr_assert_str_eq(test_http_header(&r, "X-RL-Decision"), "allowed");
    cr_assert_eq(header_num(&r, "RateLimit-Remaining"), 98);
    cr_assert_eq(log_count(&ngx, "rl: the agent opened at try"), 1);
    nginx_stop(&ngx);
}

/* --- (h) rl_cost_after: the cost a response names. --------------------- */

#define COST_SLEEP_MS 150

/* One instance of workers proxying /v1/ to up (which sleeps sleep_ms),
 * with the rule (a line under rules:) and the location's more lines;
 * holds that outlive a second are ended by the agent, and say so in the
 * error log. */
static void proxy_start(test_nginx *ngx, test_upstream *up, int workers,
                        unsigned sleep_ms, const char *rule,
                        const char *more)
{
    char yaml[1024], server[512];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 1000}\n"
             "hold_timeout_ms: 1000\n"
             "rules:\n"
             "  - %s\n", test_env("RL_TEST_REDIS"), rule);
    test_upstream_start(up, sleep_ms);
    snprintf(server, sizeof server,
             "        location /v1/ {\n"
             "            rl on;\n"
             "%s"
             "            proxy_pass http://127.0.0.1:%u;\n"
             "        }\n", more, up->port);
    nginx_prepare(ngx, workers, test_write_config("nginx-proxy", yaml), "",
                  server);
    nginx_start(ngx, workers);
}

/* Two workers holding rl_cost (50) until the log phase charges
 * $upstream_http_x_cost. */
static void cost_start(test_nginx *ngx, test_upstream *up)
{
    proxy_start(ngx, up, 2, COST_SLEEP_MS,
                "{name: tokens, match: api_key, limit: 100000000, "
                "period: 1h, algorithm: fixed_window}",
                "            rl_cost 50;\n"
                "            rl_cost_after $upstream_http_x_cost;\n");
}

#define COST_CLIENTS 5
#define COST_EACH 6

/* Five clients at once, each with its costs: one with a bad or missing
 * X-Cost in each (charged 50), the others what they say. */
Test(nginx, rl_cost_after_charges_the_responses_x_cost)
{
    test_nginx ngx;
    test_upstream up;
    cost_start(&ngx, &up);
    char key[96], counted[128];
    unique(key, sizeof key, "ak_ngx_cost");
    snprintf(counted, sizeof counted, "rl:key:%s", key);
    static const char *const costs[COST_CLIENTS * COST_EACH] = {
        "100", "1200", "7", "0", "333", NULL,
        "2000", "150", "150", "999", "1", "abc",
        "450", "451", "452", "453", "454", "-3",
        "77777", "10", "20", "30", "40", "",
        "5", "6", "7", "8", "9", "4294967296",
    };
    long long want = 5 * 50;
    for (int i = 0; i < COST_CLIENTS; i++) {
        for (int j = 0; j < COST_EACH - 1; j++)
            want += atoll(costs[i * COST_EACH + j]);
    }
    int ok = test_upstream_clients(ngx.port, key, costs, COST_CLIENTS,
                                   COST_EACH);
    cr_assert_eq(ok, COST_CLIENTS * COST_EACH, "%d requests answered 200",
                 ok);
    cr_assert_geq(test_upstream_most(&up), 2);
    test_fixed_window_expect(test_env("RL_TEST_REDIS"), counted, want);
    cr_assert_eq(log_count(&ngx, "the estimate 50 is charged"), 5,
                 "one warning per estimate charged");
    nginx_stop(&ngx);
    test_upstream_stop(&up);
}

/* A subrequest (mirror's, logged with log_subrequest on) is not the
 * request: its log phase, with no $upstream_http_x_cost of its own, must
 * not end the request's hold at the estimate before the response says
 * what it cost. */
Test(nginx, a_logged_subrequest_does_not_end_the_hold)
{
    char yaml[512], server[1024], key[96], counted[128];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 1000}\n"
             "rules:\n"
             "  - {name: tokens, match: api_key, limit: 100000000, "
             "period: 1h, algorithm: fixed_window}\n",
             test_env("RL_TEST_REDIS"));
    test_upstream up;
    test_upstream_start(&up, COST_SLEEP_MS);
    snprintf(server, sizeof server,
             "        location /v1/ {\n"
             "            rl on;\n"
             "            rl_cost 50;\n"
             "            rl_cost_after $upstream_http_x_cost;\n"
             "            log_subrequest on;\n"
             "            mirror /sink;\n"
             "            proxy_pass http://127.0.0.1:%u;\n"
             "        }\n"
             "        location = /sink {\n"
             "            internal;\n"
             "            log_subrequest on;\n"
             "            return 204;\n"
             "        }\n", up.port);
    test_nginx ngx;
    nginx_prepare(&ngx, 1, test_write_config("nginx-mirror", yaml), "",
                  server);
    nginx_start(&ngx, 1);
    unique(key, sizeof key, "ak_ngx_mirror");
    snprintf(counted, sizeof counted, "rl:key:%s", key);
    cr_assert_eq(test_upstream_call(ngx.port, "/v1/chat", key, "700"), 200);
    cr_assert_eq(test_upstream_call(ngx.port, "/v1/chat", key, "300"), 200);
    test_fixed_window_expect(test_env("RL_TEST_REDIS"), counted, 1000);
    nginx_stop(&ngx);
    test_upstream_stop(&up);
}

/* Clients gone while the upstream has their requests: each is charged its
 * estimate (the upstream would say 999) at the request's end, not left to
 * expire. */
Test(nginx, rl_cost_after_charges_a_gone_clients_estimate)
{
    test_nginx ngx;
    test_upstream up;
    cost_start(&ngx, &up);
    char key[96], counted[128];
    unique(key, sizeof key, "ak_ngx_gone");
    snprintf(counted, sizeof counted, "rl:key:%s", key);
    for (int i = 0; i < 3; i++)
        test_upstream_abandon(ngx.port, "/v1/chat", key, "999",
                              COST_SLEEP_MS / 3);
    test_fixed_window_expect(test_env("RL_TEST_REDIS"), counted, 3 * 50);
    test_sleep_ms(2200);
    cr_assert_eq(test_fixed_window_count(test_env("RL_TEST_REDIS"), counted),
                 3 * 50);
    cr_assert_eq(log_count(&ngx, "hold_expired"), 0,
                 "a hold was left to expire");
    nginx_stop(&ngx);
    test_upstream_stop(&up);
}

/* --- (i) in_flight: a slot held for the request's life. ----------------- */

#define SLOW_MS 400

/* in_flight: 2 over two workers: five requests of a key at once, three
 * times, never more than two with the upstream; two clients gone free
 * their slots at once (not when the upstream would answer, 400 ms, nor at
 * the hold's timeout, 1 s). */
Test(nginx, in_flight_holds_n_at_once_and_a_gone_clients_slot_is_freed)
{
    test_upstream up;
    test_nginx ngx;
    proxy_start(&ngx, &up, 2, SLOW_MS,
                "{name: at-once, match: api_key, in_flight: 2}", "");
    char key[96];
    unique(key, sizeof key, "ak_ngx_in_flight");
    int ok = 0, refused = 0;
    for (int round = 0; round < 3; round++) {
        /* A slot goes back in a call after its response: let it land. */
        test_sleep_ms(100);
        test_upstream_burst(ngx.port, key, 5, &ok, &refused);
    }
    cr_assert_leq(test_upstream_most(&up), 2, "%d requests of one key were "
                  "with the upstream at once", test_upstream_most(&up));
    cr_assert_geq(ok, 6, "only %d served: slots were not given back", ok);
    cr_assert_gt(refused, 0);

    test_upstream_abandon(ngx.port, "/v1/chat", key, NULL, 50);
    test_upstream_abandon(ngx.port, "/v1/chat", key, NULL, 50);
    test_upstream_expect_room(ngx.port, key, 250);
    nginx_stop(&ngx);
    test_upstream_stop(&up);
}

/* A worker that exits (SIGTERM: at once, requests and all) closes its
 * agent, which ends its holds and lets their slots go: its respawned
 * successor finds the key's slot free, not held for the lease (10 s). */
Test(nginx, a_worker_that_exits_frees_its_in_flight_slots)
{
    char first[64], now[64];
    test_upstream up;
    test_nginx ngx;
    proxy_start(&ngx, &up, 1, 1500,
                "{name: at-once, match: api_key, in_flight: 1}", "");
    char key[96];
    unique(key, sizeof key, "ak_ngx_exit");
    int fd = test_upstream_send(ngx.port, "/v1/chat", key, NULL);
    for (int waited = 0; waited < 2000 && test_upstream_busy(&up) == 0;
         waited += 10)
        test_sleep_ms(10);
    cr_assert_eq(test_upstream_busy(&up), 1, "the request never reached "
                 "the upstream");
    cr_assert_eq(test_upstream_call(ngx.port, "/v1/chat", key, NULL), 429,
                 "the slot is the held request's");

    worker_pids(&ngx, first, sizeof first);
    kill(atoi(first), SIGTERM);
    for (int waited = 0; waited < 5000
         && log_count(&ngx, "start worker process ") < 2; waited += 20)
        test_sleep_ms(20);
    worker_pids(&ngx, now, sizeof now);
    cr_assert(atoi(now) > 0 && strcmp(now, first) != 0,
              "no worker in place of %s: %s", first, now);
    test_upstream_expect_room(ngx.port, key, 500);
    close(fd);
    nginx_stop(&ngx);
    test_upstream_stop(&up);
}
