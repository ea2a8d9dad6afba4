/*
 * store.c: the store of a config. One server is one node. A cluster is one
 * node per primary and a map of the 16,384 slots to them, read with
 * CLUSTER SLOTS from any node that answers (a primary already connected,
 * else the seeds in turn). Debian's hiredis knows nothing of clusters, so
 * the routing is here:
 *
 * - MOVED: the slot has a new owner; it is recorded at once, the call sent
 *   there, and the whole map read again (a resharding moves many slots).
 * - ASK: this one call goes to the target, after ASKING, on the same
 *   connection.
 * - TRYAGAIN, CLUSTERDOWN: sent again after a short backoff while the call
 *   is younger than the store's timeout, then failed (on_error decides).
 * - A node that goes away fails its calls at once and makes the store read
 *   the map again, every 500 ms until every slot's owner answers: that is
 *   how a replica promoted by a failover is found. A new node loads the
 *   scripts before its first call (node.c), so a promoted replica has them.
 * - Nodes no slot points to any more are closed once they are idle.
 *
 * Every call of one turn of the loop that goes to one node leaves in one
 * write (one batch per shard); calls for different shards go out in the
 * same turn, before any reply is read.
 */
#include "store.h"

#include "keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODES_MAX 1024
#define REDIRECTS_MAX 5
#define REFRESH_MIN_MS 100
#define REFRESH_WHILE_DOWN_MS 500
#define RETRY_FIRST_MS 10
#define RETRY_TICK_MS 5
#define WAITING_MAX 100000

typedef struct route {
    struct route *next;     /* the waiting or the retrying list */
    rl_store *store;
    int script, argc;
    rl_store_fn fn;
    void *arg;
    uint16_t slot;
    int redirects, retries;
    uint64_t started_ms, retry_at_ms;
    rl_node *ask_node;      /* the next send goes there, after ASKING */
    const char **argv;      /* point into data */
    size_t *lens;
    char data[];
} route;

struct rl_store {
    uv_loop_t *loop;
    const rl_store_config *cfg;
    rl_redis_tls *tls;
    const rl_script_set *scripts;
    const rl_logger *log;
    rl_store_counters *counters;
    rl_store_counters own_counters;
    uv_prepare_t turn;
    uv_timer_t refresh_timer;
    uv_timer_t retry_timer;
    int open_handles;
    bool closed;

    rl_node *single;                    /* one server */
    rl_node *nodes[NODES_MAX];          /* a cluster's primaries */
    size_t n_nodes;
    rl_node *slots[RL_CLUSTER_SLOTS];
    rl_node *next_map[RL_CLUSTER_SLOTS]; /* being read */
    bool mapped;                        /* a map was read */
    rl_node *control;                   /* a seed, for CLUSTER SLOTS */
    size_t next_seed;
    bool refreshing;
    uint64_t last_refresh_ms;
    route *waiting, **waiting_tail;     /* for a map */
    size_t n_waiting;
    route *retrying;                    /* TRYAGAIN, CLUSTERDOWN */
};

static void dispatch(route *r);
static void refresh(rl_store *s);
static void retry_due(uv_timer_t *t);

static void refresh_fired(uv_timer_t *t)
{
    refresh(t->data);
}

static uint64_t now_ms(const rl_store *s)
{
    return uv_now(s->loop);
}

