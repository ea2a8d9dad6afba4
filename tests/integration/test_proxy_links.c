/*
 * The test proxy as a network between regions: its one-way delay, its
 * order, its bounded memory, its cuts and heals, measured through an
 * echo server on loopback.
 */
#include "test_agent.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_proxy.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ECHO_CONNS 8

/* Sends back whatever each connection sends, counting what it got. */
typedef struct echo_server {
    int listener, stop[2];
    uint16_t port;
    pthread_t thread;
    atomic_size_t received;
} echo_server;

static void *echo_run(void *arg)
{
    echo_server *e = arg;
    struct pollfd fds[2 + ECHO_CONNS] = {{e->listener, POLLIN, 0},
                                         {e->stop[0], POLLIN, 0}};
    int n = 2;
    char buf[65536];
    while (poll(fds, (nfds_t)n, -1) >= 0 && !fds[1].revents) {
        for (int k = 2; k < n; k++) {
            if (!fds[k].revents || fds[k].fd < 0)
                continue;
            ssize_t got = read(fds[k].fd, buf, sizeof buf);
            atomic_fetch_add(&e->received, got > 0 ? (size_t)got : 0);
            for (ssize_t done = 0, w = 0; got > 0 && done < got; done += w)
                if ((w = send(fds[k].fd, buf + done, (size_t)(got - done),
                          MSG_NOSIGNAL))
                    <= 0)
                    got = -1;
            if (got <= 0) {
                close(fds[k].fd);
                fds[k].fd = -1;
            }
        }
        if (fds[0].revents) {
            int fd = accept(e->listener, NULL, NULL);
            if (n < 2 + ECHO_CONNS)
                fds[n++] = (struct pollfd){fd, POLLIN, 0};
            else
                close(fd);
        }
    }
    for (int k = 2; k < n; k++)
        if (fds[k].fd >= 0)
            close(fds[k].fd);
    return NULL;
}

static void echo_start(echo_server *e)
{
    e->listener = test_silent_store(&e->port); /* silent until accepted */
    atomic_init(&e->received, 0);
    cr_assert_eq(pipe(e->stop), 0);
    cr_assert_eq(pthread_create(&e->thread, NULL, echo_run, e), 0);
}

static void echo_stop(echo_server *e)
{
    cr_assert_eq(write(e->stop[1], "x", 1), 1);
    pthread_join(e->thread, NULL);
    close(e->listener);
    close(e->stop[0]);
    close(e->stop[1]);
}

/* A connection to the proxy, each write sent at once, as nng's are. */
static int dial(uint16_t port)
{
    int fd = test_http_connect(port), on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    return fd;
}

/* An echo server behind a proxy, and a connection through them. */
typedef struct echo_link {
    echo_server echo;
    test_proxy *proxy;
    uint16_t port; /* the proxy's */
    int fd;
} echo_link;

/* Without a delay, through test_proxy_start: the proxy the tests of
 * silent connections use. */
static void link_open(echo_link *l, unsigned delay_ms)
{
    echo_start(&l->echo);
    l->proxy = delay_ms > 0 ? test_proxy_start_delayed(l->echo.port, &l->port,
                                                       delay_ms)
                            : test_proxy_start(l->echo.port, &l->port);
    l->fd = dial(l->port);
}

static void link_close(echo_link *l)
{
    close(l->fd);
    test_proxy_stop(l->proxy);
    echo_stop(&l->echo);
}

static void send_all(int fd, const void *buf, size_t len)
{
    for (size_t done = 0; done < len;) {
        ssize_t w = send(fd, (const char *)buf + done, len - done,
                         MSG_NOSIGNAL);
        cr_assert_gt(w, 0, "the proxy closed the connection");
        done += (size_t)w;
    }
}

/* Reads up to len bytes, for no longer than timeout_ms (0: what has
 * come already); returns how many came. */
static size_t recv_for(int fd, void *buf, size_t len, unsigned timeout_ms)
{
    uint64_t end = test_now_ms() + timeout_ms;
    size_t got = 0;
    while (got < len) {
        uint64_t now = test_now_ms();
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, now < end ? (int)(end - now) : 0) <= 0)
            break;
        ssize_t r = read(fd, (char *)buf + got, len - got);
        cr_assert_gt(r, 0, "the proxy closed the connection");
        got += (size_t)r;
    }
    return got;
}

/* One 16-byte request and its answer through the echo server, in
 * microseconds. */
