/*
 * local.c: the in-process token bucket of `mode: local` rules. The same
 * arithmetic as the Redis script, in whole numbers: a bucket holds
 * level / period_ms tokens, refills limit units per elapsed millisecond and
 * holds at most burst * period_ms units (below 2^53, checked by the
 * config), so "100 a minute" is exact and nothing is lost to rounding.
 *
 * A bucket belongs to its rule's identity (it survives a reload that keeps
 * the rule) and keeps the rate it was last spent at (an override's, or the
 * rule's own; a sweep judges it by that, with no config at hand): a
 * request at another rate (another override matched, or a reload changed
 * the limit) moves it to the new rate at once, keeping its time to full;
 * a full bucket is one full at its own rate.
 *
 * A fixed window (algorithm: fixed_window) is an entry that counts hits in
 * its window of the wall clock, as the store's does (window.h), and starts
 * again at the next; it is spent once its window has ended.
 *
 * Memory: a bucket that has refilled to full says nothing a new one would
 * not, nor does a window that has ended; such entries are dropped when
 * their shard grows, and when the key cap is reached, before a new key is
 * refused.
 */
#include "local.h"

#include "keys.h"
#include "window.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct rl_local_entry {
    rl_local_entry *next;
    const void *key;  /* its identity (or rule, without one) */
    rl_ident *ident;
    rl_limit rate;    /* the rate it was last spent at */
    uint64_t hash;
    uint64_t level;   /* tokens x rate.period_ms; a window: its count */
    /* Units owed past empty (a hold's excess, rl_local_settle): the
     * refill pays them before the level rises; level is 0 meanwhile. */
    uint64_t debt;
    uint64_t at_ms;   /* when level was right; a window: its number */
    bool window;
    uint16_t value_len;
    char value[];
};

#define INITIAL_HEADS 16

static void free_entry(rl_local_entry *e)
{
    if (e->ident != NULL)
        rl_ident_unref(e->ident);
    free(e);
}

void rl_local_init(rl_local *l, size_t max_keys)
{
    memset(l, 0, sizeof *l);
    l->max_keys = max_keys;
    for (int i = 0; i < RL_LOCAL_SHARDS; i++)
        pthread_mutex_init(&l->shards[i].lock, NULL);
}

void rl_local_fini(rl_local *l)
{
    for (int i = 0; i < RL_LOCAL_SHARDS; i++) {
        rl_local_shard *sh = &l->shards[i];
        for (size_t h = 0; h < sh->n_heads; h++) {
            rl_local_entry *e = sh->heads[h];
            while (e != NULL) {
                rl_local_entry *next = e->next;
                free_entry(e);
                e = next;
            }
        }
        free(sh->heads);
        pthread_mutex_destroy(&sh->lock);
    }
}

static uint64_t capacity(const rl_limit *r)
{
    return r->burst * r->period_ms;
}

/* A bucket in debt: the refill since at_ms pays the debt first, and
 * at_ms moves to when it did (or to now). */
static void pay_debt(rl_local_entry *e, uint64_t now_ms)
{
    if (e->debt == 0 || now_ms <= e->at_ms)
        return;
    uint64_t elapsed = now_ms - e->at_ms;
    uint64_t paid_in = (e->debt + e->rate.limit - 1) / e->rate.limit;
    if (elapsed < paid_in) {
        e->debt -= elapsed * e->rate.limit;
        e->at_ms = now_ms;
        return;
    }
    /* The last ms refilled a little more than the debt. */
    e->level = paid_in * e->rate.limit - e->debt;
    e->debt = 0;
    e->at_ms += paid_in;
}

/* The level now: what it was plus what flowed in since, up to capacity. */
static uint64_t refilled(const rl_local_entry *e, uint64_t now_ms)
{
    uint64_t cap = capacity(&e->rate);
    uint64_t elapsed = now_ms > e->at_ms ? now_ms - e->at_ms : 0;
    uint64_t room = cap - e->level;
    if (elapsed >= (room + e->rate.limit - 1) / e->rate.limit)
        return cap;
    return e->level + elapsed * e->rate.limit;
}

static bool is_full(const rl_local_entry *e, uint64_t now_ms)
{
    if (e->window)
        return e->at_ms
               < rl_window_of(rl_window_wall_ms(), e->rate.period_ms);
    return e->debt == 0 && refilled(e, now_ms) == capacity(&e->rate);
}

/* Drops the shard's full buckets; returns how many. */
static size_t sweep(rl_local *l, rl_local_shard *sh, uint64_t now_ms)
{
    size_t dropped = 0;
    for (size_t h = 0; h < sh->n_heads; h++) {
        rl_local_entry **p = &sh->heads[h];
        while (*p != NULL) {
            rl_local_entry *e = *p;
            if (is_full(e, now_ms)) {
                *p = e->next;
                free_entry(e);
                dropped++;
            } else {
                p = &e->next;
            }
        }
    }
    sh->n_entries -= dropped;
    atomic_fetch_sub(&l->n_entries, dropped);
    return dropped;
}