static void count(atomic_uint_least64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

static void fail(route *r, const char *why)
{
    r->fn(r->arg, NULL, why);
    free(r);
}

/* --- Nodes ------------------------------------------------------------ */

static bool same_endpoint(const rl_endpoint *a, const rl_endpoint *b)
{
    return a->port == b->port && strcmp(a->host, b->host) == 0;
}

static rl_node *node_at(rl_store *s, const rl_endpoint *ep)
{
    for (size_t i = 0; i < s->n_nodes; i++) {
        if (same_endpoint(rl_node_endpoint(s->nodes[i]), ep))
            return s->nodes[i];
    }
    if (s->n_nodes == NODES_MAX)
        return NULL;
    rl_node *n = rl_node_new(s->loop, s->cfg, s->tls, ep, s->scripts,
                             &s->counters->batches, s->log);
    if (n != NULL)
        s->nodes[s->n_nodes++] = n;
    return n;
}

/* "127.0.0.1:6381" (or an IPv6 address and a port after its last ':'). */
static bool parse_host_port(const char *text, rl_endpoint *out)
{
    const char *colon = strrchr(text, ':');
    if (colon == NULL || colon == text
        || (size_t)(colon - text) >= sizeof out->host)
        return false;
    long port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535)
        return false;
    memcpy(out->host, text, (size_t)(colon - text));
    out->host[colon - text] = '\0';
    out->port = (uint16_t)port;
    return true;
}

/* Closes the nodes no slot points to, once they have nothing in flight. */
static void close_unused(rl_store *s)
{
    for (size_t i = 0; i < s->n_nodes;) {
        rl_node *n = s->nodes[i];
        bool used = false;
        for (size_t slot = 0; slot < RL_CLUSTER_SLOTS && !used; slot++)
            used = s->slots[slot] == n;
        if (used || rl_node_in_flight(n) > 0) {
            i++;
            continue;
        }
        rl_log(s->log, RL_LOG_INFO, "store_node_dropped", "addr=%s:%u",
               rl_node_endpoint(n)->host, rl_node_endpoint(n)->port);
        rl_node_close(n);
        s->nodes[i] = s->nodes[--s->n_nodes];
    }
}

static bool all_slots_up(const rl_store *s)
{
    if (!s->mapped)
        return false;
    for (size_t slot = 0; slot < RL_CLUSTER_SLOTS; slot++) {
        if (s->slots[slot] == NULL || !rl_node_up(s->slots[slot]))
            return false;
    }
    return true;
}

/* --- The slot map ----------------------------------------------------- */

/* One CLUSTER SLOTS entry: [start, end, [host, port, id], replicas...]. */
static bool apply_range(rl_store *s, const redisReply *e,
                        const rl_endpoint *asked, rl_node **map)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3
        || e->element[0]->type != REDIS_REPLY_INTEGER
        || e->element[1]->type != REDIS_REPLY_INTEGER
        || e->element[2]->type != REDIS_REPLY_ARRAY
        || e->element[2]->elements < 2
        || e->element[2]->element[0]->type != REDIS_REPLY_STRING
        || e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
        return false;
    long long start = e->element[0]->integer, end = e->element[1]->integer;
    const redisReply *primary = e->element[2];
    rl_endpoint ep = {.port = (uint16_t)primary->element[1]->integer};
    /* An empty host means "the node you asked". */
    snprintf(ep.host, sizeof ep.host, "%s",
             primary->element[0]->len > 0 ? primary->element[0]->str
                                          : asked->host);
    if (start < 0 || end >= RL_CLUSTER_SLOTS || start > end)
        return false;
    rl_node *n = node_at(s, &ep);
    if (n == NULL)
        return false;
    for (long long slot = start; slot <= end; slot++)
        map[slot] = n;
    return true;
}

/* Sends the calls that waited for a map, or fails them with why. */
static void release_waiting(rl_store *s, const char *why)
{
    route *r = s->waiting;
    s->waiting = NULL;
    s->waiting_tail = &s->waiting;
    s->n_waiting = 0;
    while (r != NULL) {
        route *next = r->next;
        if (why == NULL)
            dispatch(r);
        else
            fail(r, why);
        r = next;
    }
}

