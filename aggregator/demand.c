/*
 * demand.c: see demand.h. Each key keeps, per region, the requests offered
 * in each of the last SLOTS sub-windows (a ring indexed by sub-window
 * number), in a chained hash table: keys come and go with the traffic,
 * and a chain is the simplest table to forget from.
 */
#include "demand.h"

#include "config.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>

/* Two spans: parts are read in the span that ends at the others' last
 * exchanges, which trails this region's own counts by an interval and a
 * link's delay, and by up to the time a cut takes to be found while a
 * region has gone silent. With one span's slots, this region's own ring,
 * running ahead, had lost the oldest sub-windows of that span, and its
 * part shrank with every interval of the lag: a cut region kept two
 * thirds of its part (20 a period for 30). A span's worth of lag is
 * kept; past it the parts last worked out stand (rl_demand_parts). */
#define SLOTS (2 * RL_WIRE_SUBWINDOWS + 1)

typedef struct ring {
    uint64_t head;            /* the latest sub-window noted; 0: none */
    uint32_t offered[SLOTS];  /* by sub-window number mod SLOTS */
} ring;

typedef struct key {
    struct key *next;
    uint64_t hash;
    size_t len;               /* of name: "rule\0value" */
    ring *rings;              /* one per region */
    /* The regions' parts last worked out (millionths), after the rings;
     * parts_known says whether there are any. */
    uint32_t *parts;
    bool parts_known;
    char name[];
} key;

struct rl_demand {
    size_t n_regions, max_keys, n_keys, cap;
    uint64_t refused;
    key **buckets;
};

rl_demand *rl_demand_new(size_t n_regions, size_t max_keys)
{
    rl_demand *d = calloc(1, sizeof *d);
    if (d == NULL)
        return NULL;
    d->n_regions = n_regions;
    d->max_keys = max_keys;
    d->cap = 1024;
    d->buckets = calloc(d->cap, sizeof *d->buckets);
    if (d->buckets == NULL) {
        free(d);
        return NULL;
    }
    return d;
}

static void key_free(key *k)
{
    free(k->rings);
    free(k->parts);
    free(k);
}

void rl_demand_free(rl_demand *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->cap; i++) {
        for (key *k = d->buckets[i], *next; k != NULL; k = next) {
            next = k->next;
            key_free(k);
        }
    }
    free(d->buckets);
    free(d);
}

/* "rule\0value", the key's name, into buf (at least RL_NAME_MAX + 1 +
 * RL_WIRE_VALUE_MAX bytes); its length. */
static size_t name_of(char *buf, const char *rule, const char *value,
                      size_t value_len)
{
    size_t n = strlen(rule) + 1;
    memcpy(buf, rule, n);
    memcpy(buf + n, value, value_len);
    return n + value_len;
}

static uint64_t hash_of(const char *p, size_t len)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

static key **find(const rl_demand *d, const char *name, size_t len,
                  uint64_t h)
{
    key **at = &d->buckets[h & (d->cap - 1)];
    while (*at != NULL
           && !((*at)->hash == h && (*at)->len == len
                && memcmp((*at)->name, name, len) == 0))
        at = &(*at)->next;
    return at;
}

/* Doubles the buckets when the keys outnumber them; kept as they are
 * without memory (longer chains, still right). */
static void grow(rl_demand *d)
{
    size_t cap = d->cap * 2;
    key **buckets = calloc(cap, sizeof *buckets);
    if (buckets == NULL)
        return;
    for (size_t i = 0; i < d->cap; i++) {
        for (key *k = d->buckets[i], *next; k != NULL; k = next) {
            next = k->next;
            k->next = buckets[k->hash & (cap - 1)];
            buckets[k->hash & (cap - 1)] = k;
        }
    }
    free(d->buckets);
    d->buckets = buckets;
    d->cap = cap;
}

static uint32_t add_sat(uint32_t a, uint64_t b)
{
    uint64_t sum = a + b;
    return sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
}

static void ring_add(ring *r, uint64_t w, uint64_t admitted,
                     uint64_t refused)
{
    if (w > r->head) {
        uint64_t from = r->head == 0 || w - r->head >= SLOTS
                            ? (w >= SLOTS ? w - SLOTS + 1 : 0)
                            : r->head + 1;
        for (uint64_t x = from; x <= w; x++)
            r->offered[x % SLOTS] = 0;
        r->head = w;
    } else if (r->head - w >= SLOTS) {
        return; /* out of every span */
    }
    r->offered[w % SLOTS] = add_sat(r->offered[w % SLOTS],
                                    admitted + refused);
}

/* Whether the ring still holds every sub-window of the span ending at
 * at. */
