/*
 * test_proxy.h: a TCP proxy on loopback, on its own thread, that can make
 * the connections it carries go silent: they stay open (no FIN, no RST) and
 * nothing passes either way, as when a peer vanishes without closing or a
 * middlebox drops a connection's state. Connections made afterwards are
 * carried normally.
 */
#ifndef RL_TEST_PROXY_H
#define RL_TEST_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct test_proxy test_proxy;

/* Listens on a free loopback port (*port) and carries each connection to
 * 127.0.0.1:to_port. The test fails if it cannot. */
test_proxy *test_proxy_start(uint16_t to_port, uint16_t *port);

/* Every connection open now goes silent for good. */
void test_proxy_silence(test_proxy *p);

/* Every connection open now carries what its client sends, but nothing
 * back, for good: the server does the work, its answers are lost. */
void test_proxy_silence_answers(test_proxy *p);

/* Every connection open now carries one more answer, then goes on as
 * test_proxy_silence_answers says: a request sent after this call is the
 * first to go unanswered, none is in flight. Returns once one connection
 * has so gone (the test fails if none has after 5 s). What those
 * connections' clients send from then on is kept for test_proxy_carried
 * (the first 64 KiB). */
void test_proxy_silence_answers_after_the_next(test_proxy *p);

/* Whether the len bytes at s were carried, in one piece, to the server of
 * a connection silenced by test_proxy_silence_answers_after_the_next. */
bool test_proxy_carried(test_proxy *p, const void *s, size_t len);

/* How many connections the proxy has accepted. */
int test_proxy_accepted(test_proxy *p);

/* Closes every connection and frees the proxy. */
void test_proxy_stop(test_proxy *p);

#endif