static uint64_t round_trip_us(int fd)
{
    char out[16] = "request-answer!", in[16];
    uint64_t start = test_now_us();
    send_all(fd, out, sizeof out);
    cr_assert_eq(recv_for(fd, in, sizeof in, 2000), sizeof in);
    cr_assert_eq(memcmp(in, out, sizeof in), 0);
    return test_now_us() - start;
}

/* Each round trip takes twice the delay more, up to 30 ms later, or
 * later still by what the machine overslept meanwhile (twice its worst
 * oversleep: a round trip wakes threads on both ways). */
static void expect_round_trips_delayed(int fd, unsigned delay_ms)
{
    for (int i = 0; i < 3; i++) {
        test_sched_probe probe;
        test_sched_probe_start(&probe);
        uint64_t us = round_trip_us(fd);
        uint64_t overslept = test_sched_probe_stop(&probe);
        fprintf(stderr, "proxy: a round trip through %u ms: %llu us (the "
                "probe overslept %llu us)\n", delay_ms,
                (unsigned long long)us, (unsigned long long)overslept);
        cr_expect(us >= 2000u * delay_ms
                      && us <= 2000u * delay_ms + 30000 + 2 * overslept,
                  "a round trip through a proxy delaying %u ms took %llu us",
                  delay_ms, (unsigned long long)us);
    }
}