static bool ring_holds_span(const ring *r, uint64_t at)
{
    return r->head <= at + (SLOTS - 1 - RL_WIRE_SUBWINDOWS);
}

/* The requests offered in the span ending at sub-window to, of those the
 * ring still holds. */
static uint64_t ring_sum(const ring *r, uint64_t to)
{
    uint64_t sum = 0;
    for (uint64_t k = 0; r->head > 0 && k < SLOTS && k <= r->head; k++) {
        uint64_t w = r->head - k;
        if (w <= to && w + RL_WIRE_SUBWINDOWS >= to)
            sum += r->offered[w % SLOTS];
    }
    return sum;
}

bool rl_demand_note(rl_demand *d, const char *rule, const char *value,
                    size_t value_len, size_t r, uint64_t w,
                    uint64_t admitted, uint64_t refused)
{
    char name[RL_NAME_MAX + 1 + RL_WIRE_VALUE_MAX];
    if (r >= d->n_regions || value_len > RL_WIRE_VALUE_MAX
        || strlen(rule) > RL_NAME_MAX || w == 0)
        return true;
    size_t len = name_of(name, rule, value, value_len);
    uint64_t h = hash_of(name, len);
    key **at = find(d, name, len, h);
    if (*at == NULL) {
        if (d->n_keys >= d->max_keys) {
            d->refused++;
            return false;
        }
        key *k = calloc(1, sizeof *k + len);
        if (k == NULL || (k->rings = calloc(d->n_regions, sizeof(ring)))
                             == NULL
            || (k->parts = calloc(d->n_regions, sizeof *k->parts)) == NULL) {
            if (k != NULL)
                free(k->rings);
            free(k);
            d->refused++;
            return false;
        }
        k->hash = h;
        k->len = len;
        memcpy(k->name, name, len);
        *at = k;
        if (++d->n_keys > d->cap)
            grow(d);
        at = find(d, name, len, h);
    }
    ring_add(&(*at)->rings[r], w, admitted, refused);
    return true;
}

static key *lookup(const rl_demand *d, const char *rule,
                         const char *value, size_t value_len)
{
    char name[RL_NAME_MAX + 1 + RL_WIRE_VALUE_MAX];
    if (value_len > RL_WIRE_VALUE_MAX || strlen(rule) > RL_NAME_MAX)
        return NULL;
    size_t len = name_of(name, rule, value, value_len);
    return *find(d, name, len, hash_of(name, len));
}

void rl_demand_parts(rl_demand *d, const char *rule, const char *value,
                     size_t value_len, uint64_t at, bool cut,
                     uint64_t *parts)
{
    uint64_t even = RL_WIRE_SHARE_WHOLE / (d->n_regions ? d->n_regions : 1);
    key *k = lookup(d, rule, value, value_len);
    for (size_t r = 0; r < d->n_regions; r++)
        parts[r] = k != NULL && k->parts_known ? k->parts[r] : even;
    if (k == NULL || cut)
        return;
    for (size_t r = 0; r < d->n_regions; r++)
        if (!ring_holds_span(&k->rings[r], at))
            return;
    uint64_t all = 0;
    for (size_t r = 0; r < d->n_regions; r++)
        all += ring_sum(&k->rings[r], at);
    for (size_t r = 0; r < d->n_regions; r++) {
        uint64_t mine = ring_sum(&k->rings[r], at);
        /* Rounded down: the regions' parts never add up to more than the
         * room. */
        parts[r] = all == 0 ? even
                            : (uint64_t)((unsigned __int128)mine
                                         * RL_WIRE_SHARE_WHOLE / all);
        k->parts[r] = (uint32_t)parts[r];
    }
    k->parts_known = true;
}

void rl_demand_sweep(rl_demand *d, uint64_t now_ms,
                     uint64_t (*g_of)(void *, const char *rule), void *arg)
{
    for (size_t i = 0; i < d->cap; i++) {
        for (key **at = &d->buckets[i]; *at != NULL;) {
            key *k = *at;
            uint64_t g = g_of(arg, k->name);
            uint64_t newest = 0;
            for (size_t r = 0; r < d->n_regions; r++)
                newest = k->rings[r].head > newest ? k->rings[r].head
                                                   : newest;
            /* g 0: the rule is gone (a reload). */
            if (g == 0
                || newest + 2 * (RL_WIRE_SUBWINDOWS + 1) < now_ms / g) {
                *at = k->next;
                key_free(k);
                d->n_keys--;
            } else {
                at = &k->next;
            }
        }
    }
}

size_t rl_demand_keys(const rl_demand *d)
{
    return d->n_keys;
}

uint64_t rl_demand_refused(const rl_demand *d)
{
    return d->refused;
}