static void on_slots(void *arg, const redisReply *reply, const char *error)
{
    rl_store *s = arg;
    s->refreshing = false;
    if (s->closed)
        return;
    rl_node **map = s->next_map;
    memset(map, 0, sizeof s->next_map);
    bool ok = reply != NULL && reply->type == REDIS_REPLY_ARRAY
              && reply->elements > 0;
    const rl_endpoint *asked = s->control != NULL
                                   ? rl_node_endpoint(s->control)
                                   : &s->cfg->nodes[0];
    for (size_t i = 0; ok && i < reply->elements; i++)
        ok = apply_range(s, reply->element[i], asked, map);
    if (!ok) {
        rl_log(s->log, RL_LOG_WARN, "store_map_failed", "reason=\"%s\"",
               error != NULL ? error : "unexpected CLUSTER SLOTS reply");
        /* The next read goes to another seed. */
        rl_node_close(s->control);
        s->control = NULL;
        if (!s->mapped)
            release_waiting(s, "store unavailable: no cluster node answered");
        uv_timer_start(&s->refresh_timer, refresh_fired,
                       REFRESH_WHILE_DOWN_MS, 0);
        return;
    }
    count(&s->counters->refreshes);
    memcpy(s->slots, map, sizeof s->slots);
    /* The primaries answer the next reads. */
    rl_node_close(s->control);
    s->control = NULL;
    if (!s->mapped)
        rl_log(s->log, RL_LOG_INFO, "store_mapped", "primaries=%zu",
               s->n_nodes);
    s->mapped = true;
    close_unused(s);
    release_waiting(s, NULL);
    /* New owners connect, dead ones are replaced: look again until every
     * slot's owner answers. */
    if (!all_slots_up(s))
        uv_timer_start(&s->refresh_timer, refresh_fired,
                       REFRESH_WHILE_DOWN_MS, 0);
}

/* A node to ask for the map: a primary that is up, else the next seed. */
static rl_node *map_source(rl_store *s)
{
    for (size_t i = 0; i < s->n_nodes; i++) {
        if (rl_node_up(s->nodes[i]))
            return s->nodes[i];
    }
    if (s->control == NULL) {
        const rl_endpoint *seed =
            &s->cfg->nodes[s->next_seed++ % s->cfg->n_nodes];
        s->control = rl_node_new(s->loop, s->cfg, s->tls, seed, NULL, NULL,
                                 s->log);
    }
    return s->control;
}

static void refresh(rl_store *s)
{
    if (s->refreshing || s->closed || s->single != NULL)
        return;
    uint64_t since = now_ms(s) - s->last_refresh_ms;
    if (s->last_refresh_ms != 0 && since < REFRESH_MIN_MS) {
        if (!uv_is_active((uv_handle_t *)&s->refresh_timer))
            uv_timer_start(&s->refresh_timer, refresh_fired,
                           REFRESH_MIN_MS - since, 0);
        return;
    }
    rl_node *n = map_source(s);
    if (n == NULL) {
        uv_timer_start(&s->refresh_timer, refresh_fired,
                       REFRESH_WHILE_DOWN_MS, 0);
        return;
    }
    s->refreshing = true;
    s->last_refresh_ms = now_ms(s);
    static const char *const argv[] = {"CLUSTER", "SLOTS"};
    static const size_t lens[] = {7, 5};
    rl_node_run(n, RL_NODE_RAW, false, 2, argv, lens, on_slots, s);
}

/* --- Calls ------------------------------------------------------------ */

static void retry_later(route *r)
{
    rl_store *s = r->store;
    r->retry_at_ms = now_ms(s) + ((uint64_t)RETRY_FIRST_MS << r->retries);
    r->retries++;
    r->next = s->retrying;
    s->retrying = r;
    count(&s->counters->retried);
    if (!uv_is_active((uv_handle_t *)&s->retry_timer))
        uv_timer_start(&s->retry_timer, retry_due, RETRY_TICK_MS, 0);
}

static void retry_due(uv_timer_t *t)
{
    rl_store *s = t->data;
    route *r = s->retrying, *keep = NULL;
    s->retrying = NULL;
    uint64_t now = now_ms(s);
    while (r != NULL) {
        route *next = r->next;
        if (r->retry_at_ms <= now) {
            dispatch(r);
        } else {
            r->next = keep;
            keep = r;
        }
        r = next;
    }
    /* Routes added by the dispatches above join the ones kept. */
    while (keep != NULL) {
        route *next = keep->next;
        keep->next = s->retrying;
        s->retrying = keep;
        keep = next;
    }
    if (s->retrying != NULL)
        uv_timer_start(t, retry_due, RETRY_TICK_MS, 0);
}

