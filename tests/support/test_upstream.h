/*
 * test_upstream.h: an HTTP upstream for rl-gateway and nginx that serves
 * connections at once (a thread each), sleeps before it answers, and
 * answers with the cost its request asks for: the request's X-Test-Cost
 * header becomes the response's X-Cost (none without it), as an LLM
 * backend reports the tokens a response took. It counts the requests it
 * is serving, and the most it served at once.
 */
#ifndef RL_TEST_UPSTREAM_H
#define RL_TEST_UPSTREAM_H

#include <pthread.h>
#include <stdint.h>

typedef struct test_upstream {
    int listener;
    uint16_t port;
    unsigned sleep_ms;        /* before each answer */
    pthread_t acceptor;
    pthread_mutex_t lock;     /* over what follows */
    pthread_cond_t idle;      /* signalled when serving drops to 0 */
    int serving, most;        /* requests being served now, at most */
    int served;               /* answered */
    int threads;              /* connection threads alive */
} test_upstream;

/* Listens on a free loopback port. */
void test_upstream_start(test_upstream *u, unsigned sleep_ms);
/* Stops accepting and waits for the connections being served. */
void test_upstream_stop(test_upstream *u);
/* The most requests it served at once, and how many it answered. */
int test_upstream_most(test_upstream *u);
int test_upstream_served(test_upstream *u);
/* The requests it is serving now. */
int test_upstream_busy(test_upstream *u);

/* A client of a proxy in front of it, without Criterion asserts (threads
 * may call it): GET path on its own connection with an X-Api-Key and, if
 * cost is not NULL, an X-Test-Cost; the response's status, or -1. */
int test_upstream_call(uint16_t port, const char *path, const char *key,
                       const char *cost);
/* Each of costs[0..n-1] (NULL: none) in turn, one request each; how many
 * were answered 200. */
int test_upstream_calls(uint16_t port, const char *key,
                        const char *const *costs, int n);
/* clients threads at once, each running test_upstream_calls with its own
 * each costs of costs (clients x each, row by row); how many were
 * answered 200. */
int test_upstream_clients(uint16_t port, const char *key,
                          const char *const *costs, int clients, int each);
/* n requests of key (no cost) at once: adds the 200s to *ok and the 429s
 * to *refused, and fails the test on any other status. */
void test_upstream_burst(uint16_t port, const char *key, int n, int *ok,
                         int *refused);
/* Asks every 20 ms until a request of key is answered 200, within_ms at
 * most; fails the test, saying how long it asked, if none was. */
void test_upstream_expect_room(uint16_t port, const char *key,
                               unsigned within_ms);
/* The same request, sent on a connection the caller closes: its fd. */
int test_upstream_send(uint16_t port, const char *path, const char *key,
                       const char *cost);
/* The response to a request test_upstream_send sent, read to its end:
 * its status, or -1. Closes fd. */
int test_upstream_read_status(int fd);
/* The same request, and the client gone (closed) after wait_ms. */
void test_upstream_abandon(uint16_t port, const char *path, const char *key,
                           const char *cost, unsigned wait_ms);

#endif
