/*
 * test_gateway.h: rl-gateway as its own process, and a small HTTP client
 * that sends exact bytes (malformed ones too) and reads responses with
 * http_parser.
 */
#ifndef RL_TEST_GATEWAY_H
#define RL_TEST_GATEWAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct test_gateway {
    pid_t pid;
    uint16_t port;
    char log[600];
} test_gateway;

/* Starts build/bin/rl-gateway on a free loopback port with the config file
 * and extra arguments (NULL-terminated), and waits until it listens. */
void test_gateway_start(test_gateway *gw, const char *config, ...);
/* SIGTERM, and asserts a clean exit within 15 s. */
void test_gateway_stop(test_gateway *gw);

#define TEST_HTTP_HEADERS_MAX 40

typedef struct test_http_response {
    int status;
    char names[TEST_HTTP_HEADERS_MAX][64];
    char values[TEST_HTTP_HEADERS_MAX][256];
    int n_headers;
    char body[65536];    /* a metrics page fits */
    size_t body_len;
} test_http_response;

/* A connection to a gateway (or any loopback port). */
int test_http_connect(uint16_t port);
/* Sends raw bytes (none if raw is ""); reads n responses in order into out[0..n-1] (keep-alive
 * and pipelining). Asserts each arrives whole within 5 s. */
void test_http_exchange(int fd, const char *raw, test_http_response *out,
                        int n);
/* One request on its own connection: "GET path" with extra header lines
 * ("Name: value\r\n" each, or ""). */
void test_http_get(uint16_t port, const char *path, const char *headers,
                   test_http_response *out);
/* A Prometheus sample's value in text (which starts with a newline), or
 * -1 if the series is not there. */
long long test_prom_sample(const char *text, const char *series);

#define TEST_PROM_BOUNDS_MAX 32

/* A histogram family read from a Prometheus page (text as above). */
typedef struct test_prom_histogram {
    int n;                                     /* finite bounds */
    double le[TEST_PROM_BOUNDS_MAX];           /* in page order */
    long long buckets[TEST_PROM_BOUNDS_MAX];   /* cumulative, as read */
    long long count;                           /* _count */
    double sum;                                /* _sum */
} test_prom_histogram;

/* Reads the histogram name from text into *h and asserts that it holds
 * together as Prometheus requires: bounds ascending, buckets never
 * decreasing (cumulative), a le="+Inf" bucket last, equal to _count, and
 * a _sum. */
void test_prom_histogram_read(const char *text, const char *name,
                              test_prom_histogram *h);

/* Asserts rl-gateway's 429 for an exact rule of limit requests per
 * period_s seconds with an empty bucket (the nginx module answers the
 * same): Retry-After in whole seconds rounded up (one token's wait, or a
 * second less), the RateLimit headers and the JSON body. */
void test_expect_rate_limited(test_http_response *r, const char *rule,
                              unsigned limit, unsigned period_s);

/* A header's value (case-insensitive), or NULL. */
const char *test_http_header(const test_http_response *r, const char *name);

#endif
