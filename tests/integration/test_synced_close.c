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
#define MAX_PEERS 8

typedef struct flood {
    int listener;
    uint16_t port;
    int peers[MAX_PEERS];
    atomic_int accepted;
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

static void flood_accept(flood *f)
{
    int fd = accept(f->listener, NULL, NULL);
    if (fd < 0)
        return;
    static const unsigned char hello[8] = {0, 'S', 'P', 0, 0, 32, 0, 0};
    for (int i = 0; i < MAX_PEERS; i++) {
        if (f->peers[i] < 0
            && send(fd, hello, sizeof hello, MSG_NOSIGNAL) == sizeof hello) {
            f->peers[i] = fd;
            atomic_fetch_add(&f->accepted, 1);
            return;
        }
    }
    close(fd);
}

/* Sends the message to every peer about every 20 us; a peer whose
 * connection fails is dropped (what it sent is never read: the kernel
 * keeps it). */
static void *flood_run(void *arg)
{
    flood *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = f->listener, .events = POLLIN};
        if (poll(&p, 1, 0) == 1)
            flood_accept(f);
        for (int i = 0; i < MAX_PEERS; i++) {
            if (f->peers[i] >= 0
                && send(f->peers[i], f->frame, f->frame_len,
                        MSG_NOSIGNAL | MSG_DONTWAIT) < 0
                && errno != EAGAIN) {
                close(f->peers[i]);
                f->peers[i] = -1;
            }
        }
        usleep(20);
    }
    return NULL;
}

static void flood_start(flood *f, pthread_t *thread)
{
    memset(f, 0, sizeof *f);
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
}

Test(synced_close, an_agent_closes_while_totals_arrive, .timeout = 60)
{
    flood f;
    pthread_t thread;
    flood_start(&f, &thread);
    /* Reports go where nothing listens. */
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\"}\n"
             "aggregator:\n"
             "  reports: \"tcp://127.0.0.1:%u\"\n"
             "  totals: \"tcp://127.0.0.1:%u\"\n"
             "  sync_interval_ms: 10\n"
             "rules:\n"
             "  - {name: " RULE ", match: tenant, limit: 100, "
             "period: 1s, mode: synced}\n",
             test_env("RL_TEST_REDIS"), test_free_port(), f.port);
    const char *path = test_write_config("synced-close", yaml);
    for (int i = 0; i < CLOSES; i++) {
        int before = atomic_load(&f.accepted);
        rl_config *config;
        rl_agent *agent = test_agent_on(path, &config, NULL);
        for (int waited = 0; atomic_load(&f.accepted) == before; waited++) {
            cr_assert_lt(waited, 5000, "close %d: no TOTALS connection", i);
            test_sleep_ms(1);
        }
        /* Messages are under way on the connection from here on. */
        test_sleep_ms((unsigned)i % 5);
        rl_agent_close(agent);
        rl_config_free(config);
    }
    flood_stop(&f, thread);
}
