/*
 * overrides.c: a rule's values overrides, value -> override, as an
 * open-addressing hash table (linear probing, at most half full). A check
 * looks its value up on every request, so the table is built for that:
 * each slot is one word holding the top half of the value's hash and the
 * entry's index, so that a miss (the common case: most keys have no
 * override) usually costs one cache line and no string compare. Entries
 * and value bytes live in two compact arrays, not one allocation per value:
 * 100,000 values of 20 bytes take about 4.5 MB (see rl_override_map_bytes).
 */
#include "config.h"
#include "keys.h"
#include "rules.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Any constant: the table is per process and never stored. */
#define MAP_SALT 0x6f76657272696465ULL

struct entry {
    const rl_override *o;
    uint32_t off; /* into bytes */
    uint32_t len;
};

struct rl_override_map {
    uint64_t *slots;       /* 0: empty; else hash's top 32 bits | index + 1 */
    size_t mask;           /* slots - 1, a power of two less one */
    /* A filter in front of the slots (a Bloom filter whose three bits per
     * value lie in one word): a value not mapped is nearly always turned
     * away by one load from a table an eighth the slots' size, and by a
     * branch that goes the same way for every such value. Probing the
     * slots instead (a line of a 2 MB table, then a loop of unforeseeable
     * length) made a synced check of a value not mapped 46 ns against 32
     * for a rule without overrides; 34 with the filter (one thread, 1,000
     * keys, 100,000 values). Eight bits per slot, so at least sixteen per
     * value: about one value in a hundred not mapped gets past it. */
    uint64_t *filter;
    size_t filter_mask;    /* words - 1 */
    struct entry *entries;
    size_t n, cap;
    char *bytes;           /* the values, back to back */
    size_t used, bytes_cap;
};

static size_t slots_for(size_t n)
{
    size_t slots = 16;
    while (slots < 2 * n)
        slots *= 2;
    return slots;
}

static size_t filter_words(size_t slots)
{
    return slots / 8;
}

/* The filter's word for a value of hash h, and the bits it sets there. */
static size_t filter_word(const rl_override_map *m, uint64_t h)
{
    return (size_t)(h >> 20) & m->filter_mask;
}

static uint64_t filter_bits(uint64_t h)
{
    return 1ULL << (h >> 40 & 63) | 1ULL << (h >> 46 & 63)
           | 1ULL << (h >> 52 & 63);
}

int rl_override_map_new(size_t n_values, rl_override_map **out)
{
    *out = NULL;
    if (n_values > RL_OVERRIDES_MAX)
        return RL_EINVAL;
    rl_override_map *m = calloc(1, sizeof *m);
    if (m == NULL)
        return RL_ENOMEM;
    size_t slots = slots_for(n_values);
    m->mask = slots - 1;
    m->cap = n_values > 0 ? n_values : 1;
    m->bytes_cap = m->cap * 16;
    m->slots = calloc(slots, sizeof *m->slots);
    m->filter_mask = filter_words(slots) - 1;
    m->filter = calloc(filter_words(slots), sizeof *m->filter);
    m->entries = malloc(m->cap * sizeof *m->entries);
    m->bytes = malloc(m->bytes_cap);
    if (m->slots == NULL || m->filter == NULL || m->entries == NULL
        || m->bytes == NULL) {
        rl_override_map_free(m);
        return RL_ENOMEM;
    }
    *out = m;
    return RL_OK;
}

/* The slot holding value, or the empty slot where it would go. */
static size_t probe(const rl_override_map *m, const char *value, size_t len,
                    uint64_t h)
{
    uint64_t tag = h & ~0xffffffffULL;
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t s = m->slots[i];
        if (s == 0)
            return i;
        if ((s & ~0xffffffffULL) == tag) {
            const struct entry *e = &m->entries[(uint32_t)s - 1];
            if (e->len == len && rl_key_equal(m->bytes + e->off, value, len))
                return i;
        }
    }
}

static uint64_t hash(const char *value, size_t len)
{
    return rl_key_hash(MAP_SALT, value, len);
}

/* Doubles the slots, keeping the table at most half full, and the
 * filter with them. */
