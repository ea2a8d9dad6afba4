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

/* From now on, the connection whose client sends the len bytes at needle
 * goes silent for good from the request that holds them on (for a REQ
 * socket, with one request in flight at most, that request is the first
 * to go unanswered; what was sent before is answered): nothing comes back,
 * and with requests_too nothing more reaches the server, that request
 * included (never received); without, the server gets it and those after
 * it and does the work, and its answers are lost. needle is copied; up to
 * 64 KiB sent after this call are searched. */
void test_proxy_silence_from(test_proxy *p, const void *needle, size_t len,
                             bool requests_too);

/* Whether a connection has carried the needle and gone silent so. */
bool test_proxy_silenced(test_proxy *p);

/* How many connections the proxy has accepted. */
int test_proxy_accepted(test_proxy *p);

/* Closes every connection and frees the proxy. */
void test_proxy_stop(test_proxy *p);

#endif
