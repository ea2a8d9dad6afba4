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

/* From now on, the connection that carries the len bytes at needle to its
 * server carries nothing back from then on, for good: the server does the
 * work of that request and of those after it, and their answers are lost.
 * Answers to what was sent before pass. (For a REQ socket, with one request
 * in flight at most: the request that names needle is the first to go
 * unanswered.) needle is copied; up to 64 KiB sent after this call are
 * searched. */
void test_proxy_silence_answers_from(test_proxy *p, const void *needle,
                                     size_t len);

/* Whether a connection has carried the needle and gone silent so. */
bool test_proxy_silenced(test_proxy *p);

/* How many connections the proxy has accepted. */
int test_proxy_accepted(test_proxy *p);

/* Closes every connection and frees the proxy. */
void test_proxy_stop(test_proxy *p);

#endif
