/*
 * A synced key's fresh share, from its totals and what this agent counted:
 * mark = acked + room / agents, where acked counts as held by the TOTALS
 * snapshot only if the last ack predates it. The fleets are
 * tests/integration/test_synced_accuracy.c; this is the rule those depend
 * on when an agent is slow enough to hear a snapshot late.
 */
#include "synced.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <string.h>

typedef struct one_key {
    rl_config cfg;
    rl_calls calls;
    rl_synced s;
    rl_rule rule;
    rl_ident *idents, *id;
    rl_synced_entry *e;
    uint64_t window;
} one_key;

/* One agent (its share is the whole room), one key of 100 per 2 s, the
 * totals at 30 and the agent's own count at 30, 10 of it acked before. */
static void one_key_open(one_key *k)
{
    memset(k, 0, sizeof *k);
    k->cfg.aggregator.max_keys = 16;
    k->cfg.aggregator.sync_interval_ms = 100;
    cr_assert_eq(rl_synced_init(&k->s, &k->cfg, &k->calls), RL_OK);
    k->rule = (rl_rule){.limit = 100, .period_ms = 2000, .burst = 100,
                        .mode = RL_MODE_SYNCED};
    strcpy(k->rule.name, "share");
    k->id = rl_idents_take(&k->idents, &k->rule);
    cr_assert_not_null(k->id);
    k->id->io_rule = &k->rule;
    atomic_store(&k->id->agents, 1);
    rl_bucket_reply reply;
    rl_synced_verdict verdict;
    for (int i = 0; i < 30; i++)
        cr_assert_eq(rl_synced_check(&k->s, &k->rule, k->id, &k->rule.own,
                                     "v", 1, 1, &reply, &verdict), RL_OK);
    uint64_t now = 1000000;
    rl_synced_set_time(&k->s, now, 0);
    k->e = rl_synced_find(&k->s, k->id, "v", 1);
    cr_assert_not_null(k->e);
    k->window = now / rl_wire_subwindow_ms(k->rule.period_ms);
    rl_synced_note_totals(&k->s, k->e, k->window, now, 30, 0);
    k->e->acked_prior = 10;
    k->e->acked = 30;
    k->e->acked_ms = now - 50;
}

static void one_key_close(one_key *k)
{
    rl_synced_fini(&k->s);
    rl_idents_sweep(&k->idents, true);
}

static uint64_t mark(const one_key *k)
{
    return atomic_load(&k->e->mark);
}

Test(synced_share, a_snapshot_after_the_ack_holds_the_acked_count)
{
    one_key k;
    one_key_open(&k);
    k.e->snap_ms = k.e->acked_ms + 20;
    rl_synced_rebalance(&k.s, k.e, 0, true);
    cr_assert_eq(mark(&k), 30 + 70, "acked 30 + the room of 70");
    one_key_close(&k);
}

/* The ack came after the snapshot was taken: its 20 are not in the totals
 * of 30, so they come out of this agent's share (else they would be let
 * through again by the fleet's other shares). */
Test(synced_share, a_snapshot_older_than_the_ack_does_not)
{
    one_key k;
    one_key_open(&k);
    k.e->snap_ms = k.e->acked_ms - 20;
    rl_synced_rebalance(&k.s, k.e, 0, true);
    cr_assert_eq(mark(&k), 10 + 70, "the acked count before that ack");
    /* An ack's own totals hold its report: lowering from them counts it. */
    rl_synced_note_totals(&k.s, k.e, k.window, 1000000, 60, 0);
    rl_synced_rebalance(&k.s, k.e, 0, false);
    cr_assert_eq(mark(&k), 30 + 40);
    one_key_close(&k);
}

/* At a sub-window edge inside an interval, the room the totals' oldest
 * sub-window gives back as it leaves the span comes on top of the mark as
 * it is (an ack's totals may have lowered it): this agent's share of it,
 * once, and nothing while no other sub-window of the totals leaves. */
Test(synced_share, an_edge_adds_the_room_the_oldest_sub_window_frees)
{
    one_key k;
    one_key_open(&k);
    uint64_t g = rl_wire_subwindow_ms(k.rule.period_ms);
    rl_synced_note_totals(&k.s, k.e, k.window, 1000000, 30, 20);
    k.e->snap_ms = k.e->acked_ms + 20;
    rl_synced_rebalance(&k.s, k.e, 0, true);
    cr_assert_eq(mark(&k), 30 + 50, "acked 30 + the room of 100 - 50");
    rl_synced_note_totals(&k.s, k.e, k.window, 1000000, 40, 20);
    rl_synced_rebalance(&k.s, k.e, 0, false);
    cr_assert_eq(mark(&k), 30 + 40, "an ack's totals lowered it");
    rl_synced_edge(&k.s, k.e, g);
    cr_assert_eq(mark(&k), 30 + 40 + 20, "the oldest's 20 on top");
    cr_assert_eq(atomic_load(&k.e->room), 60);
    rl_synced_edge(&k.s, k.e, g + 1);
    rl_synced_edge(&k.s, k.e, 2 * g);
    cr_assert_eq(mark(&k), 30 + 60, "given once; the recent ones stay");
    one_key_close(&k);
}

