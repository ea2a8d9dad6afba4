/*
 * rlctl_view.c: see rlctl_view.h. The arithmetic is the bucket script's
 * (see agent/scripts.c): a bucket holds level / period_ms tokens and its
 * key's expiry is the time until it is full again; a missing key is a full
 * bucket. A synced rule's estimate is the agent's (wire.h): the counts of
 * the sub-windows of the trailing period, the oldest counted whole. A
 * fixed window's is the count of the window that holds now. An in_flight
 * rule's slots are its hash's fields, one per agent, "COUNT EXPIRY" by
 * Redis's clock (agent/scripts.c): a field past its expiry holds none.
 */
#include "rlctl_view.h"

#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

static int store_error(rlctl_conn *c, redisReply *r, const char *command,
                       char *err, size_t errlen)
{
    rlctl_store_why(c, r, command, err, errlen);
    freeReplyObject(r);
    return -1;
}

/* GET and PTTL of one key. */
static int read_key(rlctl_store *s, const char *key, char *value,
                    size_t cap, long long *ttl, bool *exists, char *err,
                    size_t errlen)
{
    rlctl_conn *c = rlctl_store_for_key(s, key, strlen(key));
    redisReply *r = rlctl_command(c, "GET", key, NULL);
    if (r == NULL || (r->type != REDIS_REPLY_STRING
                      && r->type != REDIS_REPLY_NIL))
        return store_error(c, r, "GET", err, errlen);
    *exists = r->type == REDIS_REPLY_STRING;
    snprintf(value, cap, "%s", *exists ? r->str : "");
    freeReplyObject(r);
    r = rlctl_command(c, "PTTL", key, NULL);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER)
        return store_error(c, r, "PTTL", err, errlen);
    *ttl = r->integer;
    freeReplyObject(r);
    return 0;
}

/* The level now, in 1/period_ms tokens: the bucket is ttl x limit units
 * short of full, less the remainder its value holds when the interval is
 * not a whole number of ms. */
static uint64_t level_now(const rl_rule *r, const char *state,
                          long long ttl)
{
    uint64_t cap = r->burst * r->period_ms;
    if (ttl <= 0)
        return cap; /* no key, or a key without an expiry: full */
    uint64_t d = (uint64_t)ttl * r->limit;
    if (r->period_ms % r->limit != 0) {
        char *end;
        uint64_t rem = strtoull(state, &end, 10);
        if (end != state && *end == '\0' && rem < r->limit && rem <= d)
            d -= rem;
    }
    return d < cap ? cap - d : 0;
}

/* HGETALL of the view's key, which it says exists when it has fields: the
 * reply (the caller frees it), or NULL with a message. */
static redisReply *read_hash(rlctl_store *s, rlctl_view *v, char *err,
                             size_t errlen)
{
    rlctl_conn *c = rlctl_store_for_key(s, v->key, strlen(v->key));
    redisReply *h = rlctl_command(c, "HGETALL", v->key, NULL);
    if (h == NULL || h->type != REDIS_REPLY_ARRAY) {
        store_error(c, h, "HGETALL", err, errlen);
        return NULL;
    }
    v->exists = h->elements > 0;
    return h;
}

/* PTTL of the view's key. */
static int read_ttl(rlctl_store *s, rlctl_view *v, char *err, size_t errlen)
{
    rlctl_conn *c = rlctl_store_for_key(s, v->key, strlen(v->key));
    redisReply *t = rlctl_command(c, "PTTL", v->key, NULL);
    if (t == NULL || t->type != REDIS_REPLY_INTEGER)
        return store_error(c, t, "PTTL", err, errlen);
    v->ttl_ms = t->integer;
    freeReplyObject(t);
    return 0;
}

static void window_key(const rlctl_store *s, const rl_rule *rule,
                       const char *value, char *out, size_t cap)
{
    if (s->cfg->cluster)
        snprintf(out, cap, "{%s%s}:w", rule->key_prefix, value);
    else
        snprintf(out, cap, "%s%s:w", rule->key_prefix, value);
}

/* A synced client's hash of sub-windows: recent, w-N+1..w, and oldest,
 * w-N, as agents read them (wire.h). */
static int read_synced(rlctl_store *s, const char *value,
                       unsigned long long now, rlctl_view *v, char *err,
                       size_t errlen)
{
    const rl_rule *r = v->rule;
    uint64_t g = rl_wire_subwindow_ms(r->period_ms);
    v->window = now / g;
    window_key(s, r, value, v->key, sizeof v->key);
    redisReply *h = read_hash(s, v, err, errlen);
    if (h == NULL)
        return -1;
    for (size_t f = 0; f + 1 < h->elements; f += 2) {
        char *end;
        uint64_t w = strtoull(h->element[f]->str, &end, 10);
        uint64_t n = strtoull(h->element[f + 1]->str, NULL, 10);
        if (*end != '\0' || end == h->element[f]->str)
            continue; /* the head and sums kept beside (m, windows.c) */
        if (w == v->window)
            snprintf(v->state, sizeof v->state, "%llu",
                     (unsigned long long)n);
        if (w > v->window || w + RL_WIRE_SUBWINDOWS < v->window)
            continue;
        *(w + RL_WIRE_SUBWINDOWS == v->window ? &v->previous
                                              : &v->current) += n;
    }
    freeReplyObject(h);
    if (read_ttl(s, v, err, errlen) != 0)
        return -1;
    /* The oldest leaves the span when the next sub-window starts. */
    v->full_in_ms = g - now % g;
    v->estimate = v->current + v->previous;
    return 0;
}

