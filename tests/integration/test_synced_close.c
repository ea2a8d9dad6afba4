/*
 * An agent closes while TOTALS are arriving (common/nng_sub.h): Debian
 * 12's nng 1.5.2 can lose the read of a pipe closed as a message arrives
 * on it, and nng_close, so rl_agent_close, then waits forever. Here a
 * publisher in this process sends TOTALS without pause, so that a message
 * is arriving at nearly every moment, and agents are opened on it and
 * closed, one after another. Nobody answers the reports: each close gives
 * the last one its two intervals. Closing the TOTALS socket at once after
 * the last report (as the agent did) hung in nng_close in 6 runs of 6
 * under ASan; the agent now closes it once its connections have ended at
 * a message over the one-byte limit.
 *
 * The publisher speaks the SP protocol over TCP itself: nng's PUB loses a
 * message now and then when it sends on a connection that is closing, and
 * LeakSanitizer would count that against the test.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"
#include "wire.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RULE "closing"
#define CLOSES 60
#define BUDGET_MS 8000
#define MAX_PEERS 8

typedef struct flood {
    int listener;
    uint16_t port;
    pthread_mutex_t lock;       /* the peers, between the test and the thread */
    int peers[MAX_PEERS];
    bool failed[MAX_PEERS];     /* its connection failed: the test closes it */
    atomic_bool stop;
    unsigned char frame[256];   /* one TOTALS message, SP framed */
    size_t frame_len;
} flood;

/* SP over TCP: each side sends "\0SP\0", its protocol (PUB v0: 2 x 16)
 * and two zero bytes; then each message is its length (64 bits, big
 * endian) and its bytes. */
static void flood_frame(flood *f)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_totals(w, RULE, 1, false, 1, 1);
    rl_wire_put_total(w, "org_closing", 11, 1, 1, 0, 1);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    cr_assert_leq(len + 8, sizeof f->frame);
    for (int i = 0; i < 8; i++)
        f->frame[i] = (unsigned char)((uint64_t)len >> (56 - 8 * i));
    memcpy(f->frame + 8, data, len);
    f->frame_len = len + 8;
    rl_wire_writer_free(w);
}

/* Sends the message to every peer about every 20 us. Descriptors are made
 * and closed by the test's thread only (ThreadSanitizer would take one
 * number reused across threads for a race). */
static void *flood_run(void *arg)
{
    flood *f = arg;
    while (!atomic_load(&f->stop)) {
        pthread_mutex_lock(&f->lock);
        for (int i = 0; i < MAX_PEERS; i++) {
            if (f->peers[i] >= 0 && !f->failed[i]
                && send(f->peers[i], f->frame, f->frame_len,
                        MSG_NOSIGNAL | MSG_DONTWAIT) < 0
                && errno != EAGAIN)
                f->failed[i] = true;
        }
        pthread_mutex_unlock(&f->lock);
        usleep(20);
    }
    return NULL;
}

/* A connection to flood, once it has the SP header. */
static void flood_add(flood *f, int fd)
{
    static const unsigned char hello[8] = {0, 'S', 'P', 0, 0, 32, 0, 0};
    bool sent = send(fd, hello, sizeof hello, MSG_NOSIGNAL)
                == (ssize_t)sizeof hello;
    pthread_mutex_lock(&f->lock);
    int i = 0;
    while (i < MAX_PEERS && f->peers[i] >= 0)
        i++;
    if (i < MAX_PEERS) {
        f->peers[i] = fd;
        f->failed[i] = !sent;
    }
    pthread_mutex_unlock(&f->lock);
    cr_assert_lt(i, MAX_PEERS, "more connections than agents");
}

/* Takes the agent's connection, and any other waiting (a redial made at a
 * close), and closes those that failed. What the peers send is never
 * read: the kernel keeps it. */