/* Doubles the heads when the chains grow past two entries on average;
 * full buckets are dropped first, and growing stops if that was enough. */
static void grow(rl_local *l, rl_local_shard *sh, uint64_t now_ms)
{
    if (sh->n_entries < 2 * sh->n_heads)
        return;
    sweep(l, sh, now_ms);
    if (sh->n_entries < sh->n_heads)
        return;
    size_t n = sh->n_heads * 2;
    rl_local_entry **heads = calloc(n, sizeof *heads);
    if (heads == NULL)
        return; /* longer chains, still correct */
    for (size_t h = 0; h < sh->n_heads; h++) {
        rl_local_entry *e = sh->heads[h];
        while (e != NULL) {
            rl_local_entry *next = e->next;
            size_t at = (e->hash / RL_LOCAL_SHARDS) & (n - 1);
            e->next = heads[at];
            heads[at] = e;
            e = next;
        }
    }
    free(sh->heads);
    sh->heads = heads;
    sh->n_heads = n;
}

static rl_local_entry *find(rl_local_shard *sh, const void *key,
                            uint64_t hash, const char *value, size_t len)
{
    if (sh->n_heads == 0)
        return NULL;
    rl_local_entry *e = sh->heads[(hash / RL_LOCAL_SHARDS)
                                  & (sh->n_heads - 1)];
    for (; e != NULL; e = e->next) {
        if (e->hash == hash && e->key == key && e->value_len == len
            && rl_key_equal(e->value, value, len))
            return e;
    }
    return NULL;
}

/* A new, full bucket; NULL when the cap holds or memory is out. */
static rl_local_entry *insert(rl_local *l, rl_local_shard *sh,
                              const rl_rule *rule, rl_ident *id,
                              const rl_limit *rate, uint64_t hash,
                              const char *value, size_t len, uint64_t now_ms)
{
    if (atomic_load(&l->n_entries) >= l->max_keys
        && sweep(l, sh, now_ms) == 0)
        return NULL;
    if (sh->n_heads == 0) {
        sh->heads = calloc(INITIAL_HEADS, sizeof *sh->heads);
        if (sh->heads == NULL)
            return NULL;
        sh->n_heads = INITIAL_HEADS;
    }
    grow(l, sh, now_ms);
    rl_local_entry *e = malloc(sizeof *e + len);
    if (e == NULL)
        return NULL;
    *e = (rl_local_entry){.key = id != NULL ? (const void *)id
                                            : (const void *)rule,
                          .ident = id, .rate = *rate, .hash = hash,
                          .at_ms = now_ms,
                          .value_len = (uint16_t)len};
    e->level = capacity(&e->rate);
    e->window = rule->algorithm == RL_ALGO_FIXED_WINDOW;
    if (e->window) {
        e->level = 0;
        e->at_ms = rl_window_of(rl_window_wall_ms(), rate->period_ms);
    }
    if (id != NULL)
        rl_ident_ref(id);
    memcpy(e->value, value, len);
    size_t at = (hash / RL_LOCAL_SHARDS) & (sh->n_heads - 1);
    e->next = sh->heads[at];
    sh->heads[at] = e;
    sh->n_entries++;
    atomic_fetch_add(&l->n_entries, 1);
    return e;
}

/* The bucket moves to another rate keeping its time to full, as the Redis
 * script does (it keeps the bucket as that time): an empty bucket stays
 * empty and refills at the new rate, a half-full one is half full when
 * burst follows limit. A new limit applies at once, to the same bucket. */
static void retune(rl_local_entry *e, const rl_limit *rate)
{
    uint64_t missing = capacity(&e->rate) - e->level;
    unsigned __int128 scaled = (unsigned __int128)missing * rate->limit
                               / e->rate.limit;
    uint64_t cap = capacity(rate);
    e->level = scaled >= cap ? 0 : cap - (uint64_t)scaled;
    e->rate = *rate;
}

/* Brings the bucket to now_ms, at rate. */
static void refill(rl_local_entry *e, const rl_limit *rate, uint64_t now_ms)
{
    const rl_limit *r = &e->rate;
    pay_debt(e, now_ms);
    e->level = refilled(e, now_ms);
    e->at_ms = now_ms > e->at_ms ? now_ms : e->at_ms;
    if (r->limit != rate->limit || r->period_ms != rate->period_ms
        || r->burst != rate->burst)
        retune(e, rate);
}

/* Spends from one bucket, as the Redis script does. */
static void spend(rl_local_entry *e, const rl_limit *rate, uint32_t cost,
                  uint64_t now_ms, rl_bucket_reply *out)
{
    const rl_limit *r = &e->rate;
    refill(e, rate, now_ms);
    bool allowed = cost <= r->burst && e->debt == 0
                   && e->level >= (uint64_t)cost * r->period_ms;
    if (allowed)
        e->level -= (uint64_t)cost * r->period_ms;
    rl_bucket_answer(r, capacity(&e->rate) - e->level + e->debt, allowed,
                     cost, out);
}

/* Counts cost hits in the window, as the store's does: a refused one
 * too. A new period starts a new window; a new limit keeps the count. */
