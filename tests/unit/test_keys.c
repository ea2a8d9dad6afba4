/* Bucket keys: exact bytes, hard limits, and the cluster slot function on
 * the specification's own check value. */
#include "keys.h"
#include "rl.h"

#include <criterion/criterion.h>
#include <string.h>

Test(keys, seed_keys_are_prefix_and_value)
{
    char key[RL_KEY_MAX];
    size_t len = 0;
    cr_assert_eq(rl_key_build("rl:ip:", "203.0.113.42", 12, key, sizeof key,
                              &len), RL_OK);
    cr_assert_str_eq(key, "rl:ip:203.0.113.42");
    cr_assert_eq(len, 18);
    cr_assert_eq(rl_key_build("rl:key:", "ak_abc123", 9, key, sizeof key,
                              &len), RL_OK);
    cr_assert_str_eq(key, "rl:key:ak_abc123");
}

Test(keys, values_up_to_256_bytes_are_kept_whole)
{
    char value[RL_VALUE_MAX + 1], key[RL_KEY_MAX];
    memset(value, 'v', sizeof value);
    size_t len = 0;
    cr_assert_eq(rl_key_build("rl:ip:", value, RL_VALUE_MAX, key, sizeof key,
                              &len), RL_OK);
    cr_assert_eq(len, 6 + RL_VALUE_MAX);
    cr_assert_eq(memcmp(key + 6, value, RL_VALUE_MAX), 0);
}

Test(keys, longer_values_are_refused_not_truncated)
{
    char value[RL_VALUE_MAX + 1], key[RL_KEY_MAX];
    memset(value, 'v', sizeof value);
    memset(key, 'x', sizeof key);
    cr_assert_eq(rl_key_build("rl:ip:", value, RL_VALUE_MAX + 1, key,
                              sizeof key, NULL), RL_ETOOLONG);
    cr_assert_eq(key[0], 'x', "the buffer was written to");
}

Test(keys, empty_values_and_nul_bytes_are_refused)
{
    char key[RL_KEY_MAX];
    cr_assert_eq(rl_key_build("rl:ip:", "", 0, key, sizeof key, NULL),
                 RL_EINVAL);
    cr_assert_eq(rl_key_build("rl:ip:", "a\0b", 3, key, sizeof key, NULL),
                 RL_EINVAL);
    cr_assert_eq(rl_key_build(NULL, "a", 1, key, sizeof key, NULL),
                 RL_EINVAL);
}

/* The word test covers 4 to 16 bytes with two overlapping loads: a NUL
 * at every position of every length, and bytes that look like a borrow
 * (0x01, 0x80, 0xff) next to it, are told apart from no NUL at all. */
Test(keys, a_nul_is_found_at_every_position_of_short_values)
{
    const unsigned char fills[] = {'a', 0x01, 0x80, 0xff};
    for (size_t f = 0; f < sizeof fills; f++) {
        for (size_t len = 1; len <= 24; len++) {
            char v[24];
            memset(v, fills[f], sizeof v);
            if (len < sizeof v)
                v[len] = '\0'; /* past the value: not part of it */
            cr_assert(!rl_key_has_nul(v, len), "fill %zu, len %zu", f, len);
            for (size_t at = 0; at < len; at++) {
                memset(v, fills[f], sizeof v);
                v[at] = '\0';
                cr_assert(rl_key_has_nul(v, len), "fill %zu, len %zu, at %zu",
                          f, len, at);
                cr_assert_eq(rl_key_build("p:", v, len, (char[64]){0}, 64,
                                          NULL),
                             RL_EINVAL);
            }
        }
    }
}

Test(keys, a_key_that_does_not_fit_the_buffer_is_refused)
{
    char key[10];
    cr_assert_eq(rl_key_build("rl:ip:", "1234", 4, key, sizeof key, NULL),
                 RL_ETOOLONG);
    cr_assert_eq(rl_key_build("rl:ip:", "123", 3, key, sizeof key, NULL),
                 RL_OK);
    cr_assert_str_eq(key, "rl:ip:123");
}

Test(keys, slot_of_the_crc16_check_string)
{
    /* CRC16-XMODEM("123456789") = 0x31C3, the cluster spec's check value. */
    cr_assert_eq(rl_key_slot("123456789", 9), 0x31C3 % 16384);
}

/* The spec's CRC16 bit by bit, apart from rl's table: the slot of a key
 * hashed whole. */
