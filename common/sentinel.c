/*
 * sentinel.c: see sentinel.h. Each ask is a short connection of its own
 * to one sentinel (AUTH if the sentinels have a password, then SENTINEL
 * GET-MASTER-ADDR-BY-NAME); a sentinel that refuses, does not know the
 * master or does not answer within RL_SENTINEL_ASK_MS is passed over for
 * the next. The answer is only a candidate: node.c's handshake reads the
 * server's role and refuses a replica (a sentinel that has not yet seen a
 * failover names the old primary), and connects again, asking again.
 *
 * The watch is one SUBSCRIBE +switch-master connection, to the sentinels
 * in turn: the message "<master> <old ip> <old port> <new ip> <new port>"
 * for this store's master makes the node reconnect at once rather than
 * when its old primary, demoted, first answers READONLY. Lost, it is made
 * again a second later to the next sentinel.
 */
#include "sentinel.h"

#include "node_uv.h"

#include <hiredis/async.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WATCH_RETRY_MS 1000

struct rl_sentinel {
    uv_loop_t *loop;
    const rl_sentinel_config *cfg;
    const rl_logger *log;
    rl_sentinel_moved_fn moved;
    void *moved_arg;

    redisAsyncContext *ask;  /* the ask in flight, or NULL */
    size_t next;             /* the sentinel asked first */
    size_t tried;            /* sentinels tried by this locate */
    rl_sentinel_found_fn found;
    void *found_arg;
    char why[RL_HOST_MAX + 320]; /* the last sentinel's failure */
    uv_timer_t ask_timer;    /* the next ask; an answer's deadline */

    redisAsyncContext *watch;
    size_t watch_at;
    uv_timer_t watch_timer;
    bool closed;
    int open_handles;
};

static void ask_next(rl_sentinel *s);
static void watch_later(rl_sentinel *s);

static const rl_endpoint *sentinel_at(const rl_sentinel *s, size_t i)
{
    return &s->cfg->addresses[i % s->cfg->n_addresses];
}

/* A context to one sentinel, attached to the loop, with AUTH queued when
 * the sentinels have a password. NULL with why set. */
static redisAsyncContext *dial(rl_sentinel *s, const rl_endpoint *ep)
{
    redisAsyncContext *ac = redisAsyncConnect(ep->host, ep->port);
    if (ac == NULL || ac->err) {
        snprintf(s->why, sizeof s->why, "sentinel %s:%u: %s", ep->host,
                 ep->port, ac != NULL ? ac->errstr : "out of memory");
        if (ac != NULL)
            redisAsyncFree(ac);
        return NULL;
    }
    if (rl_node_uv_attach(ac, s->loop) != REDIS_OK) {
        snprintf(s->why, sizeof s->why, "sentinel %s:%u: cannot watch its "
                 "socket", ep->host, ep->port);
        redisAsyncFree(ac);
        return NULL;
    }
    ac->data = s;
    const rl_sentinel_config *cfg = s->cfg;
    if (cfg->password != NULL && cfg->username != NULL)
        redisAsyncCommand(ac, NULL, NULL, "AUTH %s %s", cfg->username,
                          cfg->password);
    else if (cfg->password != NULL)
        redisAsyncCommand(ac, NULL, NULL, "AUTH %s", cfg->password);
    return ac;
}

/* --- Asking ------------------------------------------------------------ */

static void drop_ask(rl_sentinel *s)
{
    redisAsyncContext *ac = s->ask;
    s->ask = NULL;
    if (ac != NULL)
        redisAsyncFree(ac);
}

static void found(rl_sentinel *s, const rl_endpoint *primary,
                  const char *error)
{
    uv_timer_stop(&s->ask_timer);
    drop_ask(s);
    rl_sentinel_found_fn fn = s->found;
    s->found = NULL;
    if (fn != NULL)
        fn(s->found_arg, primary, error);
}

/* [ip, port] of the master, or nil when this sentinel does not know it. */
static void on_master(redisAsyncContext *ac, void *r, void *privdata)
{
    rl_sentinel *s = ac->data;
    const redisReply *reply = r;
    const rl_endpoint *ep = privdata;
    if (s->ask != ac || s->closed)
        return;
    rl_endpoint primary;
    if (reply != NULL && reply->type == REDIS_REPLY_ARRAY
        && reply->elements == 2
        && reply->element[0]->type == REDIS_REPLY_STRING
        && reply->element[1]->type == REDIS_REPLY_STRING) {
        char text[RL_HOST_MAX + 16];
        snprintf(text, sizeof text,
                 strchr(reply->element[0]->str, ':') ? "[%s]:%s" : "%s:%s",
                 reply->element[0]->str, reply->element[1]->str);
        if (rl_endpoint_parse(text, &primary) == RL_OK) {
            /* Asked first next time: it knew. */
            s->next = (size_t)(ep - s->cfg->addresses);
            found(s, &primary, NULL);
            return;
        }
    }
    snprintf(s->why, sizeof s->why, "sentinel %s:%u: %s", ep->host,
             ep->port,
             reply == NULL ? "connection lost"
             : reply->type == REDIS_REPLY_ERROR ? reply->str
             : reply->type == REDIS_REPLY_NIL ? "does not know the master"
                                              : "unexpected answer");
    drop_ask(s);
    ask_next(s);
}

