/*
 * nng_sub.h: an nng SUB socket that can be closed while its publisher is
 * sending, on Debian 12's nng 1.5.2 too. Private to rl.
 *
 * nng 1.5.2's stream transports (tcp, tls+tcp, ipc) can lose a pipe's read
 * when the pipe is closed as a message arrives on it: the read callback
 * (tcptran_pipe_recv_cb and its tls and ipc twins), having just read a
 * header or part of a body, arms the next read on an aio the close has
 * stopped; nni_aio_begin refuses it without completing anything, so the
 * SUB protocol's receive on that pipe never ends. The reaper thread then
 * waits for it forever (pipe_destroy, sub0_pipe_stop, nni_aio_stop), and
 * so does nng_close, for the pipe to go (nni_sock_shutdown). Fixed
 * upstream in nng 1.6.0 (pull request #1636), and by the abort of such an
 * aio in nng 1.9.0 (issue #1813, pull request #1824). A REQ socket closes
 * safely once no reply is due; a publisher sends when it likes.
 *
 * A pipe that ends by itself is safe: a message header over
 * NNG_OPT_RECVMAXSZ fails the read before any body read is armed, and the
 * protocol closes the pipe from that failure, with no read in flight.
 * nng applies a new limit to the pipes already open. So the drain lowers
 * the limit to one byte (no message is that short), and the close waits
 * for the pipes open until then to end at their next message before it
 * closes the socket: a message under way at the drain, whose header passed
 * the old limit, is read whole before that next header. Pipes opened
 * since check every header against one byte.
 */
#ifndef RL_COMMON_NNG_SUB_H
#define RL_COMMON_NNG_SUB_H

#include <nng/nng.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

typedef struct rl_nng_sub {
    nng_socket sock;            /* dial, subscribe and receive on it */
    bool open, draining;
    struct timespec drained_at; /* CLOCK_MONOTONIC */
    pthread_mutex_t lock;       /* nng's pipe callbacks -> the close */
    pthread_cond_t changed;
    int pipes;                  /* from before a pipe's first read to its end */
    int undrained;              /* of those, the ones open at the drain */
} rl_nng_sub;

/* Opens s->sock (SUB). s must not move until rl_nng_sub_close. Returns 0
 * or an nng error. */
int rl_nng_sub_open(rl_nng_sub *s);

/* Whether the socket has a connection to its publisher now (a pipe from
 * before its first read to its end). Thread-safe. */
bool rl_nng_sub_connected(rl_nng_sub *s);

/* Lowers the limit: from here on the socket receives nothing, and its
 * pipes end at their next message. Once; not thread-safe. */
void rl_nng_sub_drain(rl_nng_sub *s);

/* Drains (if not done yet) and closes the socket once the pipes open at
 * the drain have ended, or wait_ms after the drain (a publisher that sends
 * nothing has nothing under way either). Stop the socket's aios first. A
 * struct never opened (zeroed) is a no-op. */
void rl_nng_sub_close(rl_nng_sub *s, int wait_ms);

#endif
