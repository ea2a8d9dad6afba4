/*
 * keys.h: the Redis key of a bucket (rule prefix + attribute value) and the
 * Redis Cluster hash slot it lives in. Private to librl.
 */
#ifndef RL_COMMON_KEYS_H
#define RL_COMMON_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The longest attribute value a key may carry, in bytes. Longer values are
 * refused, never truncated: two long values that shared a prefix would
 * otherwise share a bucket. */
#define RL_VALUE_MAX 256

/* The longest key prefix a rule may have, in bytes. */
#define RL_PREFIX_MAX 128

/* The longest co-location tag, "{<len>:<value>}:" (rl_key_build_tagged). */
#define RL_TAG_MAX (RL_VALUE_MAX + 8)

/* Room for any key rl builds, with its terminating NUL. */
#define RL_KEY_MAX (RL_PREFIX_MAX + RL_TAG_MAX + RL_VALUE_MAX + 1)

#define RL_CLUSTER_SLOTS 16384

/* rl_key_build writes prefix followed by the value_len bytes of value into
 * buf (of size cap), NUL-terminated, and its length into *key_len.
 * Returns RL_EINVAL for an empty value or one holding a NUL byte (it could
 * not be told apart from a shorter value), RL_ETOOLONG for a value over
 * RL_VALUE_MAX bytes or a key that does not fit in cap. */
int rl_key_build(const char *prefix, const char *value, size_t value_len,
                 char *buf, size_t cap, size_t *key_len);

/* rl_key_build_tagged is rl_key_build with a rule's co-location tag
 * (hash_tag naming another attribute): prefix, then "{<len>:<tag>}:", then
 * the value, e.g. "rl:key:{8:org_acme}:ak_abc123". Redis Cluster hashes
 * the braces' content, so every key tagged with one value shares a slot;
 * the length makes the key one-to-one whatever bytes the tag holds (a '}'
 * too). tag NULL: rl_key_build's key, the one a request without the
 * tag's attribute uses. The tag is checked as a value is. */
int rl_key_build_tagged(const char *prefix, const char *tag, size_t tag_len,
                        const char *value, size_t value_len, char *buf,
                        size_t cap, size_t *key_len);

/* The bytes a tag of tag_len bytes adds to a key. */
size_t rl_key_tag_bytes(size_t tag_len);

/* rl_key_slot returns the Redis Cluster hash slot of a key: CRC16 (XMODEM)
 * of the key, or of its hash tag, modulo 16384. The tag is what lies between
 * the first '{' and the first '}' after it, when that is not empty. */
uint16_t rl_key_slot(const char *key, size_t len);

/* The first and the last width bytes (4 or 8) of a value of len bytes,
 * each as a word, zero-extended; width <= len, so nothing past len is
 * read. The in-process tables compare and test short values on
 * every check, and two overlapping loads cost less than a call of memcmp
 * or memchr (perf on the synced loop). */
static inline void rl_key_ends(const char *a, size_t len, size_t width,
                               uint64_t *head, uint64_t *tail)
{
    *head = 0;
    *tail = 0;
    memcpy(head, a, width);
    memcpy(tail, a + len - width, width);
}

/* rl_key_equal compares two values of len bytes each: from 4 to 16 bytes
 * by their ends. */
static inline bool rl_key_equal(const char *a, const char *b, size_t len)
{
    uint64_t a0, a1, b0, b1;
    if (len >= 8 && len <= 16) {
        rl_key_ends(a, len, 8, &a0, &a1);
        rl_key_ends(b, len, 8, &b0, &b1);
    } else if (len >= 4 && len < 8) {
        rl_key_ends(a, len, 4, &a0, &a1);
        rl_key_ends(b, len, 4, &b0, &b1);
    } else {
        return memcmp(a, b, len) == 0;
    }
    return ((a0 ^ b0) | (a1 ^ b1)) == 0;
}

/* Whether a word holds a zero byte: exact for "some byte is zero" (the
 * test is only unsure which one). */
static inline bool rl_word_has_nul(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL;
    return ((w - ones) & ~w & (ones << 7)) != 0;
}

/* rl_key_has_nul says whether a value of len bytes holds a NUL byte, which
 * no key may (it could not be told apart from a shorter value): from 4 to
 * 16 bytes by its ends (two 4-byte ends as one word). */
static inline bool rl_key_has_nul(const char *value, size_t len)
{
    uint64_t head, tail;
    if (len >= 8 && len <= 16) {
        rl_key_ends(value, len, 8, &head, &tail);
        return rl_word_has_nul(head) | rl_word_has_nul(tail);
    }
    if (len >= 4 && len < 8) {
        rl_key_ends(value, len, 4, &head, &tail);
        return rl_word_has_nul(tail << 32 | head);
    }
    return memchr(value, '\0', len) != NULL;
}

/* Folds eight bytes into h with a multiply. A byte-wise FNV-1a took a
 * serial multiply per byte: a ninth of a synced check's instructions. */
static inline uint64_t rl_key_mix(uint64_t h, uint64_t word)
{
    h = (h ^ word) * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 32);
}

/* rl_key_hash hashes an attribute value for the agent's in-process tables,
 * salted with something that tells rules apart: eight bytes at a time
 * (rl_key_hash_value), then the salt and a final mix so that the low bits
 * (the tables' index) depend on every input bit (rl_key_hash_salt). The
 * salt goes in last so that one value's rl_key_hash_value serves several
 * tables: a check of a rule with overrides looks its value up in the
 * override map and in the synced table for the price of one pass over the
 * bytes. Not stable across processes or versions; never stored or sent.
 * Inline: every synced and local check hashes its value. */
static inline uint64_t rl_key_hash_value(const char *value, size_t len)
{
    uint64_t h = rl_key_mix(0xcbf29ce484222325ULL, len);
    for (; len >= 8; len -= 8, value += 8) {
        uint64_t word;
        memcpy(&word, value, 8);
        h = rl_key_mix(h, word);
    }
    /* The last 1 to 7 bytes: two overlapping loads, or three bytes. */
    if (len >= 4) {
        uint32_t a, b;
        memcpy(&a, value, 4);
        memcpy(&b, value + len - 4, 4);
        h = rl_key_mix(h, (uint64_t)a << 32 | b);
    } else if (len > 0) {
        const unsigned char *u = (const unsigned char *)value;
        h = rl_key_mix(h, (uint64_t)u[0] << 16 | (uint64_t)u[len / 2] << 8
                       | u[len - 1]);
    }
    return h;
}

/* The hash of a value whose rl_key_hash_value is vh, for one table (salt):
 * a bijection of vh ^ salt, so one value under two salts never collides. */
static inline uint64_t rl_key_hash_salt(uint64_t vh, uintptr_t salt)
{
    uint64_t h = vh ^ salt;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 32);
}

static inline uint64_t rl_key_hash(uintptr_t salt, const char *value,
                                   size_t len)
{
    return rl_key_hash_salt(rl_key_hash_value(value, len), salt);
}

#endif
