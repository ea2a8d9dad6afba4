/*
 * store_uv.c: the glue between hiredis's async event hooks (addRead,
 * delRead, addWrite, delWrite, cleanup) and a libuv poll handle.
 *
 * Written instead of using hiredis 0.14's adapters/libuv.h because that
 * adapter drops poll errors: when a connect is refused, libuv reports
 * UV_EBADF on the poll handle and the adapter returns without telling
 * hiredis, so the connection hangs until some timeout. Here an error is
 * handed to hiredis as an event, and hiredis finds the socket's error
 * itself (a refused connect, a reset connection).
 */
#include "node_uv.h"

#include <stdlib.h>

typedef struct watcher {
    uv_poll_t handle;
    redisAsyncContext *ac; /* NULL once hiredis let go of it */
    int events;
} watcher;

static void on_poll(uv_poll_t *handle, int status, int events)
{
    watcher *w = handle->data;
    if (w->ac == NULL)
        return;
    if (status < 0) {
        /* Let hiredis look at the socket: it reports the error. */
        if (!(w->ac->c.flags & REDIS_CONNECTED))
            redisAsyncHandleWrite(w->ac);
        else
            redisAsyncHandleRead(w->ac);
        return;
    }
    if (events & UV_READABLE)
        redisAsyncHandleRead(w->ac);
    /* Reading may have freed the context (a disconnect). */
    if (w->ac != NULL && (events & UV_WRITABLE))
        redisAsyncHandleWrite(w->ac);
}

static void update(watcher *w, int events)
{
    w->events = events;
    if (events != 0)
        uv_poll_start(&w->handle, events, on_poll);
    else
        uv_poll_stop(&w->handle);
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
    update(w, w->events | UV_WRITABLE);
}

static void del_write(void *p)
{
    watcher *w = p;
    update(w, w->events & ~UV_WRITABLE);
}

static void on_closed(uv_handle_t *handle)
{
    free(handle->data);
}

static void cleanup(void *p)
{
    watcher *w = p;
    w->ac = NULL;
    uv_close((uv_handle_t *)&w->handle, on_closed);
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
    w->handle.data = w;
    w->ac = ac;
    ac->ev.addRead = add_read;
    ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write;
    ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    ac->ev.data = w;
    return REDIS_OK;
}
