/*
 * test_proxy.c: see test_proxy.h. One thread polls the listening socket,
 * a wake-up pipe and the connections' sides it may read from or must wait
 * to write to, for no longer than until the next held byte is due. What
 * it reads is queued with the time it is due (read time plus the delay)
 * and written once due, without blocking: a side that cannot take more is
 * polled for room, and a side whose queue is full is not read from. A cut
 * or silenced side is neither read from nor delivered, its sockets held
 * open until the proxy stops.
 */
#define _GNU_SOURCE /* memmem */
#include "test_proxy.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PAIRS_MAX 64
#define KEPT_MAX 65536
#define READ_MAX 65536

/* What one read brought, due at a time; with len 0, the end of what that
 * side sends (EOF or an error), which closes the connection when due. */
typedef struct chunk {
    struct chunk *next;
    int64_t due_ns; /* on the monotonic clock */
    size_t len, sent;
    char data[];
} chunk;

typedef struct queue {
    chunk *head, *tail;
    size_t bytes;
} queue;

typedef struct pair {
    int fd[2];     /* the client's side, the server's side; -1 when closed */
    bool mute[2];  /* what that side sends is no longer carried */
    bool ended[2]; /* that side's end is queued: nothing more to read */
    queue from[2]; /* what that side sent, for the other */
} pair;

struct test_proxy {
    int listener, wake[2];
    uint16_t to_port;
    pthread_t thread;
    pthread_mutex_t lock; /* over everything below, while not polling */
    pair pairs[PAIRS_MAX];
    int n_pairs, accepted;
    int64_t delay_ns;
    size_t queued_peak;
    uint64_t from_clients; /* bytes read from clients */
    /* What clients sent since test_proxy_silence_from or
     * test_proxy_watch_for, searched for its needle until found; with
     * mute, its connection goes silent then. */
    char kept[KEPT_MAX], needle[256];
    size_t n_kept, n_needle;
    bool watching, mute, requests_too, seen, silenced, cut, stop;
    char read_buf[READ_MAX];
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void queue_pop(queue *q)
{
    chunk *c = q->head;
    q->head = c->next;
    if (q->head == NULL)
        q->tail = NULL;
    q->bytes -= c->len - c->sent;
    free(c);
}

/* Returns false if there is no memory for it. */
static bool queue_push(queue *q, const char *buf, size_t n, int64_t due_ns)
{
    chunk *c = malloc(sizeof *c + n);
    if (c == NULL)
        return false;
    *c = (chunk){NULL, due_ns, n, 0};
    memcpy(c->data, buf, n);
    if (q->tail != NULL)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    q->bytes += n;
    return true;
}

static void close_pair(pair *c)
{
    for (int i = 0; i < 2; i++) {
        if (c->fd[i] >= 0)
            close(c->fd[i]);
        c->fd[i] = -1;
        while (c->from[i].head != NULL)
            queue_pop(&c->from[i]);
    }
}

/* Each byte goes on as soon as it is due, not held back to be sent with
 * the next (Nagle's algorithm would add a round trip to the delay). */
static void no_delay(int fd)
{
    int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
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
    no_delay(client);
    no_delay(server);
    p->pairs[p->n_pairs++] = (pair){.fd = {client, server}};
    p->accepted++;
}

/* What c's client sent, as far as there is room: once the needle is in
 * it, it is seen, and when muting c's server is heard no more (the answer
 * to this request cannot have been read yet: the server has not had it),
 * nor with requests_too is its client. Returns whether buf is to be
 * carried. */
static bool watch(test_proxy *p, pair *c, const char *buf, size_t n)
{
    size_t room = KEPT_MAX - p->n_kept;
    memcpy(p->kept + p->n_kept, buf, n < room ? n : room);
    p->n_kept += n < room ? n : room;
    if (memmem(p->kept, p->n_kept, p->needle, p->n_needle) != NULL) {
        p->watching = false;
        p->seen = true;
        if (p->mute) {
            c->mute[1] = true;
            c->mute[0] = p->requests_too;
            p->silenced = true;
        }
    }
    return !c->mute[0];
}

static bool may_read(const test_proxy *p, const pair *c, int side)
{
    return !p->cut && !c->mute[side] && !c->ended[side] && c->fd[side] >= 0
           && c->from[side].bytes < TEST_PROXY_QUEUE_MAX;
}

static bool may_deliver(const test_proxy *p, const pair *c, int from)
{
    return !p->cut && !c->mute[from] && c->from[from].head != NULL;
}

/* Queues what one side has, due after the delay, as much as its queue
 * has room for; its end (EOF or an error) is queued too. Without memory
 * to hold it the connection is closed, as the test will see. */
static void take(test_proxy *p, pair *c, int from)
{
    queue *q = &c->from[from];
    size_t room = TEST_PROXY_QUEUE_MAX - q->bytes;
    ssize_t n = recv(c->fd[from], p->read_buf,
                     room < READ_MAX ? room : READ_MAX, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 0 && from == 0)
        p->from_clients += (uint64_t)n;
    if (n > 0 && from == 0 && p->watching
        && !watch(p, c, p->read_buf, (size_t)n))
        return;
    if (!queue_push(q, p->read_buf, n > 0 ? (size_t)n : 0,
                    now_ns() + p->delay_ns)) {
        close_pair(c);
        return;
    }
    c->ended[from] = n <= 0;
    if (q->bytes > p->queued_peak)
        p->queued_peak = q->bytes;
}

/* Writes what is due of one side's queue, as much as the other side
 * takes; closes the connection at the end of the queue's sender or on an
 * error. Returns when the next byte will be due, 0 if none is waiting
 * for its time. */
static int64_t deliver(test_proxy *p, pair *c, int from, int64_t now)
{
    queue *q = &c->from[from];
    while (may_deliver(p, c, from) && q->head->due_ns <= now) {
        chunk *k = q->head;
        if (k->len == 0) {
            close_pair(c);
            return 0;
        }
        ssize_t n = send(c->fd[!from], k->data + k->sent, k->len - k->sent,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        if (n <= 0) {
            close_pair(c);
            return 0;
        }
        k->sent += (size_t)n;
        q->bytes -= (size_t)n;
        if (k->sent == k->len)
            queue_pop(q);
    }
    return may_deliver(p, c, from) ? q->head->due_ns : 0;
}

/* Delivers what is due; returns the poll timeout until the next byte is
 * due, in milliseconds rounded up (never early), or -1 if none is. */
static int deliver_all(test_proxy *p)
{
    int64_t now = now_ns(), next = 0;
    for (int i = 0; i < p->n_pairs; i++) {
        for (int from = 0; from < 2; from++) {
            int64_t due = deliver(p, &p->pairs[i], from, now);
            if (due > now && (next == 0 || due < next))
                next = due;
        }
    }
    return next == 0 ? -1 : (int)((next - now + 999999) / 1000000);
}

/* What a side of c is polled for: to read from it, and room to write
 * what is due for it (what could not be written when it was due). */
static short wanted(const test_proxy *p, const pair *c, int side,
                    int64_t now)
{
    short events = may_read(p, c, side) ? POLLIN : 0;
    if (may_deliver(p, c, !side) && c->from[!side].head->due_ns <= now)
        events |= POLLOUT;
    return events;
}

static void *run(void *arg)
{
    test_proxy *p = arg;
    struct pollfd fds[2 + 2 * PAIRS_MAX];
    int owner[2 + 2 * PAIRS_MAX];
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        int timeout = deliver_all(p), n = 0;
        int64_t now = now_ns();
        fds[n++] = (struct pollfd){p->listener, POLLIN, 0};
        fds[n++] = (struct pollfd){p->wake[0], POLLIN, 0};
        for (int i = 0; i < p->n_pairs; i++) {
            for (int side = 0; side < 2; side++) {
                short events = wanted(p, &p->pairs[i], side, now);
                if (events == 0)
                    continue;
                owner[n] = 2 * i + side;
                fds[n++] = (struct pollfd){p->pairs[i].fd[side], events, 0};
            }
        }
        pthread_mutex_unlock(&p->lock);
        poll(fds, (nfds_t)n, timeout);
        pthread_mutex_lock(&p->lock);
        if (fds[1].revents) {
            char drain[64];
            (void)!read(p->wake[0], drain, sizeof drain);
        }
        /* Whatever was cut or silenced while this thread polled is not
         * read; what is due is written on the next round. */
        for (int k = 2; k < n; k++) {
            pair *c = &p->pairs[owner[k] / 2];
            int side = owner[k] % 2;
            if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR))
                && (fds[k].events & POLLIN) && may_read(p, c, side))
                take(p, c, side);
        }
        if (fds[0].revents)
            take_connection(p);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