static int grow_slots(rl_override_map *m)
{
    size_t slots = (m->mask + 1) * 2;
    uint64_t *old = m->slots;
    size_t old_n = m->mask + 1;
    uint64_t *filter = calloc(filter_words(slots), sizeof *filter);
    if (filter == NULL
        || (m->slots = calloc(slots, sizeof *m->slots)) == NULL) {
        free(filter);
        m->slots = old;
        return RL_ENOMEM;
    }
    free(m->filter);
    m->filter = filter;
    m->filter_mask = filter_words(slots) - 1;
    m->mask = slots - 1;
    for (size_t i = 0; i < old_n; i++) {
        if (old[i] == 0)
            continue;
        const struct entry *e = &m->entries[(uint32_t)old[i] - 1];
        uint64_t h = hash(m->bytes + e->off, e->len);
        m->slots[probe(m, m->bytes + e->off, e->len, h)] = old[i];
        m->filter[filter_word(m, h)] |= filter_bits(h);
    }
    free(old);
    return RL_OK;
}

int rl_override_map_add(rl_override_map *m, const char *value, size_t len,
                        const rl_override *o, const rl_override **existing)
{
    if (existing != NULL)
        *existing = NULL;
    if (m == NULL || value == NULL || len == 0 || len > RL_VALUE_MAX
        || o == NULL)
        return RL_EINVAL;
    uint64_t h = hash(value, len);
    size_t at = probe(m, value, len, h);
    if (m->slots[at] != 0) {
        if (existing != NULL)
            *existing = m->entries[(uint32_t)m->slots[at] - 1].o;
        return RL_EINVAL;
    }
    if (m->n >= RL_OVERRIDES_MAX)
        return RL_EINVAL;
    if (2 * (m->n + 1) > m->mask + 1) {
        if (grow_slots(m) != RL_OK)
            return RL_ENOMEM;
        at = probe(m, value, len, h);
    }
    if (m->n == m->cap) {
        struct entry *e = realloc(m->entries, 2 * m->cap * sizeof *e);
        if (e == NULL)
            return RL_ENOMEM;
        m->entries = e;
        m->cap *= 2;
    }
    if (m->used + len > m->bytes_cap) {
        size_t cap = m->bytes_cap * 2;
        while (cap < m->used + len)
            cap *= 2;
        char *b = realloc(m->bytes, cap);
        if (b == NULL)
            return RL_ENOMEM;
        m->bytes = b;
        m->bytes_cap = cap;
    }
    memcpy(m->bytes + m->used, value, len);
    m->entries[m->n] = (struct entry){.o = o, .off = (uint32_t)m->used,
                                      .len = (uint32_t)len};
    m->used += len;
    m->n++;
    m->slots[at] = (h & ~0xffffffffULL) | (uint64_t)m->n;
    m->filter[filter_word(m, h)] |= filter_bits(h);
    return RL_OK;
}

const rl_override *rl_override_map_find(const rl_override_map *m,
                                        const char *value, size_t len)
{
    return rl_override_map_find_hashed(m, value, len,
                                       rl_key_hash_value(value, len));
}

const rl_override *rl_override_map_find_hashed(const rl_override_map *m,
                                               const char *value, size_t len,
                                               uint64_t value_hash)
{
    if (m == NULL || m->n == 0)
        return NULL;
    uint64_t h = rl_key_hash_salt(value_hash, MAP_SALT);
    uint64_t bits = filter_bits(h);
    if ((m->filter[filter_word(m, h)] & bits) != bits)
        return NULL;
    uint64_t s = m->slots[probe(m, value, len, h)];
    return s != 0 ? m->entries[(uint32_t)s - 1].o : NULL;
}

size_t rl_override_map_bytes(const rl_override_map *m)
{
    if (m == NULL)
        return 0;
    return sizeof *m + (m->mask + 1) * sizeof *m->slots
           + (m->filter_mask + 1) * sizeof *m->filter
           + m->cap * sizeof *m->entries + m->bytes_cap;
}

void rl_override_map_free(rl_override_map *m)
{
    if (m == NULL)
        return;
    free(m->slots);
    free(m->filter);
    free(m->entries);
    free(m->bytes);
    free(m);
}

void rl_override_map_each(const rl_override_map *m,
                          bool (*fn)(const char *value, size_t len,
                                     const rl_override *o, void *arg),
                          void *arg)
{
    for (size_t i = 0; m != NULL && i < m->n; i++) {
        const struct entry *e = &m->entries[i];
        if (!fn(m->bytes + e->off, e->len, e->o, arg))
            return;
    }
}