/* A fixed window's count: the key of the window that holds now (the
 * agents' key and ':' and its number, window.h), the limit less it left. */
static int read_window(rlctl_store *s, unsigned long long now,
                       rlctl_view *v, char *err, size_t errlen)
{
    const rl_rule *r = v->rule;
    v->window = now / r->period_ms;
    size_t len = strlen(v->key);
    snprintf(v->key + len, sizeof v->key - len, ":%llu",
             (unsigned long long)v->window);
    if (read_key(s, v->key, v->state, sizeof v->state, &v->ttl_ms,
                 &v->exists, err, errlen) != 0)
        return -1;
    v->current = strtoull(v->state, NULL, 10);
    v->tokens = r->limit > v->current ? r->limit - v->current : 0;
    v->full_in_ms = r->period_ms - now % r->period_ms;
    return 0;
}

/* An in_flight key's hash: each agent's field, and the slots of the live
 * ones summed. */
static int read_slots(rlctl_store *s, unsigned long long now, rlctl_view *v,
                      char *err, size_t errlen)
{
    redisReply *h = read_hash(s, v, err, errlen);
    if (h == NULL)
        return -1;
    for (size_t f = 0; f + 1 < h->elements; f += 2) {
        unsigned long long slots, expiry;
        if (sscanf(h->element[f + 1]->str, "%llu %llu", &slots, &expiry)
            != 2)
            continue;
        long long left = (long long)expiry - (long long)now;
        if (left > 0)
            v->held += slots;
        if (v->n_agents++ >= RLCTL_HOLDERS_MAX)
            continue;
        rlctl_holder *o = &v->holders[v->n_holders++];
        snprintf(o->agent, sizeof o->agent, "%s", h->element[f]->str);
        o->slots = slots;
        o->expires_in_ms = left;
    }
    freeReplyObject(h);
    if (read_ttl(s, v, err, errlen) != 0)
        return -1;
    v->tokens = v->rule->limit > v->held ? v->rule->limit - v->held : 0;
    return 0;
}

int rlctl_view_read(rlctl_store *s, const rl_rule *rule, const char *tag,
                    const char *value, unsigned long long now_ms,
                    rlctl_view *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->rule = rule;
    if (rule->mode == RL_MODE_LOCAL) {
        snprintf(err, errlen, "rule \"%s\" is local: its buckets live in "
                 "each gateway's memory, not in the store", rule->name);
        return -1;
    }
    if (rule->mode == RL_MODE_SYNCED)
        return read_synced(s, value, now_ms, out, err, errlen);
    if (rl_key_build_tagged(rule->key_prefix, tag,
                            tag != NULL ? strlen(tag) : 0, value,
                            strlen(value), out->key, sizeof out->key, NULL)
        != RL_OK) {
        snprintf(err, errlen, "rule \"%s\": the hash_tag value '%s' or the "
                 "value '%s' cannot make a key (empty, a NUL, or over %d "
                 "bytes)", rule->name, tag != NULL ? tag : "", value,
                 RL_VALUE_MAX);
        return -1;
    }
    if (rule->algorithm == RL_ALGO_FIXED_WINDOW)
        return read_window(s, now_ms, out, err, errlen);
    if (rule->mode == RL_MODE_IN_FLIGHT)
        return read_slots(s, now_ms, out, err, errlen);
    if (read_key(s, out->key, out->state, sizeof out->state, &out->ttl_ms,
                 &out->exists, err, errlen) != 0)
        return -1;
    uint64_t cap = rule->burst * rule->period_ms;
    out->level = level_now(rule, out->state, out->ttl_ms);
    out->tokens = out->level / rule->period_ms;
    out->full_in_ms = ceil_div(cap - out->level, rule->limit);
    return 0;
}

bool rlctl_view_allows(const rlctl_view *v, uint32_t cost, long long *retry)
{
    const rl_rule *r = v->rule;
    *retry = 0;
    if (r->mode == RL_MODE_SYNCED) {
        if (v->estimate + cost <= r->limit)
            return true;
        /* Room comes back as the window slides on. */
        *retry = cost > r->limit ? -1 : (long long)v->full_in_ms;
        return false;
    }
    if (r->mode == RL_MODE_IN_FLIGHT) {
        if (v->held + 1 <= r->limit)
            return true;
        *retry = RL_IN_FLIGHT_RETRY_MS;
        return false;
    }
    if (r->algorithm == RL_ALGO_FIXED_WINDOW) {
        if (v->current + cost <= r->limit)
            return true;
        /* Room comes back when the window ends. */
        *retry = cost > r->limit ? -1 : (long long)v->full_in_ms;
        return false;
    }
    uint64_t need = (uint64_t)cost * r->period_ms;
    if (cost > r->burst) {
        *retry = -1;
        return false;
    }
    if (v->level >= need)
        return true;
    *retry = (long long)ceil_div(need - v->level, r->limit);
    return false;
}

long long rlctl_view_forget(rlctl_store *s, const rlctl_view *v, char *err,
                            size_t errlen)
{
    long long removed = 0;
    for (size_t i = 0; i < 1; i++) {
        const char *key = v->key;
        rlctl_conn *c = rlctl_store_for_key(s, key, strlen(key));
        redisReply *r = rlctl_command(c, "DEL", key, NULL);
        if (r == NULL || r->type != REDIS_REPLY_INTEGER)
            return store_error(c, r, "DEL", err, errlen);
        removed += r->integer;
        freeReplyObject(r);
    }
    return removed;
}