/* Totals of 30 recent and 20 oldest from the message of 1000000 ms,
 * LEAVING's 10 and 5 after the oldest from the message of leaving_ms,
 * then, if acked_recent, an ack's totals of the same sub-window with that
 * recent; and the fresh share. */
static void share_with_leaving(one_key *k, uint64_t leaving_ms,
                               uint64_t acked_recent)
{
    static const uint64_t leaving[] = {10, 5};
    rl_synced_note_totals(&k->s, k->e, k->window, 1000000, 30, 20);
    rl_synced_note_leaving(k->e, k->window, leaving_ms, leaving, 2);
    if (acked_recent > 0)
        rl_synced_note_totals(&k->s, k->e, k->window, 1000040, acked_recent,
                              20);
    k->e->snap_ms = k->e->acked_ms + 20;
    rl_synced_rebalance(&k->s, k->e, 0, true);
}

/* An interval of several sub-windows: the totals' oldest leaves at the
 * first edge, and the sub-windows after it, which recent holds, at the
 * edges after; LEAVING (wire.h) says what each holds, so each edge gives
 * back its own, once, before the next totals come. */
Test(synced_share, edges_after_the_first_free_what_leaving_named)
{
    one_key k;
    one_key_open(&k);
    uint64_t g = rl_wire_subwindow_ms(k.rule.period_ms);
    share_with_leaving(&k, 1000000, 0);
    cr_assert_eq(mark(&k), 30 + 50, "acked 30 + the room of 100 - 50");
    rl_synced_edge(&k.s, k.e, g);
    cr_assert_eq(mark(&k), 30 + 70, "the oldest's 20 at the first edge");
    rl_synced_edge(&k.s, k.e, 2 * g);
    cr_assert_eq(mark(&k), 30 + 80, "the next one's 10 at the second");
    rl_synced_edge(&k.s, k.e, 3 * g);
    cr_assert_eq(mark(&k), 30 + 85, "and 5 at the third");
    cr_assert_eq(atomic_load(&k.e->room), 85);
    rl_synced_edge(&k.s, k.e, 4 * g);
    cr_assert_eq(mark(&k), 30 + 85, "nothing LEAVING did not name");
    one_key_close(&k);
}

/* Counts read with another recent than the one held may be more than it
 * holds of those sub-windows (a give-back since): another message's
 * LEAVING is not taken, and an ack's newer totals drop those taken; an
 * equal recent is as good as the message's own. */
Test(synced_share, leaving_counts_only_with_the_recent_they_came_with)
{
    one_key k;
    one_key_open(&k);
    uint64_t g = rl_wire_subwindow_ms(k.rule.period_ms);
    share_with_leaving(&k, 1000001, 0);
    rl_synced_edge(&k.s, k.e, g);
    rl_synced_edge(&k.s, k.e, 2 * g);
    cr_assert_eq(mark(&k), 30 + 70, "another message's counts were taken");
    one_key_close(&k);

    one_key_open(&k);
    share_with_leaving(&k, 1000000, 35);
    cr_assert_eq(mark(&k), 30 + 45);
    rl_synced_edge(&k.s, k.e, g);
    rl_synced_edge(&k.s, k.e, 2 * g);
    cr_assert_eq(mark(&k), 30 + 65, "counts read with another recent");
    one_key_close(&k);

    /* An ack's totals, then a TOTALS message's equal recent: that is the
     * message's recent too, and its LEAVING is taken. */
    one_key_open(&k);
    static const uint64_t leaving[] = {10, 5};
    rl_synced_note_totals(&k.s, k.e, k.window, 1000040, 40, 20);
    rl_synced_note_totals(&k.s, k.e, k.window, 1000050, 40, 20);
    rl_synced_note_leaving(k.e, k.window, 1000050, leaving, 2);
    k.e->snap_ms = k.e->acked_ms + 20;
    rl_synced_rebalance(&k.s, k.e, 0, true);
    cr_assert_eq(mark(&k), 30 + 40);
    rl_synced_edge(&k.s, k.e, g);
    rl_synced_edge(&k.s, k.e, 2 * g);
    cr_assert_eq(mark(&k), 30 + 70, "an equal recent's counts");
    one_key_close(&k);
}