static int compare_us(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The median of 21 round trips, not slowed beyond loopback's own. */
static void expect_round_trips_undelayed(int fd)
{
    uint64_t us[21];
    for (int i = 0; i < 21; i++)
        us[i] = round_trip_us(fd);
    qsort(us, 21, sizeof us[0], compare_us);
    fprintf(stderr, "proxy: round trips without delay: median %llu us\n",
            (unsigned long long)us[10]);
    cr_expect_lt(us[10], 5000, "an undelayed round trip took %llu us",
                 (unsigned long long)us[10]);
}

Test(proxy, a_delay_adds_twice_itself_to_a_round_trip)
{
    echo_link l;
    link_open(&l, 100);
    expect_round_trips_delayed(l.fd, 100);
    link_close(&l);
}

Test(proxy, no_delay_adds_no_time)
{
    echo_link l;
    link_open(&l, 0);
    expect_round_trips_undelayed(l.fd);
    link_close(&l);
}

Test(proxy, a_changed_delay_applies_to_what_is_read_after)
{
    echo_link l;
    link_open(&l, 0);
    round_trip_us(l.fd);
    test_proxy_set_delay(l.proxy, 60);
    expect_round_trips_delayed(l.fd, 60);
    test_proxy_set_delay(l.proxy, 0);
    expect_round_trips_undelayed(l.fd);
    link_close(&l);
}

/* Bytes read before the delay is lowered are not overtaken by those read
 * after, which are due sooner. */
Test(proxy, many_small_writes_keep_their_order)
{
    echo_link l;
    link_open(&l, 30);
    enum { WRITES = 20000 };
    unsigned char *sent = malloc(WRITES * 7), *back = malloc(WRITES * 7);
    cr_assert(sent != NULL && back != NULL);
    size_t len = 0;
    for (int i = 0; i < WRITES; i++) {
        size_t n = 1 + (size_t)i % 7;
        for (size_t k = 0; k < n; k++, len++)
            sent[len] = (unsigned char)(len * 131 + len / 251);
        send_all(l.fd, sent + len - n, n);
        if (i == WRITES / 2)
            test_proxy_set_delay(l.proxy, 0);
    }
    cr_assert_eq(recv_for(l.fd, back, len, 3000), len);
    cr_assert_eq(memcmp(back, sent, len), 0, "the bytes came back reordered");
    free(sent);
    free(back);
    link_close(&l);
}

#define BIG_WORDS ((size_t)4 << 20) /* 16 MiB of 32-bit counts */

static void *send_counts(void *arg)
{
    int fd = *(int *)arg;
    static uint32_t words[16384];
    for (size_t i = 0; i < BIG_WORDS; i += 16384) {
        for (size_t k = 0; k < 16384; k++)
            words[k] = (uint32_t)(i + k);
        for (size_t done = 0; done < sizeof words;) {
            ssize_t w = send(fd, (char *)words + done, sizeof words - done,
                         MSG_NOSIGNAL);
            if (w <= 0)
                return NULL;
            done += (size_t)w;
        }
    }
    return NULL;
}

/* 16 MiB through a 50 ms delay and back: the 4 MiB a direction holds at
 * most carry them in a few delays (a wait of the delay for each read
 * would take seconds), each count once and in order. The reader starts
 * once the proxy holds what it may, its sockets full, so that it must
 * push back: a fixed wait of 200 ms was too short for TSan's writer once
 * in CI (3.8 MiB held). */
Test(proxy, sixteen_mib_pass_intact_in_bounded_memory)
{
    echo_link l;
    link_open(&l, 50);
    pthread_t writer;
    cr_assert_eq(pthread_create(&writer, NULL, send_counts, &l.fd), 0);
    uint64_t full_by = test_now_ms() + 10000;
    while (test_proxy_queued_peak(l.proxy) < TEST_PROXY_QUEUE_MAX - 65536) {
        cr_assert_lt(test_now_ms(), full_by, "the proxy held %zu bytes at "
                     "most of a writer that never stops: never pushed back",
                     test_proxy_queued_peak(l.proxy));
        test_sleep_ms(10);
    }
    uint64_t start = test_now_ms();
    static uint32_t words[16384];
    size_t bad = BIG_WORDS;
    for (size_t i = 0; i < BIG_WORDS && bad == BIG_WORDS; i += 16384) {
        cr_assert_eq(recv_for(l.fd, words, sizeof words, 2000), sizeof words,
                     "stalled after %zu bytes", i * 4);
        for (size_t k = 0; k < 16384; k++)
            if (words[k] != (uint32_t)(i + k) && bad == BIG_WORDS)
                bad = i + k;
    }
    uint64_t took = test_now_ms() - start;
    pthread_join(writer, NULL);
    cr_assert_eq(bad, BIG_WORDS, "count %zu came back as another", bad);
    size_t peak = test_proxy_queued_peak(l.proxy);
    fprintf(stderr, "proxy: 16 MiB through 50 ms and back in %llu ms from "
            "a full proxy, %zu bytes held at most\n",
            (unsigned long long)took, peak);
    cr_expect_leq(peak, TEST_PROXY_QUEUE_MAX);
    cr_expect_lt(took, 1700, "16 MiB took %llu ms", (unsigned long long)took);
    link_close(&l);
}

/* Waits until the echo server has received want bytes in all. */
static void await_received(echo_server *e, size_t want)
{
    uint64_t end = test_now_ms() + 2000;
    while (atomic_load(&e->received) < want)
        cr_assert_lt(test_now_ms(), end, "the server never got the bytes");
}

/* During a cut nothing passes either way, on the connections open or
 * made then, and what the proxy held stays held: after the heal each
 * byte arrives once, in order. What was sent during the cut was held by
 * its sender, as TCP does in a partition: it takes its delay after the
 * heal. */
Test(proxy, a_cut_holds_everything_until_healed)
{
    echo_link l;
    link_open(&l, 50);
    int a = l.fd;
    send_all(a, "a1", 2);
    await_received(&l.echo, 2); /* its echo is held in the proxy for 50 ms */
    test_proxy_cut(l.proxy);
    send_all(a, "a2", 2);
    int b = dial(l.port);
    send_all(b, "b1", 2);
    char got[8];
    cr_assert_eq(recv_for(a, got, sizeof got, 300), 0,
                 "a round trip completed during the cut");
    cr_assert_eq(recv_for(b, got, sizeof got, 0), 0);
    cr_assert_eq(atomic_load(&l.echo.received), 2, "bytes passed during the cut");
    cr_assert_eq(test_proxy_accepted(l.proxy), 2, "no connection during the cut");

    uint64_t healed = test_now_us();
    test_proxy_heal(l.proxy);
    cr_assert_eq(recv_for(a, got, 4, 1000), 4);
    cr_assert_eq(memcmp(got, "a1a2", 4), 0, "got %.4s", got);
    cr_assert_geq(test_now_us() - healed, 2 * 50000,
                  "what the cut held in its sender went out without delay");
    cr_assert_eq(recv_for(b, got, 2, 1000), 2);
    cr_assert_eq(memcmp(got, "b1", 2), 0, "got %.2s", got);
    cr_assert_eq(recv_for(a, got, 1, 150), 0, "a byte came twice");
    cr_assert_eq(recv_for(b, got, 1, 0), 0, "a byte came twice");
    cr_assert_eq(atomic_load(&l.echo.received), 6);
    round_trip_us(a);
    close(b);
    link_close(&l);
}
