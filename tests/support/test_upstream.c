#include "test_upstream.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct conn_arg {
    test_upstream *u;
    int fd;
} conn_arg;

/* The request's head, up to its blank line (the tests send no body). */
static void read_head(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    while (len + 1 < cap && strstr(buf, "\r\n\r\n") == NULL) {
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
    }
}

/* The value of the X-Test-Cost line, into out ("" without one). */
static void wanted_cost(const char *head, char *out, size_t cap)
{
    out[0] = '\0';
    for (const char *p = head; (p = strstr(p, "\r\n")) != NULL; p += 2) {
        static const char name[] = "X-Test-Cost:";
        if (strncasecmp(p + 2, name, sizeof name - 1) != 0)
            continue;
        const char *v = p + 2 + sizeof name - 1;
        while (*v == ' ')
            v++;
        size_t n = strcspn(v, "\r");
        snprintf(out, cap, "%.*s", (int)n, v);
        return;
    }
}

static void *serve(void *arg)
{
    conn_arg *a = arg;
    test_upstream *u = a->u;
    char head[8192], cost[128], resp[512];
    read_head(a->fd, head, sizeof head);
    wanted_cost(head, cost, sizeof cost);
    pthread_mutex_lock(&u->lock);
    if (++u->serving > u->most)
        u->most = u->serving;
    pthread_mutex_unlock(&u->lock);
    usleep(u->sleep_ms * 1000);
    int n = snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\n%s%s%s"
                     "Content-Length: 2\r\nConnection: close\r\n\r\nok",
                     cost[0] ? "X-Cost: " : "", cost, cost[0] ? "\r\n" : "");
    send(a->fd, resp, (size_t)n, MSG_NOSIGNAL);
    close(a->fd);
    pthread_mutex_lock(&u->lock);
    u->serving--;
    u->served++;
    u->threads--;
    pthread_cond_broadcast(&u->idle);
    pthread_mutex_unlock(&u->lock);
    free(a);
    return NULL;
}

static void *accept_loop(void *arg)
{
    test_upstream *u = arg;
    for (;;) {
        int fd = accept(u->listener, NULL, NULL);
        if (fd < 0)
            return NULL;
        conn_arg *a = malloc(sizeof *a);
        cr_assert_not_null(a);
        *a = (conn_arg){u, fd};
        pthread_mutex_lock(&u->lock);
        u->threads++;
        pthread_mutex_unlock(&u->lock);
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, serve, a), 0);
        pthread_detach(t);
    }
}

void test_upstream_start(test_upstream *u, unsigned sleep_ms)
{
    memset(u, 0, sizeof *u);
    u->sleep_ms = sleep_ms;
    pthread_mutex_init(&u->lock, NULL);
    pthread_cond_init(&u->idle, NULL);
    u->listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(u->listener, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(u->listener, 128), 0);
    getsockname(u->listener, (struct sockaddr *)&sa, &len);
    u->port = ntohs(sa.sin_port);
    pthread_create(&u->acceptor, NULL, accept_loop, u);
}

void test_upstream_stop(test_upstream *u)
{
    shutdown(u->listener, SHUT_RDWR);
    close(u->listener);
    pthread_join(u->acceptor, NULL);
    pthread_mutex_lock(&u->lock);
    while (u->threads > 0)
        pthread_cond_wait(&u->idle, &u->lock);
    pthread_mutex_unlock(&u->lock);
    pthread_cond_destroy(&u->idle);
    pthread_mutex_destroy(&u->lock);
}

int test_upstream_most(test_upstream *u)
{
    pthread_mutex_lock(&u->lock);
    int most = u->most;
    pthread_mutex_unlock(&u->lock);
    return most;
}

int test_upstream_busy(test_upstream *u)
{
    pthread_mutex_lock(&u->lock);
    int serving = u->serving;
    pthread_mutex_unlock(&u->lock);
    return serving;
}

int test_upstream_served(test_upstream *u)
{
    pthread_mutex_lock(&u->lock);
    int served = u->served;
    pthread_mutex_unlock(&u->lock);
    return served;
}

/* A connection with the request sent, or -1. */
static int send_request(uint16_t port, const char *path, const char *key,
                        const char *cost)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char buf[1024];
    int len = snprintf(buf, sizeof buf, "GET %s HTTP/1.1\r\nHost: t\r\n"
                       "X-Api-Key: %s\r\n%s%s%sConnection: close\r\n\r\n",
                       path, key, cost != NULL ? "X-Test-Cost: " : "",
                       cost != NULL ? cost : "", cost != NULL ? "\r\n" : "");
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0
        || write(fd, buf, (size_t)len) != len) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The status of the response on fd, read to its end; closes fd. */
int test_upstream_read_status(int fd)
{
    char buf[4096];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof buf - 1
           && (n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = '\0';
    close(fd);
    int status = -1;
    if (sscanf(buf, "HTTP/1.1 %d", &status) != 1)
        status = -1;
    return status;
}

int test_upstream_call(uint16_t port, const char *path, const char *key,
                       const char *cost)
{
    int fd = send_request(port, path, key, cost);
    return fd < 0 ? -1 : test_upstream_read_status(fd);
}

int test_upstream_send(uint16_t port, const char *path, const char *key,
                       const char *cost)
{
    int fd = send_request(port, path, key, cost);
    cr_assert_geq(fd, 0, "cannot send a request to port %u", port);
    return fd;
}

void test_upstream_abandon(uint16_t port, const char *path, const char *key,
                           const char *cost, unsigned wait_ms)
{
    int fd = test_upstream_send(port, path, key, cost);
    usleep(wait_ms * 1000);
    close(fd);
}

int test_upstream_calls(uint16_t port, const char *key,
                        const char *const *costs, int n)
{
    int ok = 0;
    for (int i = 0; i < n; i++)
        ok += test_upstream_call(port, "/v1/chat", key, costs[i]) == 200;
    return ok;
}

typedef struct client {
    uint16_t port;
    const char *key;
    const char *const *costs;
    int n, ok;
} client;

static void *run_client(void *arg)
{
    client *c = arg;
    c->ok = test_upstream_calls(c->port, c->key, c->costs, c->n);
    return NULL;
}

int test_upstream_clients(uint16_t port, const char *key,
                          const char *const *costs, int clients, int each)
{
    client c[64];
    pthread_t t[64];
    cr_assert_leq(clients, 64);
    for (int i = 0; i < clients; i++) {
        c[i] = (client){port, key, costs + i * each, each, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, run_client, &c[i]), 0);
    }
    int ok = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(t[i], NULL);
        ok += c[i].ok;
    }
    return ok;
}

void test_upstream_burst(uint16_t port, const char *key, int n, int *ok,
                         int *refused)
{
    int fds[64];
    cr_assert_leq(n, 64);
    for (int i = 0; i < n; i++) {
        fds[i] = send_request(port, "/v1/chat", key, NULL);
        cr_assert_geq(fds[i], 0, "cannot send a request to port %u", port);
    }
    for (int i = 0; i < n; i++) {
        int status = test_upstream_read_status(fds[i]);
        cr_assert(status == 200 || status == 429, "status %d", status);
        *ok += status == 200;
        *refused += status == 429;
    }
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void test_upstream_expect_room(uint16_t port, const char *key,
                               unsigned within_ms)
{
    uint64_t from = now_ms();
    int status = 0;
    while (status != 200 && now_ms() - from < within_ms) {
        usleep(20 * 1000);
        status = test_upstream_call(port, "/v1/chat", key, NULL);
    }
    cr_assert_eq(status, 200, "no room for %s %llu ms later", key,
                 (unsigned long long)(now_ms() - from));
}
