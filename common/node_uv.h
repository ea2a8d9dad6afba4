/*
 * node_uv.h: hiredis's async context driven by a libuv poll handle.
 * Private to rl.
 */
#ifndef RL_COMMON_NODE_UV_H
#define RL_COMMON_NODE_UV_H

#include <hiredis/async.h>
#include <uv.h>

/* rl_node_uv_attach makes loop drive ac's socket. Returns REDIS_OK, or
 * REDIS_ERR (out of memory, or ac is attached already). The watcher is
 * freed when hiredis frees the context. */
int rl_node_uv_attach(redisAsyncContext *ac, uv_loop_t *loop);

#endif
