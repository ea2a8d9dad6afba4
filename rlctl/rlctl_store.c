/*
 * rlctl_store.c: see rlctl_store.h. rlctl runs one command and exits, so
 * blocking connections are enough (rlctl_conn.c); a cluster's map is read
 * once.
 */
#include "rlctl_store.h"

#include "keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* AUTH as username (NULL: the default user) when there is a password;
 * NULL when there is none to give. */
static redisReply *authenticate(rlctl_conn *c, const char *username,
                                const char *password)
{
    if (password == NULL)
        return NULL;
    return username != NULL ? rlctl_command(c, "AUTH", username, password,
                                            NULL)
                            : rlctl_command(c, "AUTH", password, NULL);
}

static rlctl_conn *connect_node(const rlctl_store *s,
                                const rl_endpoint *ep, char *err,
                                size_t errlen)
{
    const rl_store_config *cfg = s->cfg;
    unsigned timeout_ms = cfg->timeout_ms < 2000 ? 2000 : cfg->timeout_ms;
    char why[300];
    rlctl_conn *c = rlctl_conn_open(ep, s->tls, timeout_ms, why, sizeof why);
    if (c == NULL) {
        snprintf(err, errlen, "cannot reach Redis at %s:%u: %s (is it "
                 "running, and is store in the config right?)", ep->host,
                 ep->port, why);
        return NULL;
    }
    redisReply *r = authenticate(c, cfg->username, cfg->password);
    if ((r == NULL || r->type != REDIS_REPLY_ERROR) && cfg->db != 0) {
        freeReplyObject(r);
        char db[16];
        snprintf(db, sizeof db, "%u", cfg->db);
        r = rlctl_command(c, "SELECT", db, NULL);
    }
    if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        /* The reply names no secret: Redis says WRONGPASS or NOAUTH. */
        snprintf(err, errlen, "Redis at %s:%u refused rlctl: %s (check "
                 "store.username, store.password and store.url's db)",
                 ep->host, ep->port, r->str);
        freeReplyObject(r);
        rlctl_conn_close(c);
        return NULL;
    }
    freeReplyObject(r);
    return c;
}

static int add_primary(rlctl_store *s, const rl_endpoint *ep, char *err,
                       size_t errlen)
{
    for (int i = 0; i < s->n; i++) {
        if (s->endpoints[i].port == ep->port
            && strcmp(s->endpoints[i].host, ep->host) == 0)
            return i;
    }
    if (s->n == RLCTL_PRIMARIES_MAX) {
        snprintf(err, errlen, "more than %d primaries", RLCTL_PRIMARIES_MAX);
        return -1;
    }
    rlctl_conn *c = connect_node(s, ep, err, errlen);
    if (c == NULL)
        return -1;
    s->primaries[s->n] = c;
    s->endpoints[s->n] = *ep;
    return s->n++;
}

/* CLUSTER SLOTS: [start, end, [host, port, id], replicas...]... */
static int read_map(rlctl_store *s, rlctl_conn *seed,
                    const rl_endpoint *asked, char *err, size_t errlen)
{
    redisReply *r = rlctl_command(seed, "CLUSTER", "SLOTS", NULL);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        snprintf(err, errlen, "%s:%u did not answer CLUSTER SLOTS (is it a "
                 "cluster node?)", asked->host, asked->port);
        freeReplyObject(r);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < r->elements && rc == 0; i++) {
        redisReply *e = r->element[i], *p = e->element[2];
        rl_endpoint ep = {.port = (uint16_t)p->element[1]->integer};
        snprintf(ep.host, sizeof ep.host, "%s",
                 p->element[0]->len > 0 ? p->element[0]->str : asked->host);
        int at = add_primary(s, &ep, err, errlen);
        if (at < 0) {
            rc = -1;
            break;
        }
        for (long long slot = e->element[0]->integer;
             slot <= e->element[1]->integer && slot < 16384; slot++)
            s->slot_owner[slot] = (unsigned char)at;
    }
    freeReplyObject(r);
    return rc;
}

/* The master's address from one sentinel (SENTINEL
 * GET-MASTER-ADDR-BY-NAME, after AUTH if the sentinels have a password);
 * -1 with why in err. */
