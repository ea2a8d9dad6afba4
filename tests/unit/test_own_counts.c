/*
 * An agent's counts of a key by sub-window (agent/own_counts.h): what a
 * report's entries say of when their counts were made, and what a
 * degraded share counts of its own.
 */
#include "own_counts.h"

#include <criterion/criterion.h>

#define G 100

Test(own_counts, a_split_gives_the_newest_counts_by_their_sub_window)
{
    rl_own_counts o = {0};
    rl_own_record(&o, 1000, G, 5);   /* 5 in 1000 */
    rl_own_record(&o, 1002, G, 12);  /* 7 in 1002 */
    rl_own_record(&o, 1002, G, 15);  /* 3 more in 1002 */
    rl_own_record(&o, 1005, G, 19);  /* 4 in 1005 */
    rl_own_part p[RL_OWN_WINDOWS + 1];
    /* The first 8 reported already: 2 of 1002's 10, and 1005's 4. */
    size_t n = rl_own_split(&o, 13, p);
    cr_assert_eq(n, 2);
    cr_assert_eq(p[0].window, 1005);
    cr_assert_eq(p[0].count, 4);
    cr_assert_eq(p[1].window, 1002);
    cr_assert_eq(p[1].count, 2);
    cr_assert_eq(rl_own_split(&o, 19, p), 0);
    n = rl_own_split(&o, 0, p);
    cr_assert_eq(n, 3);
    cr_assert_eq(p[2].window, 1000);
    cr_assert_eq(p[2].count, 5);
}

Test(own_counts, counts_older_than_every_span_go_just_before_it)
{
    rl_own_counts o = {0};
    rl_own_record(&o, 1000, G, 9);
    rl_own_record(&o, 1000 + RL_OWN_WINDOWS + 5, G, 10);
    rl_own_part p[RL_OWN_WINDOWS + 1];
    size_t n = rl_own_split(&o, 0, p);
    cr_assert_eq(n, 2);
    cr_assert_eq(p[0].window, 1000 + RL_OWN_WINDOWS + 5);
    cr_assert_eq(p[0].count, 1);
    /* The ring keeps RL_OWN_WINDOWS sub-windows: 1000 is gone, and its 9
     * go to one no span holds, just before the oldest kept. */
    cr_assert_eq(p[1].window, 1000 + 5);
    cr_assert_eq(p[1].count, 9);
}

Test(own_counts, since_counts_the_span_and_before_its_oldest_part)
{
    rl_own_counts o = {0};
    rl_own_record(&o, 1000, G, 10);
    rl_own_record(&o, 1010, G, 30);
    rl_own_record(&o, 1020, G, 35);
    cr_assert_eq(rl_own_since(&o, 1000), 35);
    cr_assert_eq(rl_own_since(&o, 1001), 25);
    cr_assert_eq(rl_own_since(&o, 1011), 5);
    /* Of the first 12 counted: 1000's 10 and 2 of 1010's. */
    cr_assert_eq(rl_own_since_before(&o, 1000, 12), 12);
    cr_assert_eq(rl_own_since_before(&o, 1001, 12), 2);
    cr_assert_eq(rl_own_since_before(&o, 1011, 12), 0);
}

Test(own_counts, a_clock_that_moves_back_counts_in_the_newest)
{
    rl_own_counts o = {0};
    rl_own_record(&o, 1005, G, 3);
    rl_own_record(&o, 1004, G, 7);
    rl_own_part p[RL_OWN_WINDOWS + 1];
    cr_assert_eq(rl_own_split(&o, 0, p), 1);
    cr_assert_eq(p[0].window, 1005);
    cr_assert_eq(p[0].count, 7);
}

Test(own_counts, a_new_basis_keeps_every_count_in_the_sub_window_now)
{
    rl_own_counts o = {0};
    rl_own_record(&o, 1000, G, 4);
    rl_own_record(&o, 1003, G, 6);
    /* Another length, or Redis's clock in place of the wall clock. */
    rl_own_record(&o, 700, G + 1, 9);
    rl_own_part p[RL_OWN_WINDOWS + 1];
    cr_assert_eq(rl_own_split(&o, 0, p), 1);
    cr_assert_eq(p[0].window, 700);
    cr_assert_eq(p[0].count, 9);
}

/* A count made at a time (ns) was recorded by the first record that began
 * at or after it: its give-back is owed to that record's sub-window, and
 * leaves with it when the ring moves past it, or when a new basis
 * renumbers the sub-windows. */
Test(own_counts, a_give_back_is_owed_to_the_sub_window_its_count_was_recorded_in)
{
    rl_own_counts o = {0};
    cr_assert_eq(rl_own_window_of(&o, 1), 0, "nothing recorded yet");
    rl_own_record(&o, 1000, G, 5);
    rl_own_recorded_at(&o, 100);
    rl_own_record(&o, 1000, G, 6);
    rl_own_recorded_at(&o, 200);
    rl_own_record(&o, 1003, G, 9);
    rl_own_recorded_at(&o, 300);
    cr_assert_eq(rl_own_window_of(&o, 150), 1000);
    cr_assert_eq(rl_own_window_of(&o, 200), 1000);
    cr_assert_eq(rl_own_window_of(&o, 201), 1003);
    cr_assert_eq(rl_own_window_of(&o, 301), 0, "not recorded yet");
    rl_own_give_back(&o, 1000, 2);
    rl_own_give_back(&o, 1003, 1);
    rl_own_give_back(&o, 1000, 1);
    rl_own_part p[RL_OWN_WINDOWS + 1];
    cr_assert_eq(rl_own_backs(&o, p), 2);
    cr_assert_eq(p[0].window, 1003);
    cr_assert_eq(p[0].count, 1);
    cr_assert_eq(p[1].window, 1000);
    cr_assert_eq(p[1].count, 3);
    /* 1000 leaves the ring: its give-back is dropped, 1003's kept. */
    rl_own_record(&o, 1000 + RL_OWN_WINDOWS, G, 9);
    cr_assert_eq(rl_own_backs(&o, p), 1);
    cr_assert_eq(p[0].window, 1003);
    cr_assert_eq(rl_own_window_of(&o, 150), 0, "a sub-window gone");
    rl_own_backs_clear(&o);
    cr_assert_eq(rl_own_backs(&o, p), 0);
    /* A new basis drops what is owed. */
    rl_own_give_back(&o, 1003, 4);
    rl_own_record(&o, 500, 2 * G + 1, 9);
    cr_assert_eq(rl_own_backs(&o, p), 0);
    rl_own_give_back(&o, 1003, 4);
    cr_assert_eq(rl_own_backs(&o, p), 0, "owed to a sub-window not kept");
}
