/*
 * node_uv.c: the glue between hiredis's async event hooks (addRead,
 * delRead, addWrite, delWrite, cleanup) and libuv.
 *
 * Written instead of using hiredis 0.14's adapters/libuv.h because that
 * adapter drops poll errors: when a connect is refused, libuv reports
 * UV_EBADF on the poll handle and the adapter returns without telling
 * hiredis, so the connection hangs until some timeout. Here an error is
 * handed to hiredis as an event, and hiredis finds the socket's error
 * itself (a refused connect, a reset connection).
 *
 * Writes do not wait for the socket to be writable: a connected socket
 * almost always is, and every change of a libuv poll handle's events costs
 * two epoll_ctl calls (libuv 1.44 removes the fd and adds it back). Output
 * hiredis asks to write is flushed by a prepare handle, once per loop
 * iteration just before the loop polls, so all the commands queued in one
 * iteration go out in one write; only when the socket is full (or still
 * connecting) does the poll handle watch for writability. perf on an agent
 * at 64 checks in flight put epoll_ctl at a quarter of its time before.
 */
#include "node_uv.h"

#include <stdbool.h>
#include <stdlib.h>

/* Set while this thread is inside redisAsyncHandleWrite. Output hiredis
 * asks to write then waits for writability instead of a flush: either the
 * write did not all fit, or a failed write's callbacks queued commands to
 * another node during the prepare pass, and libuv does not run a prepare
 * handle started in that pass until after the next (maybe blocking) poll. */
static _Thread_local bool writing;

typedef struct watcher {
    uv_poll_t handle;
    uv_prepare_t flush;
    redisAsyncContext *ac; /* NULL once hiredis let go of it */
    int events;            /* what the poll handle watches */
    int open_handles;
} watcher;

static void on_poll(uv_poll_t *handle, int status, int events);

static void update(watcher *w, int events)
{
    if (events == w->events)
        return;
    w->events = events;
    if (events != 0)
        uv_poll_start(&w->handle, events, on_poll);
    else
        uv_poll_stop(&w->handle);
}

static void write_now(watcher *w)
{
    writing = true;
    redisAsyncHandleWrite(w->ac);
    writing = false;
}

static void on_poll(uv_poll_t *handle, int status, int events)
{
    watcher *w = handle->data;
    if (w->ac == NULL)
        return;
    if (status < 0) {
        /* libuv stopped the handle before reporting the error: what hiredis
         * asks for next must start it again. */
        w->events = 0;
        /* Let hiredis look at the socket: it reports the error. */
        if (!(w->ac->c.flags & REDIS_CONNECTED))
            write_now(w);
        else
            redisAsyncHandleRead(w->ac);
        return;
    }
    if (events & UV_READABLE)
        redisAsyncHandleRead(w->ac);
    /* Reading may have freed the context (a disconnect). */
    if (w->ac != NULL && (events & UV_WRITABLE))
        write_now(w);
}

static void on_flush(uv_prepare_t *flush)
{
    watcher *w = flush->data;
    uv_prepare_stop(flush);
    if (w->ac != NULL)
        write_now(w);
}

static void add_read(void *p)
{
    watcher *w = p;
    update(w, w->events | UV_READABLE);
}

static void del_read(void *p)
{
    watcher *w = p;
    update(w, w->events & ~UV_READABLE);
}

static void add_write(void *p)
{
    watcher *w = p;
    if (writing || !(w->ac->c.flags & REDIS_CONNECTED))
        update(w, w->events | UV_WRITABLE);
    else
        uv_prepare_start(&w->flush, on_flush);
}

static void del_write(void *p)
{
    watcher *w = p;
    uv_prepare_stop(&w->flush);
    update(w, w->events & ~UV_WRITABLE);
}

static void on_closed(uv_handle_t *handle)
{
    watcher *w = handle->data;
    if (--w->open_handles == 0)
        free(w);
}

static void cleanup(void *p)
{
    watcher *w = p;
    w->ac = NULL;
    uv_close((uv_handle_t *)&w->handle, on_closed);
    uv_close((uv_handle_t *)&w->flush, on_closed);
}

int rl_node_uv_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    if (ac->ev.data != NULL)
        return REDIS_ERR;
    watcher *w = calloc(1, sizeof *w);
    if (w == NULL)
        return REDIS_ERR;
    if (uv_poll_init(loop, &w->handle, ac->c.fd) != 0) {
        free(w);
        return REDIS_ERR;
    }
    uv_prepare_init(loop, &w->flush);
    w->handle.data = w->flush.data = w;
    w->open_handles = 2;
    w->ac = ac;
    ac->ev.addRead = add_read;
    ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write;
    ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    ac->ev.data = w;
    return REDIS_OK;
}