/* "MOVED 3999 127.0.0.1:6381" and "ASK 3999 127.0.0.1:6381". */
static rl_node *redirect_target(rl_store *s, const char *error,
                                const char *kind, uint16_t *slot)
{
    size_t klen = strlen(kind);
    if (strncmp(error, kind, klen) != 0 || error[klen] != ' ')
        return NULL;
    char where[300];
    unsigned n;
    rl_endpoint ep;
    if (sscanf(error + klen, " %u %299s", &n, where) != 2
        || n >= RL_CLUSTER_SLOTS || !parse_host_port(where, &ep))
        return NULL;
    *slot = (uint16_t)n;
    return node_at(s, &ep);
}

static bool starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void on_reply(void *arg, const redisReply *reply, const char *error)
{
    route *r = arg;
    rl_store *s = r->store;
    if (reply != NULL) {
        r->fn(r->arg, reply, NULL);
        free(r);
        return;
    }
    if (s->closed || s->single != NULL) {
        fail(r, error);
        return;
    }
    uint16_t slot;
    rl_node *to;
    if ((to = redirect_target(s, error, "MOVED", &slot)) != NULL
        && r->redirects < REDIRECTS_MAX) {
        count(&s->counters->moved);
        s->slots[slot] = to;
        r->redirects++;
        refresh(s);
        dispatch(r);
    } else if ((to = redirect_target(s, error, "ASK", &slot)) != NULL
               && r->redirects < REDIRECTS_MAX) {
        count(&s->counters->asked);
        r->redirects++;
        r->ask_node = to;
        dispatch(r);
    } else if ((starts_with(error, "TRYAGAIN")
                || starts_with(error, "CLUSTERDOWN"))
               && now_ms(s) - r->started_ms < s->cfg->timeout_ms) {
        retry_later(r);
    } else {
        /* A node gone (failover?), or a reply that ends the call. */
        if (starts_with(error, "store ") || starts_with(error, "CLUSTERDOWN"))
            refresh(s);
        fail(r, error);
    }
}

static void dispatch(route *r)
{
    rl_store *s = r->store;
    rl_node *n = r->ask_node != NULL ? r->ask_node
                 : s->single != NULL ? s->single
                                     : s->slots[r->slot];
    bool asking = r->ask_node != NULL;
    r->ask_node = NULL;
    if (n == NULL && !s->mapped && s->n_waiting < WAITING_MAX) {
        /* The map is being read: go once it is. */
        r->next = NULL;
        *s->waiting_tail = r;
        s->waiting_tail = &r->next;
        s->n_waiting++;
        refresh(s);
        return;
    }
    if (n == NULL) {
        refresh(s);
        fail(r, "store unavailable: no node serves this slot");
        return;
    }
    rl_node_run(n, r->script, asking, r->argc, r->argv, r->lens, on_reply,
                r);
}

/* One allocation holds the route and copies of its arguments, kept for
 * sending again after a redirection. */
static route *new_route(int argc, const char *const *argv,
                        const size_t *lens)
{
    size_t bytes = 0;
    for (int i = 0; i < argc; i++)
        bytes += lens[i] + 1;
    route *r = malloc(sizeof *r + (size_t)argc * (sizeof(char *)
                                                  + sizeof(size_t))
                      + bytes);
    if (r == NULL)
        return NULL;
    r->argv = (const char **)r->data;
    r->lens = (size_t *)(r->data + (size_t)argc * sizeof(char *));
    char *p = (char *)(r->lens + argc);
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], lens[i]);
        p[lens[i]] = '\0';
        r->argv[i] = p;
        r->lens[i] = lens[i];
        p += lens[i] + 1;
    }
    r->argc = argc;
    return r;
}

