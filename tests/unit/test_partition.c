/*
 * partition.c: rendezvous hashing of synced keys over the aggregators.
 */
#include "partition.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define KEYS 10000
#define N 3

static uint64_t key_of(int i)
{
    char value[32];
    int len = snprintf(value, sizeof value, "org_%d", i);
    return rl_partition_key("per-tenant", value, (size_t)len);
}

Test(partition, ten_thousand_keys_spread_within_20_percent_and_only_the_lost_ones_move)
{
    static size_t before[KEYS];
    size_t per[N] = {0};
    bool up[N] = {true, true, true};
    for (int i = 0; i < KEYS; i++)
        per[before[i] = rl_partition_owner(key_of(i), up, N)]++;
    for (int k = 0; k < N; k++) {
        fprintf(stderr, "partition: aggregator %d holds %zu of %d keys\n", k,
                per[k], KEYS);
        cr_expect_geq(per[k], KEYS / N * 8 / 10);
        cr_expect_leq(per[k], KEYS / N * 12 / 10);
    }
    /* Aggregator 1 taken out: its keys spread over the other two, theirs
     * stay where they were. */
    up[1] = false;
    size_t moved_to[N] = {0};
    for (int i = 0; i < KEYS; i++) {
        size_t now = rl_partition_owner(key_of(i), up, N);
        cr_assert_neq(now, 1);
        if (before[i] != 1)
            cr_assert_eq(now, before[i], "key %d moved from %zu to %zu", i,
                         before[i], now);
        else
            moved_to[now]++;
    }
    cr_expect_geq(moved_to[0], per[1] / 2 * 8 / 10);
    cr_expect_geq(moved_to[2], per[1] / 2 * 8 / 10);
    /* Back: every key where it was. */
    up[1] = true;
    for (int i = 0; i < KEYS; i++)
        cr_assert_eq(rl_partition_owner(key_of(i), up, N), before[i]);
}

Test(partition, with_none_up_every_key_keeps_its_own_and_one_takes_all)
{
    bool none[N] = {false, false, false};
    bool all[N] = {true, true, true};
    bool only2[N] = {false, false, true};
    for (int i = 0; i < 1000; i++) {
        uint64_t k = key_of(i);
        cr_assert_eq(rl_partition_owner(k, none, N),
                     rl_partition_owner(k, all, N));
        cr_assert_eq(rl_partition_owner(k, only2, N), 2);
        cr_assert_eq(rl_partition_owner(k, all, 1), 0);
    }
    /* The rule's name and the value are kept apart. */
    cr_assert_neq(rl_partition_key("ab", "c", 1),
                  rl_partition_key("a", "bc", 2));
}