static void ask_fired(uv_timer_t *t)
{
    rl_sentinel *s = t->data;
    if (s->ask != NULL) {
        const rl_endpoint *ep = sentinel_at(s, s->next + s->tried - 1);
        snprintf(s->why, sizeof s->why, "sentinel %s:%u did not answer "
                 "within %d ms", ep->host, ep->port, RL_SENTINEL_ASK_MS);
        drop_ask(s);
    }
    ask_next(s);
}

static void ask_next(rl_sentinel *s)
{
    while (s->tried < s->cfg->n_addresses) {
        const rl_endpoint *ep = sentinel_at(s, s->next + s->tried++);
        redisAsyncContext *ac = dial(s, ep);
        if (ac == NULL)
            continue;
        if (redisAsyncCommand(ac, on_master, (void *)ep,
                              "SENTINEL get-master-addr-by-name %s",
                              s->cfg->master) != REDIS_OK) {
            redisAsyncFree(ac);
            continue;
        }
        s->ask = ac;
        uv_timer_start(&s->ask_timer, ask_fired, RL_SENTINEL_ASK_MS, 0);
        return;
    }
    char error[RL_HOST_MAX + 320 + RL_NAME_MAX + 64];
    snprintf(error, sizeof error, "no sentinel named master '%s' (last: "
             "%s)", s->cfg->master, s->why);
    found(s, NULL, error);
}

void rl_sentinel_locate(rl_sentinel *s, rl_sentinel_found_fn fn, void *arg)
{
    uv_timer_stop(&s->ask_timer);
    drop_ask(s);
    s->found = fn;
    s->found_arg = arg;
    s->tried = 0;
    s->why[0] = '\0';
    /* From the loop, not from inside this call. */
    uv_timer_start(&s->ask_timer, ask_fired, 0, 0);
}

/* --- Watching ---------------------------------------------------------- */

/* Subscribed: every message of +switch-master comes here. */
static void on_switch(redisAsyncContext *ac, void *r, void *privdata)
{
    rl_sentinel *s = ac->data;
    const redisReply *reply = r;
    (void)privdata;
    if (s->watch != ac || s->closed || reply == NULL)
        return;
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3
        || reply->element[2]->type != REDIS_REPLY_STRING
        || strcmp(reply->element[0]->str, "message") != 0)
        return;
    const char *text = reply->element[2]->str;
    size_t len = strlen(s->cfg->master);
    if (strncmp(text, s->cfg->master, len) != 0 || text[len] != ' ')
        return;
    rl_log(s->log, RL_LOG_WARN, "store_master_switched", "master=%s "
           "change=\"%s\"", s->cfg->master, text + len + 1);
    s->moved(s->moved_arg);
}

static void on_watch_lost(const redisAsyncContext *ac, int status)
{
    rl_sentinel *s = ac->data;
    (void)status;
    if (s->watch != ac || s->closed)
        return;
    s->watch = NULL; /* hiredis frees it */
    watch_later(s);
}

static void watch_fired(uv_timer_t *t)
{
    rl_sentinel *s = t->data;
    const rl_endpoint *ep = sentinel_at(s, s->watch_at++);
    redisAsyncContext *ac = dial(s, ep);
    if (ac == NULL) {
        watch_later(s);
        return;
    }
    redisAsyncSetDisconnectCallback(ac, on_watch_lost);
    if (redisAsyncCommand(ac, on_switch, NULL, "SUBSCRIBE +switch-master")
        != REDIS_OK) {
        redisAsyncFree(ac);
        watch_later(s);
        return;
    }
    s->watch = ac;
}

static void watch_later(rl_sentinel *s)
{
    if (!s->closed)
        uv_timer_start(&s->watch_timer, watch_fired, WATCH_RETRY_MS, 0);
}

/* --- Life -------------------------------------------------------------- */

rl_sentinel *rl_sentinel_new(uv_loop_t *loop, const rl_store_config *cfg,
                             const rl_logger *log, rl_sentinel_moved_fn moved,
                             void *arg)
{
    rl_sentinel *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    *s = (rl_sentinel){.loop = loop, .cfg = &cfg->sentinel, .log = log,
                       .moved = moved, .moved_arg = arg, .open_handles = 2};
    uv_timer_init(loop, &s->ask_timer);
    uv_timer_init(loop, &s->watch_timer);
    s->ask_timer.data = s->watch_timer.data = s;
    uv_timer_start(&s->watch_timer, watch_fired, 0, 0);
    return s;
}

static void timer_closed(uv_handle_t *h)
{
    rl_sentinel *s = h->data;
    if (--s->open_handles == 0)
        free(s);
}

void rl_sentinel_close(rl_sentinel *s)
{
    if (s == NULL)
        return;
    s->closed = true;
    s->found = NULL;
    drop_ask(s);
    redisAsyncContext *watch = s->watch;
    s->watch = NULL;
    if (watch != NULL)
        redisAsyncFree(watch);
    uv_close((uv_handle_t *)&s->ask_timer, timer_closed);
    uv_close((uv_handle_t *)&s->watch_timer, timer_closed);
}