test_proxy *test_proxy_start_delayed(uint16_t to_port, uint16_t *port,
                                     unsigned delay_ms)
{
    test_proxy *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    p->to_port = to_port;
    p->delay_ns = (int64_t)delay_ms * 1000000;
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

test_proxy *test_proxy_start(uint16_t to_port, uint16_t *port)
{
    return test_proxy_start_delayed(to_port, port, 0);
}

static void wake(test_proxy *p)
{
    (void)!write(p->wake[1], "x", 1);
}

void test_proxy_set_delay(test_proxy *p, unsigned delay_ms)
{
    pthread_mutex_lock(&p->lock);
    p->delay_ns = (int64_t)delay_ms * 1000000;
    pthread_mutex_unlock(&p->lock);
}

static void set_cut(test_proxy *p, bool cut)
{
    pthread_mutex_lock(&p->lock);
    p->cut = cut;
    pthread_mutex_unlock(&p->lock);
    wake(p);
}

void test_proxy_cut(test_proxy *p)
{
    set_cut(p, true);
}

void test_proxy_heal(test_proxy *p)
{
    set_cut(p, false);
}

void test_proxy_silence(test_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->n_pairs; i++)
        p->pairs[i].mute[0] = p->pairs[i].mute[1] = true;
    pthread_mutex_unlock(&p->lock);
    wake(p);
}

static void watch_for(test_proxy *p, const void *needle, size_t len,
                      bool mute, bool requests_too)
{
    cr_assert(len > 0 && len <= sizeof p->needle);
    pthread_mutex_lock(&p->lock);
    memcpy(p->needle, needle, len);
    p->n_needle = len;
    p->n_kept = 0;
    p->mute = mute;
    p->requests_too = requests_too;
    p->seen = false;
    p->watching = true;
    pthread_mutex_unlock(&p->lock);
}

void test_proxy_silence_from(test_proxy *p, const void *needle, size_t len,
                             bool requests_too)
{
    watch_for(p, needle, len, true, requests_too);
}

void test_proxy_watch_for(test_proxy *p, const void *needle, size_t len)
{
    watch_for(p, needle, len, false, false);
}

bool test_proxy_seen(test_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    bool seen = p->seen;
    pthread_mutex_unlock(&p->lock);
    return seen;
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

size_t test_proxy_queued_peak(test_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    size_t peak = p->queued_peak;
    pthread_mutex_unlock(&p->lock);
    return peak;
}

uint64_t test_proxy_from_clients(test_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t n = p->from_clients;
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
