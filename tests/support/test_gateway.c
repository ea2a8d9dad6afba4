/*
 * test_gateway.c: see test_gateway.h.
 */
#include "test_gateway.h"

#include "redis_server.h"
#include "test_env.h"
#include "test_process.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 16

void test_gateway_start(test_gateway *gw, const char *config, ...)
{
    memset(gw, 0, sizeof *gw);
    gw->port = test_free_port();
    cr_assert_neq(gw->port, 0);
    test_log_path(gw->log, sizeof gw->log, "gateway");
    char listen[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", gw->port);
    char *argv[MAX_ARGS] = {(char *)test_env("RL_TEST_GATEWAY"), "--listen",
                            listen, "--config", (char *)config};
    int n = 5;
    va_list ap;
    va_start(ap, config);
    for (char *a; (a = va_arg(ap, char *)) != NULL && n < MAX_ARGS - 1;)
        argv[n++] = a;
    va_end(ap);
    gw->pid = test_spawn(argv, gw->log);
    test_wait_for_log(&gw->pid, gw->log, "event=listening", 30000);
}

void test_gateway_stop(test_gateway *gw)
{
    if (gw->pid <= 0)
        return;
    pid_t pid = gw->pid;
    gw->pid = 0;
    test_stop(pid, gw->log, 15000);
}

int test_http_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0,
                 "cannot connect to 127.0.0.1:%u", port);
    return fd;
}

/* Parsing state for several responses in a row. */
struct reading {
    test_http_response *out;
    int n, done;
    bool in_value;
};

static test_http_response *current(http_parser *p)
{
    struct reading *r = p->data;
    return &r->out[r->done];
}

static int on_field(http_parser *p, const char *at, size_t len)
{
    test_http_response *resp = current(p);
    struct reading *r = p->data;
    if (resp->n_headers == 0 || r->in_value) {
        cr_assert_lt(resp->n_headers, TEST_HTTP_HEADERS_MAX);
        resp->n_headers++;
        r->in_value = false;
    }
    char *name = resp->names[resp->n_headers - 1];
    strncat(name, at, len < 63 - strlen(name) ? len : 63 - strlen(name));
    return 0;
}

static int on_value(http_parser *p, const char *at, size_t len)
{
    test_http_response *resp = current(p);
    ((struct reading *)p->data)->in_value = true;
    char *v = resp->values[resp->n_headers - 1];
    strncat(v, at, len < 255 - strlen(v) ? len : 255 - strlen(v));
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    test_http_response *resp = current(p);
    cr_assert_lt(resp->body_len + len, sizeof resp->body);
    memcpy(resp->body + resp->body_len, at, len);
    resp->body_len += len;
    return 0;
}

