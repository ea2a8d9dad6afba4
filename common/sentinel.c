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

#include "redis_conn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WATCH_RETRY_MS 1000

struct rl_sentinel {
    uv_loop_t *loop;
    const rl_sentinel_config *cfg;
    rl_redis_tls *tls;
    const rl_logger *log;
    rl_sentinel_moved_fn moved;
    void *moved_arg;

    rl_redis_conn *ask;      /* the ask in flight, or NULL */
    const rl_endpoint *ask_at;
    bool ask_auth_due;       /* AUTH's reply comes first */
    size_t next;             /* the sentinel asked first */
    size_t tried;            /* sentinels tried by this locate */
    rl_sentinel_found_fn found;
    void *found_arg;
    char why[RL_HOST_MAX + 320]; /* the last sentinel's failure */
    uv_timer_t ask_timer;    /* the next ask; an answer's deadline */

    rl_redis_conn *watch;
    bool watch_auth_due;
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

/* A connection to one sentinel, with AUTH queued when the sentinels have
 * a password (*auth set then). NULL when out of memory, with why set. */
static rl_redis_conn *dial(rl_sentinel *s, const rl_endpoint *ep,
                           const rl_redis_conn_events *ev, bool *auth)
{
    rl_redis_conn *c = rl_redis_conn_open(s->loop, ep, s->tls, ev, s);
    const rl_sentinel_config *cfg = s->cfg;
    *auth = cfg->password != NULL;
    int rc = c == NULL ? -1
             : cfg->password != NULL && cfg->username != NULL
                 ? rl_redis_conn_send(c, "AUTH", cfg->username,
                                      cfg->password, NULL)
             : cfg->password != NULL
                 ? rl_redis_conn_send(c, "AUTH", cfg->password, NULL)
                 : 0;
    if (rc != 0) {
        snprintf(s->why, sizeof s->why, "sentinel %s:%u: out of memory",
                 ep->host, ep->port);
        rl_redis_conn_close(c);
        return NULL;
    }
    return c;
}

/* --- Asking ------------------------------------------------------------ */

static void drop_ask(rl_sentinel *s)
{
    rl_redis_conn_close(s->ask);
    s->ask = NULL;
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

static void ask_failed(rl_sentinel *s, const char *why)
{
    snprintf(s->why, sizeof s->why, "sentinel %s:%u: %s", s->ask_at->host,
             s->ask_at->port, why);
    drop_ask(s);
    ask_next(s);
}

/* AUTH's answer, then [ip, port] of the master, or nil when this sentinel
 * does not know it. */
static void on_ask_reply(void *arg, redisReply *reply)
{
    rl_sentinel *s = arg;
    if (s->ask_auth_due) {
        s->ask_auth_due = false;
        if (reply->type == REDIS_REPLY_ERROR)
            ask_failed(s, reply->str);
        freeReplyObject(reply);
        return;
    }
    rl_endpoint primary;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2
        && reply->element[0]->type == REDIS_REPLY_STRING
        && reply->element[1]->type == REDIS_REPLY_STRING) {
        char text[RL_HOST_MAX + 16];
        snprintf(text, sizeof text,
                 strchr(reply->element[0]->str, ':') ? "[%s]:%s" : "%s:%s",
                 reply->element[0]->str, reply->element[1]->str);
        if (rl_endpoint_parse(text, &primary) == RL_OK) {
            freeReplyObject(reply);
            /* Asked first next time: it knew. */
            s->next = (size_t)(s->ask_at - s->cfg->addresses);
            found(s, &primary, NULL);
            return;
        }
    }
    ask_failed(s, reply->type == REDIS_REPLY_ERROR ? reply->str
                  : reply->type == REDIS_REPLY_NIL ? "does not know the master"
                                                   : "unexpected answer");
    freeReplyObject(reply);
}

static void on_ask_lost(void *arg, const char *why)
{
    ask_failed(arg, why);
}

static void connected_anyway(void *arg)
{
    (void)arg;
}

static const rl_redis_conn_events ask_events = {
    .connected = connected_anyway, .reply = on_ask_reply,
    .lost = on_ask_lost};

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
        rl_redis_conn *c = dial(s, ep, &ask_events, &s->ask_auth_due);
        if (c == NULL)
            continue;
        if (rl_redis_conn_send(c, "SENTINEL", "get-master-addr-by-name",
                               s->cfg->master, NULL) != 0) {
            rl_redis_conn_close(c);
            continue;
        }
        s->ask = c;
        s->ask_at = ep;
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

static void on_watch_lost(void *arg, const char *why);

/* AUTH's answer, SUBSCRIBE's, then every message of +switch-master. */
static void on_watch_reply(void *arg, redisReply *reply)
{
    rl_sentinel *s = arg;
    const char *text = NULL;
    if (s->watch_auth_due) {
        s->watch_auth_due = false;
        if (reply->type == REDIS_REPLY_ERROR) {
            freeReplyObject(reply);
            on_watch_lost(s, "AUTH refused");
            return;
        }
    } else if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 3
               && reply->element[0]->type == REDIS_REPLY_STRING
               && reply->element[2]->type == REDIS_REPLY_STRING
               && strcmp(reply->element[0]->str, "message") == 0) {
        text = reply->element[2]->str;
    }
    size_t len = strlen(s->cfg->master);
    if (text != NULL && strncmp(text, s->cfg->master, len) == 0
        && text[len] == ' ') {
        rl_log(s->log, RL_LOG_WARN, "store_master_switched", "master=%s "
               "change=\"%s\"", s->cfg->master, text + len + 1);
        s->moved(s->moved_arg);
    }
    freeReplyObject(reply);
}

static void on_watch_lost(void *arg, const char *why)
{
    rl_sentinel *s = arg;
    (void)why;
    rl_redis_conn_close(s->watch);
    s->watch = NULL;
    watch_later(s);
}

static const rl_redis_conn_events watch_events = {
    .connected = connected_anyway, .reply = on_watch_reply,
    .lost = on_watch_lost};

static void watch_fired(uv_timer_t *t)
{
    rl_sentinel *s = t->data;
    const rl_endpoint *ep = sentinel_at(s, s->watch_at++);
    rl_redis_conn *c = dial(s, ep, &watch_events, &s->watch_auth_due);
    if (c == NULL
        || rl_redis_conn_send(c, "SUBSCRIBE", "+switch-master", NULL) != 0) {
        rl_redis_conn_close(c);
        watch_later(s);
        return;
    }
    s->watch = c;
}

static void watch_later(rl_sentinel *s)
{
    if (!s->closed)
        uv_timer_start(&s->watch_timer, watch_fired, WATCH_RETRY_MS, 0);
}

/* --- Life -------------------------------------------------------------- */

rl_sentinel *rl_sentinel_new(uv_loop_t *loop, const rl_store_config *cfg,
                             rl_redis_tls *tls, const rl_logger *log, rl_sentinel_moved_fn moved,
                             void *arg)
{
    rl_sentinel *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    *s = (rl_sentinel){.loop = loop, .cfg = &cfg->sentinel, .tls = tls,
                       .log = log,
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
    rl_redis_conn_close(s->watch);
    s->watch = NULL;
    uv_close((uv_handle_t *)&s->ask_timer, timer_closed);
    uv_close((uv_handle_t *)&s->watch_timer, timer_closed);
}