static void flood_accept(flood *f, int close_number)
{
    pthread_mutex_lock(&f->lock);
    for (int i = 0; i < MAX_PEERS; i++) {
        if (f->peers[i] >= 0 && f->failed[i]) {
            close(f->peers[i]);
            f->peers[i] = -1;
        }
    }
    pthread_mutex_unlock(&f->lock);
    struct pollfd p = {.fd = f->listener, .events = POLLIN};
    cr_assert_eq(poll(&p, 1, 5000), 1, "close %d: no TOTALS connection",
                 close_number);
    do {
        int fd = accept(f->listener, NULL, NULL);
        cr_assert_geq(fd, 0);
        flood_add(f, fd);
    } while (poll(&p, 1, 0) == 1);
}

static void flood_start(flood *f, pthread_t *thread)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->lock, NULL);
    for (int i = 0; i < MAX_PEERS; i++)
        f->peers[i] = -1;
    flood_frame(f);
    f->listener = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(f->listener, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(f->listener, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(f->listener, MAX_PEERS), 0);
    cr_assert_eq(getsockname(f->listener, (struct sockaddr *)&sa, &len), 0);
    f->port = ntohs(sa.sin_port);
    cr_assert_eq(pthread_create(thread, NULL, flood_run, f), 0);
}

static void flood_stop(flood *f, pthread_t thread)
{
    atomic_store(&f->stop, true);
    pthread_join(thread, NULL);
    for (int i = 0; i < MAX_PEERS; i++) {
        if (f->peers[i] >= 0)
            close(f->peers[i]);
    }
    close(f->listener);
    pthread_mutex_destroy(&f->lock);
}

/* A config of one synced rule whose reports go where nothing listens and
 * whose totals come from totals_port; returns its path. */
static const char *closing_config(const char *name, uint16_t totals_port,
                                  unsigned interval_ms)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\"}\n"
             "aggregator:\n"
             "  reports: \"tcp://127.0.0.1:%u\"\n"
             "  totals: \"tcp://127.0.0.1:%u\"\n"
             "  sync_interval_ms: %u\n"
             "rules:\n"
             "  - {name: " RULE ", match: tenant, limit: 100, "
             "period: 1s, mode: synced}\n",
             test_env("RL_TEST_REDIS"), test_free_port(), totals_port,
             interval_ms);
    return test_write_config(name, yaml);
}

/* A close that hangs is the failure (nng 1.5.2's nng_close): the closes
 * stop after BUDGET_MS, so 30 s is a hang, and make mutants waits for it. */
Test(synced_close, an_agent_closes_while_totals_arrive, .timeout = 30)
{
    flood f;
    pthread_t thread;
    flood_start(&f, &thread);
    const char *path = closing_config("synced-close", f.port, 10);
    /* As many as fit in BUDGET_MS: about 4 s for all under ASan; a TSan
     * build takes about a second for each. */
    uint64_t start = test_now_ms();
    for (int i = 0; i < CLOSES && test_now_ms() - start < BUDGET_MS; i++) {
        rl_config *config;
        rl_agent *agent = test_agent_on(path, &config, NULL);
        flood_accept(&f, i);
        /* Messages are under way on the connection from here on. */
        test_sleep_ms((unsigned)i % 5);
        rl_agent_close(agent);
        rl_config_free(config);
    }
    flood_stop(&f, thread);
}

/* An agent with nothing counted closes at once though no aggregator
 * answers: a report of its presence alone is not resent at the stop and
 * given its two intervals (2 s here), which every rlctl check and every
 * nginx worker's close at a reload paid while the aggregators were
 * away. What was counted still goes (synced::*loses_no_count). */
Test(synced_close, an_agent_with_nothing_counted_closes_at_once)
{
    const char *path = closing_config("synced-close-idle", test_free_port(),
                                      1000);
    rl_config *config;
    rl_agent *agent = test_agent_on(path, &config, NULL);
    /* Past a tick: its presence report is out, unanswered. */
    test_sleep_ms(1200);
    uint64_t start = test_now_ms();
    rl_agent_close(agent);
    uint64_t took = test_now_ms() - start;
    rl_config_free(config);
    fprintf(stderr, "synced close: nothing counted, no aggregator: closed "
            "in %llu ms (two intervals: 2000)\n", (unsigned long long)took);
    cr_assert_lt(took, 1000, "the close waited %llu ms for a report of "
                 "presence alone", (unsigned long long)took);
}