static int on_complete(http_parser *p)
{
    struct reading *r = p->data;
    current(p)->status = (int)p->status_code;
    r->in_value = false;
    r->done++;
    if (r->done == r->n)
        http_parser_pause(p, 1);
    return 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void test_http_exchange(int fd, const char *raw, test_http_response *out,
                        int n)
{
    size_t len = strlen(raw);
    if (len > 0)
        cr_assert_eq(send(fd, raw, len, MSG_NOSIGNAL), (ssize_t)len);
    memset(out, 0, n * sizeof *out);
    http_parser_settings s;
    http_parser_settings_init(&s);
    s.on_header_field = on_field;
    s.on_header_value = on_value;
    s.on_body = on_body;
    s.on_message_complete = on_complete;
    struct reading r = {out, n, 0, false};
    http_parser p;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = &r;
    uint64_t until = now_ms() + 5000;
    while (r.done < n) {
        struct pollfd pfd = {fd, POLLIN, 0};
        uint64_t now = now_ms();
        cr_assert(now < until && poll(&pfd, 1, (int)(until - now)) == 1,
                  "no whole response within 5 s (%d of %d)", r.done, n);
        char buf[8192];
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        cr_assert_geq(got, 0);
        http_parser_execute(&p, &s, buf, (size_t)got);
        if (r.done == n)
            break;
        cr_assert_eq(HTTP_PARSER_ERRNO(&p), HPE_OK, "bad response: %s",
                     http_errno_description(HTTP_PARSER_ERRNO(&p)));
        cr_assert_gt(got, 0, "the connection closed after %d of %d "
                     "responses", r.done, n);
    }
}

void test_http_get(uint16_t port, const char *path, const char *headers,
                   test_http_response *out)
{
    char raw[4096];
    snprintf(raw, sizeof raw, "GET %s HTTP/1.1\r\nHost: test\r\n%s\r\n", path,
             headers);
    int fd = test_http_connect(port);
    test_http_exchange(fd, raw, out, 1);
    close(fd);
}

const char *test_http_header(const test_http_response *r, const char *name)
{
    for (int i = 0; i < r->n_headers; i++) {
        if (strcasecmp(r->names[i], name) == 0)
            return r->values[i];
    }
    return NULL;
}

long long test_prom_sample(const char *text, const char *series)
{
    char want[256];
    snprintf(want, sizeof want, "\n%s ", series);
    const char *at = strstr(text, want);
    return at != NULL ? atoll(at + strlen(want)) : -1;
}

void test_prom_histogram_read(const char *text, const char *name,
                              test_prom_histogram *h)
{
    memset(h, 0, sizeof *h);
    char want[160];
    snprintf(want, sizeof want, "\n%s_bucket{le=\"", name);
    long long inf = -1;
    for (const char *at = strstr(text, want); at != NULL;
         at = strstr(at + 1, want)) {
        const char *le = at + strlen(want);
        const char *value = strstr(le, "\"} ");
        cr_assert_not_null(value, "%s: a bucket without a value", name);
        long long v = atoll(value + 3);
        cr_assert_eq(inf, -1, "%s: a bucket after le=\"+Inf\"", name);
        if (strncmp(le, "+Inf\"", 5) == 0) {
            cr_assert(h->n == 0 || v >= h->buckets[h->n - 1], "%s: the "
                      "+Inf bucket holds %lld, less than le=\"%g\"", name, v,
                      h->le[h->n - 1]);
            inf = v;
            continue;
        }
        cr_assert_lt(h->n, TEST_PROM_BOUNDS_MAX, "%s: too many buckets", name);
        h->le[h->n] = strtod(le, NULL);
        h->buckets[h->n] = v;
        cr_assert(h->n == 0 || (h->le[h->n] > h->le[h->n - 1]
                                && v >= h->buckets[h->n - 1]),
                  "%s: le=\"%g\" holds %lld after le=\"%g\" held %lld: "
                  "bounds ascend and buckets are cumulative", name,
                  h->le[h->n], v, h->le[h->n - 1], h->buckets[h->n - 1]);
        h->n++;
    }
    cr_assert(h->n > 0 && inf != -1, "%s: no buckets, or no le=\"+Inf\"",
              name);
    snprintf(want, sizeof want, "%s_count", name);
    h->count = test_prom_sample(text, want);
    cr_assert_eq(inf, h->count, "%s: the +Inf bucket holds %lld, _count "
                 "says %lld", name, inf, h->count);
    snprintf(want, sizeof want, "\n%s_sum ", name);
    const char *sum = strstr(text, want);
    cr_assert_not_null(sum, "%s: no _sum", name);
    h->sum = strtod(sum + strlen(want), NULL);
}

void test_expect_rate_limited(test_http_response *r, const char *rule,
                              unsigned limit, unsigned period_s)
{
    cr_assert_eq(r->status, 429);
    const char *retry = test_http_header(r, "Retry-After");
    cr_assert_not_null(retry);
    int retry_s = atoi(retry);
    int token_s = (int)((period_s + limit - 1) / limit);
    cr_assert(retry_s >= token_s - 1 && retry_s <= token_s,
              "Retry-After: %s", retry);
    char want[256];
    snprintf(want, sizeof want, "%u", limit);
    cr_assert_str_eq(test_http_header(r, "RateLimit-Limit"), want);
    cr_assert_str_eq(test_http_header(r, "RateLimit-Remaining"), "0");
    cr_assert_not_null(test_http_header(r, "RateLimit-Reset"));
    snprintf(want, sizeof want, "\"%s\";q=%u;w=%u", rule, limit, period_s);
    cr_assert_str_eq(test_http_header(r, "RateLimit-Policy"), want);
    cr_assert_str_eq(test_http_header(r, "Content-Type"), "application/json");
    snprintf(want, sizeof want, "{\"error\":\"rate_limited\",\"rule\":"
             "\"%s\",\"limit\":%u,\"period_ms\":%u000,"
             "\"override\":\"default\",\"retry_after_s\":%d}\n", rule,
             limit, period_s, retry_s);
    r->body[r->body_len < sizeof r->body ? r->body_len
                                          : sizeof r->body - 1] = '\0';
    cr_assert_str_eq(r->body, want);
}