void rl_store_run(rl_store *s, int script, int argc, const char *const *argv,
                  const size_t *lens, rl_store_fn fn, void *arg)
{
    if (s->closed) {
        fn(arg, NULL, "shutting down");
        return;
    }
    /* One server never redirects: the node's own copy of the call is all
     * it needs, with no route to allocate, copy and hash a slot for (a
     * profile of the agent at 64 in flight). */
    if (s->single != NULL) {
        rl_node_run(s->single, script, false, argc, argv, lens, fn, arg);
        return;
    }
    route *r = new_route(argc, argv, lens);
    if (r == NULL) {
        fn(arg, NULL, "out of memory");
        return;
    }
    *r = (route){.store = s, .script = script, .argc = argc, .fn = fn,
                 .arg = arg, .started_ms = now_ms(s), .argv = r->argv,
                 .lens = r->lens};
    /* A script's argv[0] is numkeys, a command's the command; the first
     * key decides the slot. */
    if (argc > 1 && (script < 0 || strtol(argv[0], NULL, 10) > 0))
        r->slot = rl_key_slot(argv[1], lens[1]);
    dispatch(r);
}

/* --- The store -------------------------------------------------------- */

bool rl_store_is_cluster(const rl_store *s)
{
    return s->single == NULL;
}

bool rl_store_up(const rl_store *s)
{
    return s->single != NULL ? rl_node_up(s->single) : all_slots_up(s);
}

uint64_t rl_store_now_ms(const rl_store *s)
{
    if (s->single != NULL)
        return rl_node_now_ms(s->single);
    for (size_t i = 0; i < s->n_nodes; i++) {
        uint64_t ms = rl_node_now_ms(s->nodes[i]);
        if (ms != 0)
            return ms;
    }
    return s->control != NULL ? rl_node_now_ms(s->control) : 0;
}

static void next_turn(uv_prepare_t *p)
{
    rl_store *s = p->data;
    s->counters->batches.turn++;
}

rl_store *rl_store_new(uv_loop_t *loop, const rl_store_config *cfg,
                       rl_redis_tls *tls, const rl_script_set *scripts,
                       rl_store_counters *counters, const rl_logger *log)
{
    rl_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    *s = (rl_store){.loop = loop, .cfg = cfg, .tls = tls, .scripts = scripts,
                    .log = log, .counters = counters};
    if (s->counters == NULL) {
        s->counters = &s->own_counters;
        rl_node_batches_init(&s->own_counters.batches);
    }
    s->waiting_tail = &s->waiting;
    uv_prepare_init(loop, &s->turn);
    uv_timer_init(loop, &s->refresh_timer);
    uv_timer_init(loop, &s->retry_timer);
    s->turn.data = s->refresh_timer.data = s->retry_timer.data = s;
    s->open_handles = 3;
    uv_prepare_start(&s->turn, next_turn);
    uv_unref((uv_handle_t *)&s->turn);
    if (!cfg->cluster) {
        s->single = rl_node_new(loop, cfg, tls, &cfg->nodes[0], scripts,
                                &s->counters->batches, log);
        if (s->single == NULL) {
            rl_store_close(s);
            return NULL;
        }
        return s;
    }
    refresh(s);
    return s;
}

static void handle_closed(uv_handle_t *h)
{
    rl_store *s = h->data;
    if (--s->open_handles > 0)
        return;
    if (s->counters == &s->own_counters)
        rl_node_batches_fini(&s->own_counters.batches);
    free(s);
}

void rl_store_close(rl_store *s)
{
    if (s == NULL || s->closed)
        return;
    s->closed = true;
    rl_node_close(s->single);
    rl_node_close(s->control);
    for (size_t i = 0; i < s->n_nodes; i++)
        rl_node_close(s->nodes[i]);
    release_waiting(s, "shutting down");
    route *r = s->retrying;
    s->retrying = NULL;
    while (r != NULL) {
        route *next = r->next;
        fail(r, "shutting down");
        r = next;
    }
    uv_close((uv_handle_t *)&s->turn, handle_closed);
    uv_close((uv_handle_t *)&s->refresh_timer, handle_closed);
    uv_close((uv_handle_t *)&s->retry_timer, handle_closed);
}