static int ask_sentinel(const rlctl_store *s, const rl_endpoint *at,
                        rl_endpoint *primary, char *err, size_t errlen)
{
    const rl_store_config *cfg = s->cfg;
    const rl_sentinel_config *sc = &cfg->sentinel;
    char why[300];
    rlctl_conn *c = rlctl_conn_open(at, s->tls, 1000, why, sizeof why);
    if (c == NULL) {
        snprintf(err, errlen, "sentinel %s:%u: %.200s", at->host, at->port,
                 why);
        return -1;
    }
    redisReply *r = authenticate(c, sc->username, sc->password);
    if (r == NULL || r->type != REDIS_REPLY_ERROR) {
        freeReplyObject(r);
        r = rlctl_command(c, "SENTINEL", "get-master-addr-by-name",
                          sc->master, NULL);
    }
    int rc = -1;
    char text[RL_HOST_MAX + 16];
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2
        && r->element[0]->type == REDIS_REPLY_STRING
        && r->element[1]->type == REDIS_REPLY_STRING) {
        snprintf(text, sizeof text,
                 strchr(r->element[0]->str, ':') ? "[%s]:%s" : "%s:%s",
                 r->element[0]->str, r->element[1]->str);
        rc = rl_endpoint_parse(text, primary) == RL_OK ? 0 : -1;
    }
    if (rc != 0) {
        if (r != NULL && r->type == REDIS_REPLY_NIL)
            snprintf(err, errlen, "sentinel %s:%u does not know master "
                     "'%s'", at->host, at->port, sc->master);
        else
            rlctl_store_why(c, r, "SENTINEL get-master-addr-by-name", err,
                            errlen);
    }
    freeReplyObject(r);
    rlctl_conn_close(c);
    return rc;
}

/* The primary the first sentinel that knows the master names. */
static int open_by_sentinel(rlctl_store *s, const rl_store_config *cfg,
                            char *err, size_t errlen)
{
    char why[512] = "";
    for (size_t i = 0; i < cfg->sentinel.n_addresses; i++) {
        rl_endpoint primary;
        if (ask_sentinel(s, &cfg->sentinel.addresses[i], &primary, why,
                         sizeof why) == 0)
            return add_primary(s, &primary, err, errlen) < 0 ? -1 : 0;
    }
    snprintf(err, errlen, "no sentinel named master '%s' (last: %s)",
             cfg->sentinel.master, why);
    return -1;
}

static void drop_primaries(rlctl_store *s)
{
    for (int i = 0; i < s->n; i++)
        rlctl_conn_close(s->primaries[i]);
    s->n = 0;
}

static int open_primaries(rlctl_store *s, const rl_store_config *cfg,
                          char *err, size_t errlen)
{
    if (cfg->sentinel.master != NULL)
        return open_by_sentinel(s, cfg, err, errlen);
    if (!cfg->cluster)
        return add_primary(s, &cfg->nodes[0], err, errlen) < 0 ? -1 : 0;
    for (size_t i = 0; i < cfg->n_nodes; i++) {
        rlctl_conn *seed = connect_node(s, &cfg->nodes[i], err, errlen);
        if (seed == NULL)
            continue;
        int rc = read_map(s, seed, &cfg->nodes[i], err, errlen);
        rlctl_conn_close(seed);
        if (rc == 0)
            return 0;
        drop_primaries(s);
    }
    return -1;
}

int rlctl_store_open(rlctl_store *s, const rl_store_config *cfg, char *err,
                     size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    if (cfg->tls.enabled
        && (s->tls = rl_redis_tls_new(&cfg->tls, "store.tls", err, errlen))
               == NULL)
        return -1;
    int rc = open_primaries(s, cfg, err, errlen);
    if (rc != 0)
        rlctl_store_close(s);
    return rc;
}

void rlctl_store_close(rlctl_store *s)
{
    drop_primaries(s);
    rl_redis_tls_free(s->tls);
    s->tls = NULL;
}

rlctl_conn *rlctl_store_for_key(rlctl_store *s, const char *key,
                                  size_t len)
{
    if (!s->cfg->cluster)
        return s->primaries[0];
    return s->primaries[s->slot_owner[rl_key_slot(key, len)]];
}

void rlctl_store_why(const rlctl_conn *c, const redisReply *r,
                     const char *command, char *err, size_t errlen)
{
    if (r != NULL && r->type == REDIS_REPLY_ERROR)
        snprintf(err, errlen, "Redis refused %s: %s", command, r->str);
    else if (r == NULL)
        snprintf(err, errlen, "Redis did not answer %s: %s", command,
                 rlctl_conn_error(c));
    else
        snprintf(err, errlen, "Redis answered %s unexpectedly", command);
}

unsigned long long rlctl_store_now_ms(rlctl_store *s, char *err,
                                      size_t errlen)
{
    redisReply *r = rlctl_command(s->primaries[0], "TIME", NULL);
    unsigned long long ms = 0;
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        ms = strtoull(r->element[0]->str, NULL, 10) * 1000
             + strtoull(r->element[1]->str, NULL, 10) / 1000;
    else
        rlctl_store_why(s->primaries[0], r, "TIME", err, errlen);
    freeReplyObject(r);
    return ms;
}
