/*
 * A global key's room splits among regions by their demand over the
 * trailing period (aggregator/demand.c).
 */
#include "../../aggregator/demand.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <string.h>

#define W 100000 /* a sub-window number, as Redis's clock gives them */

static uint64_t share(rl_demand *d, size_t self, uint64_t at, bool cut)
{
    uint64_t parts[3];
    rl_demand_parts(d, "g", "k", 1, at, cut, parts);
    return parts[self];
}

Test(demand, the_room_splits_by_each_regions_demand)
{
    rl_demand *d = rl_demand_new(3, 10);
    cr_assert(rl_demand_note(d, "g", "k", 1, 0, W, 700, 0));
    cr_assert(rl_demand_note(d, "g", "k", 1, 1, W + 3, 200, 0));
    cr_assert(rl_demand_note(d, "g", "k", 1, 2, W + 5, 100, 0));
    cr_assert_eq(share(d, 0, W + 5, false), 700000);
    cr_assert_eq(share(d, 1, W + 5, false), 200000);
    cr_assert_eq(share(d, 2, W + 5, false), 100000);
    /* Parts round down: they never add up to more than the room. */
    rl_demand_note(d, "g", "k", 1, 2, W + 5, 1, 0);
    uint64_t sum = share(d, 0, W + 5, false) + share(d, 1, W + 5, false)
                   + share(d, 2, W + 5, false);
    cr_assert_leq(sum, RL_WIRE_SHARE_WHOLE);
    cr_assert_geq(sum, RL_WIRE_SHARE_WHOLE - 3);
    rl_demand_free(d);
}

Test(demand, demand_leaves_with_its_span)
{
    rl_demand *d = rl_demand_new(2, 10);
    rl_demand_note(d, "g", "k", 1, 0, W, 900, 0);
    rl_demand_note(d, "g", "k", 1, 1, W + 10, 100, 0);
    cr_assert_eq(share(d, 0, W + 10, false), 900000);
    /* Twenty sub-windows on, region 0's 900 are its span's oldest... */
    cr_assert_eq(share(d, 0, W + 20, false), 900000);
    /* ...and one more, out of it: region 1 asks for everything. */
    cr_assert_eq(share(d, 0, W + 21, false), 0);
    cr_assert_eq(share(d, 1, W + 21, false), RL_WIRE_SHARE_WHOLE);
    rl_demand_free(d);
}

Test(demand, no_demand_known_splits_evenly)
{
    rl_demand *d = rl_demand_new(3, 10);
    cr_assert_eq(share(d, 1, W, false), RL_WIRE_SHARE_WHOLE / 3);
    rl_demand_note(d, "g", "k", 1, 0, W, 0, 0);
    cr_assert_eq(share(d, 1, W, false), RL_WIRE_SHARE_WHOLE / 3);
    rl_demand_free(d);
}

/* While a region is cut off, each keeps the part it last had, whatever
 * its own demand does: the parts worked out before the cut add up to the
 * room, and no region takes the whole limit. */
Test(demand, a_cut_keeps_the_last_part)
{
    rl_demand *d = rl_demand_new(2, 10);
    rl_demand_note(d, "g", "k", 1, 0, W, 300, 0);
    rl_demand_note(d, "g", "k", 1, 1, W, 700, 0);
    cr_assert_eq(share(d, 0, W, false), 300000);
    rl_demand_note(d, "g", "k", 1, 0, W + 1, 5000, 0);
    cr_assert_eq(share(d, 0, W + 1, true), 300000);
    cr_assert_eq(share(d, 0, W + 30, true), 300000);
    /* A key first seen during a cut: an even part. */
    uint64_t parts[2];
    rl_demand_parts(d, "g", "new", 3, W, true, parts);
    cr_assert_eq(parts[0], RL_WIRE_SHARE_WHOLE / 2);
    rl_demand_free(d);
}

/* Parts are read as of the others' last exchanges, which trail this
 * region's own counts (by an interval and a link's delay, and while a
 * silent region's cut is not yet found, more): as far as a span ahead,
 * this region's part as of then is what it was then, and past that the
 * part last worked out stands. */
Test(demand, a_part_read_behind_the_own_counts_stays_what_it_was)
{
    rl_demand *d = rl_demand_new(2, 10);
    for (uint64_t w = W; w <= W + 20; w++) {
        rl_demand_note(d, "g", "k", 1, 0, w, 10, 0);
        rl_demand_note(d, "g", "k", 1, 1, w, 40, 0);
    }
    cr_assert_eq(share(d, 0, W + 20, false), 200000);
    /* Region 0 counts on; region 1 is last heard at W + 20. */
    for (uint64_t w = W + 21; w <= W + 40; w++) {
        rl_demand_note(d, "g", "k", 1, 0, w, 10, 0);
        cr_assert_eq(share(d, 0, W + 20, false), 200000,
                     "a part read %llu sub-windows behind",
                     (unsigned long long)(w - W - 20));
    }
    rl_demand_note(d, "g", "k", 1, 0, W + 41, 1000, 0);
    cr_assert_eq(share(d, 0, W + 20, false), 200000,
                 "over a span behind");
    /* Region 1 heard again up to W + 30, asking nothing since W + 20: the
     * part follows, read ten sub-windows behind region 0's counts. */
    rl_demand_note(d, "g", "k", 1, 1, W + 30, 0, 0);
    cr_assert_eq(share(d, 0, W + 30, false), 210 * 1000000ull / 650);
    rl_demand_free(d);
}

Test(demand, old_counts_are_not_noted_and_idle_keys_go)
{
    rl_demand *d = rl_demand_new(2, 2);
    rl_demand_note(d, "g", "k", 1, 0, W + 50, 10, 0);
    /* Out of every span parts are read in: not noted (nor counted in the
     * sub-window whose place in the ring it would take). */
    rl_demand_note(d, "g", "k", 1, 0, W + 9, 1000, 0);
    rl_demand_note(d, "g", "k", 1, 1, W + 50, 10, 0);
    cr_assert_eq(share(d, 0, W + 50, false), RL_WIRE_SHARE_WHOLE / 2);
    /* The table is full at two keys. */
    cr_assert(rl_demand_note(d, "g", "j", 1, 0, W + 50, 1, 0));
    cr_assert_not(rl_demand_note(d, "g", "x", 1, 0, W + 50, 1, 0));
    cr_assert_eq(rl_demand_refused(d), 1);
    cr_assert_eq(rl_demand_keys(d), 2);
    rl_demand_free(d);
}

static uint64_t g_of(void *arg, const char *rule)
{
    (void)arg;
    return strcmp(rule, "g") == 0 ? 500 : 0;
}

Test(demand, a_sweep_forgets_keys_idle_for_two_periods)
{
    rl_demand *d = rl_demand_new(2, 10);
    rl_demand_note(d, "g", "k", 1, 0, W, 10, 0);
    rl_demand_note(d, "gone", "k", 1, 0, W, 10, 0);
    rl_demand_sweep(d, (W + 42) * 500, g_of, NULL);
    cr_assert_eq(rl_demand_keys(d), 1, "the rule removed goes at once");
    rl_demand_sweep(d, (W + 43) * 500, g_of, NULL);
    cr_assert_eq(rl_demand_keys(d), 0);
    rl_demand_free(d);
}
