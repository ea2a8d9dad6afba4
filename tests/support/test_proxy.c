/*
 * test_proxy.c: see test_proxy.h. One thread polls the listening socket,
 * a wake-up pipe and the connections still carried; a silenced connection
 * is simply no longer polled, its sockets held open until the proxy stops.
 */
#define _GNU_SOURCE /* memmem */
#include "test_proxy.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PAIRS_MAX 64
#define KEPT_MAX 65536

typedef struct pair {
    int fd[2];   /* the client's side, the server's side; -1 when closed */
    bool mute[2]; /* what that side sends is no longer carried */
} pair;

struct test_proxy {
    int listener, wake[2];
    uint16_t to_port;
    pthread_t thread;
    pthread_mutex_t lock; /* over everything below, while not polling */
    pair pairs[PAIRS_MAX];
    int n_pairs, accepted;
    /* What clients sent since test_proxy_silence_from, searched for its
     * needle until found. */
    char kept[KEPT_MAX], needle[256];
    size_t n_kept, n_needle;
    bool watching, requests_too, silenced, stop;
};

static void close_pair(pair *c)
{
    for (int i = 0; i < 2; i++) {
        if (c->fd[i] >= 0)
            close(c->fd[i]);
        c->fd[i] = -1;
    }
}

static int connect_to(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void take_connection(test_proxy *p)
{
    int client = accept(p->listener, NULL, NULL);
    if (client < 0)
        return;
    int server = connect_to(p->to_port);
    if (server < 0 || p->n_pairs == PAIRS_MAX) {
        close(client);
        if (server >= 0)
            close(server);
        return;
    }
    p->pairs[p->n_pairs++] = (pair){{client, server}, {false, false}};
    p->accepted++;
}

/* What c's client sent, as far as there is room: once the needle is in
 * it, c's server is heard no more (the answer to this request cannot have
 * been read yet: the server has not had it), nor with requests_too is its
 * client. Returns whether buf is to be carried. */
static bool watch(test_proxy *p, pair *c, const char *buf, size_t n)
{
    size_t room = KEPT_MAX - p->n_kept;
    memcpy(p->kept + p->n_kept, buf, n < room ? n : room);
    p->n_kept += n < room ? n : room;
    if (memmem(p->kept, p->n_kept, p->needle, p->n_needle) != NULL) {
        c->mute[1] = true;
        c->mute[0] = p->requests_too;
        p->watching = false;
        p->silenced = true;
    }
    return !c->mute[0];
}

/* Moves what one side has to the other; closes both on EOF or error. */
static void carry(test_proxy *p, pair *c, int from)
{
    char buf[16384];
    ssize_t n = read(c->fd[from], buf, sizeof buf);
    if (n > 0 && from == 0 && p->watching && !watch(p, c, buf, (size_t)n))
        return;
    for (ssize_t done = 0, w = 0; n > 0 && done < n; done += w) {
        w = write(c->fd[!from], buf + done, (size_t)(n - done));
        if (w <= 0)
            n = -1;
    }
    if (n <= 0)
        close_pair(c);
}

static void *run(void *arg)
{
    test_proxy *p = arg;
    struct pollfd fds[2 + 2 * PAIRS_MAX];
    int owner[2 + 2 * PAIRS_MAX];
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        int n = 0;
        fds[n++] = (struct pollfd){p->listener, POLLIN, 0};
        fds[n++] = (struct pollfd){p->wake[0], POLLIN, 0};
        for (int i = 0; i < p->n_pairs; i++) {
            for (int side = 0; side < 2; side++) {
                if (p->pairs[i].mute[side] || p->pairs[i].fd[side] < 0)
                    continue;
                owner[n] = 2 * i + side;
                fds[n++] = (struct pollfd){p->pairs[i].fd[side], POLLIN, 0};
            }
        }
        pthread_mutex_unlock(&p->lock);
        poll(fds, (nfds_t)n, -1);
        pthread_mutex_lock(&p->lock);
        if (fds[1].revents) {
            char drain[64];
            (void)!read(p->wake[0], drain, sizeof drain);
        }
        /* Whatever was silenced while this thread polled stays silent. */
        for (int k = 2; k < n; k++) {
            pair *c = &p->pairs[owner[k] / 2];
            if (fds[k].revents && !c->mute[owner[k] % 2]
                && c->fd[owner[k] % 2] >= 0)
                carry(p, c, owner[k] % 2);
        }
        if (fds[0].revents)
            take_connection(p);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

test_proxy *test_proxy_start(uint16_t to_port, uint16_t *port)
{
    test_proxy *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    p->to_port = to_port;
    p->listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    cr_assert(p->listener >= 0
                  && bind(p->listener, (struct sockaddr *)&sa, sizeof sa) == 0
                  && listen(p->listener, 16) == 0
                  && getsockname(p->listener, (struct sockaddr *)&sa, &len)
                         == 0,
              "the proxy cannot listen on loopback");
    *port = ntohs(sa.sin_port);
    cr_assert_eq(pipe(p->wake), 0);
    pthread_mutex_init(&p->lock, NULL);
    cr_assert_eq(pthread_create(&p->thread, NULL, run, p), 0);
    return p;
}

static void wake(test_proxy *p)
{
    (void)!write(p->wake[1], "x", 1);
}

void test_proxy_silence(test_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->n_pairs; i++)
        p->pairs[i].mute[0] = p->pairs[i].mute[1] = true;
    pthread_mutex_unlock(&p->lock);
    wake(p);
}

void test_proxy_silence_from(test_proxy *p, const void *needle, size_t len,
                             bool requests_too)
{
    cr_assert(len > 0 && len <= sizeof p->needle);
    pthread_mutex_lock(&p->lock);
    memcpy(p->needle, needle, len);
    p->n_needle = len;
    p->n_kept = 0;
    p->requests_too = requests_too;
    p->watching = true;
    pthread_mutex_unlock(&p->lock);
}

bool test_proxy_silenced(test_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    bool silenced = p->silenced;
    pthread_mutex_unlock(&p->lock);
    return silenced;
}

int test_proxy_accepted(test_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    int n = p->accepted;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void test_proxy_stop(test_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_mutex_unlock(&p->lock);
    wake(p);
    pthread_join(p->thread, NULL);
    for (int i = 0; i < p->n_pairs; i++)
        close_pair(&p->pairs[i]);
    close(p->listener);
    close(p->wake[0]);
    close(p->wake[1]);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
