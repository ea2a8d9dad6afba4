/*
 * test_proxy.h: a TCP proxy on loopback, on its own thread, standing for
 * the network between two peers. It can
 * - delay what it carries: every byte, either way, is delivered a fixed
 *   time after the proxy read it (a one-way delay, as between regions);
 * - cut every link and heal them, as a network partition does: connections
 *   stay open (no FIN, no RST) and carry nothing until healed, then what
 *   was held is delivered, in order, once;
 * - make the connections it carries go silent for good: they stay open and
 *   nothing passes either way, as when a peer vanishes without closing or
 *   a middlebox drops a connection's state. Connections made afterwards
 *   are carried normally.
 *
 * Bytes keep their order on each connection, whatever the delay does.
 * What it has read and not yet delivered is held in memory, at most
 * TEST_PROXY_QUEUE_MAX bytes per direction of a connection: past that the
 * proxy reads no more from that side until it has delivered some, and the
 * sender's TCP holds the rest (nothing is dropped). So with a delay, one
 * direction carries at most TEST_PROXY_QUEUE_MAX bytes a delay.
 *
 * All functions may be called from any thread.
 */
#ifndef RL_TEST_PROXY_H
#define RL_TEST_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TEST_PROXY_QUEUE_MAX ((size_t)4 << 20)

typedef struct test_proxy test_proxy;

/* Listens on a free loopback port (*port) and carries each connection to
 * 127.0.0.1:to_port, without delay. The test fails if it cannot. */
test_proxy *test_proxy_start(uint16_t to_port, uint16_t *port);

/* The same, every byte delivered delay_ms after the proxy read it, in
 * both directions: a request and its answer take 2 * delay_ms more. */
test_proxy *test_proxy_start_delayed(uint16_t to_port, uint16_t *port,
                                     unsigned delay_ms);

/* The delay of the bytes read from now on; those read before keep theirs,
 * and none overtakes another (a byte waits for those read before it). */
void test_proxy_set_delay(test_proxy *p, unsigned delay_ms);

/* From now on nothing passes either way on any connection, open or made
 * during the cut (those are accepted and connected, and carry nothing).
 * Nothing is closed; what the proxy holds stays held, and it reads no
 * more. */
void test_proxy_cut(test_proxy *p);

/* Ends a cut: what was held, in the proxy and in the senders' TCP, is
 * delivered in order, once each byte's delay has passed. */
void test_proxy_heal(test_proxy *p);

/* Every connection open now goes silent for good: what it sent and the
 * proxy holds is not delivered either. */
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

/* From now on, watches for the len bytes at needle from a client, as
 * test_proxy_silence_from does, without silencing anything: whether they
 * have passed is test_proxy_seen's. Another watch replaces this one. */
void test_proxy_watch_for(test_proxy *p, const void *needle, size_t len);
bool test_proxy_seen(test_proxy *p);

/* How many bytes it has read from clients: a test sees a request go out
 * by the count's growing. */
uint64_t test_proxy_from_clients(test_proxy *p);

/* How many connections the proxy has accepted. */
int test_proxy_accepted(test_proxy *p);

/* The most bytes it has held at once for one direction of a connection:
 * never more than TEST_PROXY_QUEUE_MAX. */
size_t test_proxy_queued_peak(test_proxy *p);

/* Closes every connection and frees the proxy and what it holds. */
void test_proxy_stop(test_proxy *p);

#endif
