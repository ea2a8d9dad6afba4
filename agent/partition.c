/*
 * partition.c: rendezvous (highest random weight) hashing of synced keys
 * over the aggregators that are up (Thaler and Ravishankar, "Using
 * name-based mappings to increase hit rates", 1998). Each aggregator gets
 * a score for a key, a hash of the key and the aggregator's index; the
 * key goes to the highest score among those up. Taking one aggregator out
 * moves only its own keys (each to the one that scored next for it, so
 * they spread evenly over the rest), and bringing it back moves them
 * back: the keys of the others never move. Scores depend on the key and
 * the index only, so every agent with the same config agrees.
 */
#include "partition.h"

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * FNV_PRIME;
    return h;
}

uint64_t rl_partition_key(const char *rule, const char *value, size_t len)
{
    size_t n = 0;
    while (rule[n] != '\0')
        n++;
    /* The NUL ends the name: ("ab", "c") and ("a", "bc") differ. */
    return fnv1a(fnv1a(FNV_OFFSET, rule, n + 1), value, len);
}

/* FNV-1a's low bits mix poorly and a score must depend on every bit of
 * the key and the index: an avalanche finaliser (MurmurHash3's fmix64
 * constants) over both. */
static uint64_t score(uint64_t key, size_t index)
{
    uint64_t h = key ^ ((uint64_t)(index + 1) * 0x9e3779b97f4a7c15ULL);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

size_t rl_partition_owner(uint64_t key, const bool *up, size_t n)
{
    bool any = false;
    for (size_t i = 0; i < n && !any; i++)
        any = up[i];
    size_t best = 0;
    uint64_t best_score = 0;
    bool found = false;
    for (size_t i = 0; i < n; i++) {
        if (any && !up[i])
            continue;
        uint64_t s = score(key, i);
        if (!found || s > best_score) {
            best = i;
            best_score = s;
            found = true;
        }
    }
    return best;
}
