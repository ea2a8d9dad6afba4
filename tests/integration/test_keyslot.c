/*
 * rl_key_slot against a real Redis Cluster node: a few hundred keys, the
 * seed's three among them, the spec's hash tag cases, and generated keys
 * with braces and binary bytes, each compared with CLUSTER KEYSLOT.
 */
#include "keys.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static redisContext *cluster_node(void)
{
    char first[64];
    const char *all = test_env("RL_TEST_CLUSTER");
    snprintf(first, sizeof first, "%.*s", (int)strcspn(all, ","), all);
    return test_redis_connect(first);
}

static long redis_slot(redisContext *c, const char *key, size_t len)
{
    redisReply *r = test_redis_command(c, "CLUSTER KEYSLOT %b", key, len);
    cr_assert_eq(r->type, REDIS_REPLY_INTEGER, "CLUSTER KEYSLOT: %s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "not an integer");
    long slot = (long)r->integer;
    freeReplyObject(r);
    return slot;
}

static void expect_same_slot(redisContext *c, const char *key, size_t len)
{
    long want = redis_slot(c, key, len);
    cr_expect_eq(rl_key_slot(key, len), want, "key '%.*s' (%zu bytes): rl %u,"
                 " redis %ld", (int)len, key, len, rl_key_slot(key, len), want);
}

Test(keyslot, seed_keys_land_in_the_seeds_slots)
{
    redisContext *c = cluster_node();
    /* The seed's test put its three keys in slots 10,489, 2,034 and 1,700:
     * the API key, the address and the tenant. */
    long ip = redis_slot(c, "rl:ip:203.0.113.42", 18);
    long key = redis_slot(c, "rl:key:ak_abc123", 16);
    long tenant = redis_slot(c, "rl:tenant:org_acme", 18);
    cr_assert_eq(ip, 2034);
    cr_assert_eq(key, 10489);
    cr_assert_eq(tenant, 1700);
    cr_assert_eq(rl_key_slot("rl:ip:203.0.113.42", 18), 2034);
    cr_assert_eq(rl_key_slot("rl:key:ak_abc123", 16), 10489);
    cr_assert_eq(rl_key_slot("rl:tenant:org_acme", 18), 1700);
    redisFree(c);
}

Test(keyslot, hash_tag_cases_match_redis)
{
    redisContext *c = cluster_node();
    const char *keys[] = {"{user1000}.following", "{user1000}.followers",
                          "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}",
                          "{}", "{", "}", "}{", "{a}", "a{b", "a}b{c}",
                          "{acme}:key:ak_1", "{acme}:ip:1.2.3.4", "", "x"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        expect_same_slot(c, keys[i], strlen(keys[i]));
    redisFree(c);
}

/* xorshift: the same keys every run, so a failure can be reproduced. */
static uint32_t next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

Test(keyslot, generated_keys_match_redis)
{
    redisContext *c = cluster_node();
    static const char alphabet[] = "ab{}:._-0123456789";
    uint32_t seed = 0x2545F491;
    for (int n = 0; n < 400; n++) {
        char key[64];
        size_t len = 1 + next(&seed) % (sizeof key - 1);
        for (size_t i = 0; i < len; i++) {
            uint32_t r = next(&seed);
            /* One key in four carries arbitrary bytes, NUL included. */
            key[i] = n % 4 == 0 ? (char)(r & 0xff)
                                : alphabet[r % (sizeof alphabet - 1)];
        }
        expect_same_slot(c, key, len);
    }
    redisFree(c);
}
