/*
 * nng_sub.c: see nng_sub.h. The pipe callbacks count the pipes from
 * NNG_PIPE_EV_ADD_PRE, which nng runs before the protocol starts a pipe's
 * first read, to NNG_PIPE_EV_REM_POST, its end.
 */
#include "nng_sub.h"

#include "nng_handoff.h"

#include <errno.h>
#include <nng/protocol/pubsub0/sub.h>
#include <time.h>

#define RECONNECT_MS (3600 * 1000)

static void on_pipe(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    rl_nng_sub *s = arg;
    (void)pipe;
    rl_nng_handoff(s);
    pthread_mutex_lock(&s->lock);
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        s->pipes++;
    } else {
        if (s->pipes > 0)
            s->pipes--;
        if (s->undrained > 0)
            s->undrained--;
        pthread_cond_broadcast(&s->changed);
    }
    pthread_mutex_unlock(&s->lock);
    rl_nng_handoff(s);
}

int rl_nng_sub_open(rl_nng_sub *s)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->changed, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->lock, NULL);
    s->pipes = s->undrained = 0;
    s->open = true;
    s->draining = false;
    /* The callbacks find the lock made, from the dial on. */
    rl_nng_handoff(s);
    int rv;
    if ((rv = nng_sub0_open(&s->sock)) != 0
        || (rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, on_pipe, s))
               != 0
        || (rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, on_pipe, s))
               != 0)
        return rv;
    return 0;
}

bool rl_nng_sub_connected(rl_nng_sub *s)
{
    pthread_mutex_lock(&s->lock);
    bool connected = s->pipes > 0;
    pthread_mutex_unlock(&s->lock);
    return connected;
}

void rl_nng_sub_drain(rl_nng_sub *s)
{
    if (!s->open || s->draining)
        return;
    s->draining = true;
    clock_gettime(CLOCK_MONOTONIC, &s->drained_at);
    /* Fewer new connections meanwhile: one in its handshake at the close
     * is left behind by nng 1.5.2. Not none: nng 1.5.2 waits
     * (int) nni_random() % minimum ms, and at once when that is negative,
     * half its draws (socket.c, dialer_timer_start_locked). */
    nng_socket_set_ms(s->sock, NNG_OPT_RECONNMAXT, RECONNECT_MS);
    nng_socket_set_ms(s->sock, NNG_OPT_RECONNMINT, RECONNECT_MS);
    /* The limit first: a pipe counted after it reads under it. */
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, 1);
    pthread_mutex_lock(&s->lock);
    s->undrained = s->pipes;
    pthread_mutex_unlock(&s->lock);
}

void rl_nng_sub_close(rl_nng_sub *s, int wait_ms)
{
    if (!s->open)
        return;
    rl_nng_sub_drain(s);
    s->open = false;
    struct timespec until = s->drained_at;
    until.tv_sec += wait_ms / 1000;
    until.tv_nsec += (long)(wait_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&s->lock);
    while (s->undrained > 0
           && pthread_cond_timedwait(&s->changed, &s->lock, &until)
                  != ETIMEDOUT)
        ;
    pthread_mutex_unlock(&s->lock);
    /* The callbacks stay: nng_close returns once every pipe's have run. */
    if (nng_socket_id(s->sock) > 0)
        nng_close(s->sock);
    /* After the last callback. */
    rl_nng_handoff(s);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
}
