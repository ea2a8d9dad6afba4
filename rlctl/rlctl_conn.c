/*
 * rlctl_conn.c: see rlctl_conn.h.
 */
#include "rlctl_conn.h"

#include "redis_conn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define ARGS_MAX 16

struct rlctl_conn {
    uv_loop_t loop;
    uv_timer_t deadline;
    rl_redis_conn *conn;
    unsigned timeout_ms;
    bool connected;
    bool timed_out;
    redisReply *reply;
    char error[300];
};

static void on_connected(void *arg)
{
    rlctl_conn *c = arg;
    c->connected = true;
}

static void on_reply(void *arg, redisReply *r)
{
    rlctl_conn *c = arg;
    if (c->reply == NULL)
        c->reply = r;
    else
        freeReplyObject(r); /* none is sent before the last is read */
}

static void on_lost(void *arg, const char *why)
{
    rlctl_conn *c = arg;
    snprintf(c->error, sizeof c->error, "%s", why);
    rl_redis_conn_close(c->conn);
    c->conn = NULL;
}

static const rl_redis_conn_events events = {
    .connected = on_connected, .reply = on_reply, .lost = on_lost};

static void on_deadline(uv_timer_t *t)
{
    rlctl_conn *c = t->data;
    c->timed_out = true;
}

/* Runs the loop until done(c), the connection is lost, or the deadline. */
static bool wait_for(rlctl_conn *c, bool (*done)(const rlctl_conn *))
{
    c->timed_out = false;
    uv_timer_start(&c->deadline, on_deadline, c->timeout_ms, 0);
    while (!done(c) && c->conn != NULL && !c->timed_out)
        uv_run(&c->loop, UV_RUN_ONCE);
    uv_timer_stop(&c->deadline);
    if (done(c))
        return true;
    if (c->timed_out) {
        snprintf(c->error, sizeof c->error, "no answer within %u ms",
                 c->timeout_ms);
        rl_redis_conn_close(c->conn);
        c->conn = NULL;
    }
    return false;
}

static bool is_connected(const rlctl_conn *c)
{
    return c->connected;
}

static bool has_reply(const rlctl_conn *c)
{
    return c->reply != NULL;
}

rlctl_conn *rlctl_conn_open(const rl_endpoint *ep, rl_redis_tls *tls,
                            unsigned timeout_ms, char *err, size_t errlen)
{
    rlctl_conn *c = calloc(1, sizeof *c);
    if (c == NULL || uv_loop_init(&c->loop) != 0) {
        free(c);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->timeout_ms = timeout_ms;
    uv_timer_init(&c->loop, &c->deadline);
    c->deadline.data = c;
    c->conn = rl_redis_conn_open(&c->loop, ep, tls, &events, c);
    if (c->conn == NULL)
        snprintf(c->error, sizeof c->error, "out of memory");
    if (c->conn == NULL || !wait_for(c, is_connected)) {
        snprintf(err, errlen, "%s", c->error);
        rlctl_conn_close(c);
        return NULL;
    }
    return c;
}

redisReply *rlctl_command(rlctl_conn *c, const char *arg0, ...)
{
    const char *argv[ARGS_MAX];
    size_t lens[ARGS_MAX];
    int argc = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a != NULL && argc < ARGS_MAX;
         a = va_arg(ap, const char *)) {
        argv[argc] = a;
        lens[argc++] = strlen(a);
    }
    va_end(ap);
    return rlctl_command_argv(c, argc, argv, lens);
}

redisReply *rlctl_command_argv(rlctl_conn *c, int argc, const char **argv,
                               const size_t *lens)
{
    if (c->conn == NULL)
        return NULL;
    if (rl_redis_conn_command(c->conn, argc, argv, lens) != 0) {
        snprintf(c->error, sizeof c->error, "out of memory");
        return NULL;
    }
    if (!wait_for(c, has_reply))
        return NULL;
    redisReply *r = c->reply;
    c->reply = NULL;
    return r;
}

const char *rlctl_conn_error(const rlctl_conn *c)
{
    return c->error;
}

void rlctl_conn_close(rlctl_conn *c)
{
    if (c == NULL)
        return;
    rl_redis_conn_close(c->conn);
    uv_close((uv_handle_t *)&c->deadline, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    freeReplyObject(c->reply);
    free(c);
}