static void count_hit(rl_local_entry *e, const rl_limit *rate, uint32_t cost,
                      rl_bucket_reply *out)
{
    uint64_t now = rl_window_wall_ms();
    uint64_t window = rl_window_of(now, rate->period_ms);
    if (e->at_ms != window || e->rate.period_ms != rate->period_ms)
        e->level = 0;
    e->at_ms = window;
    e->rate = *rate;
    e->level += cost;
    rl_window_answer(rate, e->level, cost, window, now, out);
}

/* rl_local_check_at for a value whose rl_key_hash_value is value_hash. */
static void check_at(rl_local *l, const rl_rule *rule, rl_ident *id,
                     const rl_limit *rate, const char *value,
                     size_t value_len, uint64_t value_hash, uint32_t cost,
                     uint64_t now_ms, rl_bucket_reply *out, bool *degraded)
{
    /* No identity (unit tests): the rule itself is the key. */
    const void *key = id != NULL ? (const void *)id : (const void *)rule;
    uint64_t hash = rl_key_hash_salt(value_hash, (uintptr_t)key);
    rl_local_shard *sh = &l->shards[hash % RL_LOCAL_SHARDS];
    pthread_mutex_lock(&sh->lock);
    rl_local_entry *e = find(sh, key, hash, value, value_len);
    if (e == NULL)
        e = insert(l, sh, rule, id, rate, hash, value, value_len, now_ms);
    *degraded = e == NULL;
    if (e != NULL && e->window)
        count_hit(e, rate, cost, out);
    else if (e != NULL)
        spend(e, rate, cost, now_ms, out);
    pthread_mutex_unlock(&sh->lock);
    if (e == NULL) {
        atomic_fetch_add(&l->keys_refused, 1);
        *out = (rl_bucket_reply){0};
    }
}

static uint64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A hold's difference: tokens taken past empty go into debt; given
 * back, never above capacity. A window's count takes it in the window the
 * hold charged, never below 0 (a window since ended keeps nothing). */
static void settle(rl_local_entry *e, const rl_limit *rate, int64_t delta,
                   uint64_t window, uint64_t now_ms)
{
    if (e->window) {
        if (e->at_ms != window)
            return;
        e->level = delta < 0 && (uint64_t)-delta > e->level
                       ? 0
                       : e->level + (uint64_t)delta;
        return;
    }
    refill(e, rate, now_ms);
    uint64_t units = (delta < 0 ? (uint64_t)-delta : (uint64_t)delta)
                     * rate->period_ms;
    if (delta > 0) {
        uint64_t from_level = units < e->level ? units : e->level;
        e->level -= from_level;
        e->debt += units - from_level;
        return;
    }
    uint64_t to_debt = units < e->debt ? units : e->debt;
    e->debt -= to_debt;
    uint64_t room = capacity(rate) - e->level;
    e->level += units - to_debt < room ? units - to_debt : room;
}

void rl_local_settle(rl_local *l, const rl_rule *rule, rl_ident *id,
                     const rl_limit *rate, const char *value,
                     size_t value_len, int64_t delta, uint64_t window)
{
    const void *key = id != NULL ? (const void *)id : (const void *)rule;
    uint64_t hash = rl_key_hash_salt(rl_key_hash_value(value, value_len),
                                     (uintptr_t)key);
    uint64_t now_ms = monotonic_ms();
    rl_local_shard *sh = &l->shards[hash % RL_LOCAL_SHARDS];
    pthread_mutex_lock(&sh->lock);
    rl_local_entry *e = find(sh, key, hash, value, value_len);
    /* Swept meanwhile: it was full (or its window over), and only an
     * excess changes that. */
    if (e == NULL && delta > 0)
        e = insert(l, sh, rule, id, rate, hash, value, value_len, now_ms);
    if (e != NULL)
        settle(e, rate, delta, window, now_ms);
    pthread_mutex_unlock(&sh->lock);
}

void rl_local_check_at(rl_local *l, const rl_rule *rule, rl_ident *id,
                       const rl_limit *rate, const char *value,
                       size_t value_len, uint32_t cost, uint64_t now_ms,
                       rl_bucket_reply *out, bool *degraded)
{
    check_at(l, rule, id, rate, value, value_len,
             rl_key_hash_value(value, value_len), cost, now_ms, out,
             degraded);
}

void rl_local_check(rl_local *l, const rl_rule *rule, rl_ident *id,
                    const rl_limit *rate,
                    const char *value, size_t value_len, uint32_t cost,
                    rl_bucket_reply *out, bool *degraded)
{
    check_at(l, rule, id, rate, value, value_len,
             rl_key_hash_value(value, value_len), cost, monotonic_ms(), out,
             degraded);
}

void rl_local_check_hashed(rl_local *l, const rl_rule *rule, rl_ident *id,
                           const rl_limit *rate, const char *value,
                           size_t value_len, uint64_t value_hash,
                           uint32_t cost, rl_bucket_reply *out,
                           bool *degraded)
{
    check_at(l, rule, id, rate, value, value_len, value_hash, cost,
             monotonic_ms(), out, degraded);
}