static uint16_t whole_key_slot(const char *key)
{
    uint16_t crc = 0;
    for (; *key != '\0'; key++) {
        crc ^= (uint16_t)((unsigned char)*key << 8);
        for (int bit = 0; bit < 8; bit++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021)
                                 : (uint16_t)(crc << 1);
    }
    return crc % 16384;
}

Test(keys, hash_tags_follow_the_cluster_spec)
{
    uint16_t user = rl_key_slot("user1000", 8);
    cr_assert_eq(user, whole_key_slot("user1000"));
    cr_assert_eq(rl_key_slot("{user1000}.following", 20), user);
    cr_assert_eq(rl_key_slot("{user1000}.followers", 20), user);
    /* An empty tag means no tag: the whole key is hashed, not the empty
     * tag (slot 0) nor a later tag. */
    cr_assert_eq(rl_key_slot("foo{}{bar}", 10), whole_key_slot("foo{}{bar}"));
    cr_assert_neq(rl_key_slot("foo{}{bar}", 10), rl_key_slot("bar", 3));
    cr_assert_eq(rl_key_slot("{}", 2), whole_key_slot("{}"));
    cr_assert_neq(whole_key_slot("{}"), 0);
    /* The tag ends at the first '}' after the first '{'. */
    cr_assert_eq(rl_key_slot("foo{{bar}}zap", 13), rl_key_slot("{bar", 4));
    cr_assert_eq(rl_key_slot("foo{bar}{zap}", 13), rl_key_slot("bar", 3));
}

/* hash_tag of another attribute (issue 18): the tag between the prefix
 * and the value, every key of one tag in one slot. */
Test(keys, tagged_keys_share_their_tags_slot)
{
    char a[RL_KEY_MAX], b[RL_KEY_MAX];
    size_t len = 0;
    cr_assert_eq(rl_key_build_tagged("rl:key:", "org_acme", 8, "ak_abc123", 9,
                                     a, sizeof a, &len), RL_OK);
    cr_assert_str_eq(a, "rl:key:{8:org_acme}:ak_abc123");
    cr_assert_eq(len, strlen(a));
    cr_assert_eq(rl_key_build_tagged("rl:tenant:", "org_acme", 8, "org_acme",
                                     8, b, sizeof b, &len), RL_OK);
    cr_assert_eq(rl_key_slot(a, strlen(a)), rl_key_slot(b, strlen(b)));
    cr_assert_eq(rl_key_slot(a, strlen(a)), rl_key_slot("8:org_acme", 10));
    /* No tag: the untagged key, byte for byte. */
    cr_assert_eq(rl_key_build_tagged("rl:key:", NULL, 0, "ak_abc123", 9, a,
                                     sizeof a, &len), RL_OK);
    cr_assert_str_eq(a, "rl:key:ak_abc123");
}

Test(keys, a_brace_in_a_tag_keeps_keys_apart)
{
    char a[RL_KEY_MAX], b[RL_KEY_MAX];
    cr_assert_eq(rl_key_build_tagged("rl:key:", "t}", 2, "v", 1, a, sizeof a,
                                     NULL), RL_OK);
    cr_assert_eq(rl_key_build_tagged("rl:key:", "t", 1, "}v", 2, b, sizeof b,
                                     NULL), RL_OK);
    cr_assert_str_neq(a, b);
    cr_assert_eq(rl_key_build_tagged("rl:key:", "a\0b", 3, "v", 1, a,
                                     sizeof a, NULL), RL_EINVAL);
    char tag[RL_VALUE_MAX + 1];
    memset(tag, 't', sizeof tag);
    cr_assert_eq(rl_key_build_tagged("rl:key:", tag, sizeof tag, "v", 1, a,
                                     sizeof a, NULL), RL_ETOOLONG);
}

#include <pthread.h>

static void *slot_many(void *arg)
{
    uint16_t *out = arg;
    for (int i = 0; i < 1000; i++)
        *out = rl_key_slot("rl:key:ak_abc123", 16);
    return NULL;
}

Test(keys, slot_is_safe_from_many_threads_at_first_use)
{
    /* Each test runs in a new process, so these threads race to build the
     * CRC table: the result must be the same for all of them. */
    pthread_t threads[8];
    uint16_t slots[8];
    for (int i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, slot_many, &slots[i]),
                     0);
    for (int i = 0; i < 8; i++)
        pthread_join(threads[i], NULL);
    for (int i = 1; i < 8; i++)
        cr_assert_eq(slots[i], slots[0]);
}
