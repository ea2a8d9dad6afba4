/*
 * A synced key's totals across a change of its rule's period: the
 * sub-windows they are numbered in are the period's (wire.h), so totals
 * numbered in another period are not taken, and the totals a key holds
 * are renumbered when its period changes here, to the sub-window of their
 * span's end (not past now's): as late as their requests may have been.
 * The fleets that rely on it are tests/integration/test_aggregator_reload.c
 * (synced_reload).
 */
#include "synced.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <string.h>

typedef struct period_key {
    rl_config cfg;
    rl_calls calls;
    rl_synced s;
    rl_rule rule;
    rl_ident *idents, *id;
    rl_synced_entry *e;
} period_key;

/* One agent, one key of 100 per period_ms, 30 counted; Redis's clock at
 * now. */
static void key_open(period_key *k, uint64_t period_ms, uint64_t now)
{
    memset(k, 0, sizeof *k);
    k->cfg.aggregator.max_keys = 16;
    k->cfg.aggregator.sync_interval_ms = 100;
    cr_assert_eq(rl_synced_init(&k->s, &k->cfg, &k->calls), RL_OK);
    k->rule = (rl_rule){.limit = 100, .period_ms = period_ms, .burst = 100,
                        .mode = RL_MODE_SYNCED};
    strcpy(k->rule.name, "periods");
    k->id = rl_idents_take(&k->idents, &k->rule);
    cr_assert_not_null(k->id);
    k->id->io_rule = &k->rule;
    atomic_store(&k->id->agents, 1);
    rl_bucket_reply reply;
    rl_synced_verdict verdict;
    for (int i = 0; i < 30; i++)
        cr_assert_eq(rl_synced_check(&k->s, &k->rule, k->id, &k->rule.own,
                                     "v", 1, 1, &reply, &verdict), RL_OK);
    rl_synced_set_time(&k->s, now, 0);
    k->e = rl_synced_find(&k->s, k->id, "v", 1);
    cr_assert_not_null(k->e);
}

static void key_close(period_key *k)
{
    rl_synced_fini(&k->s);
    rl_idents_sweep(&k->idents, true);
}

static uint64_t g_of(uint64_t period_ms)
{
    return rl_wire_subwindow_ms(period_ms);
}

/* An aggregator a reload gave 4 s while this agent has 1 s: its window
 * numbers (now / 200) are a quarter of this agent's (now / 50). Taken,
 * they would be read as totals of long ago. Its own, and those a few
 * sub-windows old (noted during an interval), are taken. */
Test(synced_periods, totals_of_another_period_are_not_taken)
{
    enum { NOW = 1000000 };
    period_key k;
    key_open(&k, 1000, NOW);
    cr_assert_not(rl_synced_note_totals(&k.s, k.e, NOW / g_of(4000), NOW, 30,
                                        0));
    cr_assert_eq(k.e->window, 0, "totals of another period were noted");
    cr_assert_not(rl_synced_note_totals(&k.s, k.e, NOW / g_of(250), NOW, 30,
                                        0));
    cr_assert(rl_synced_note_totals(&k.s, k.e, NOW / g_of(1000) - 3, NOW, 30,
                                    0));
    cr_assert(rl_synced_note_totals(&k.s, k.e, NOW / g_of(1000), NOW, 30, 0));
    cr_assert_eq(k.e->window, NOW / g_of(1000));
    key_close(&k);
}

/* 1 s -> 4 s: totals read in sub-window W of 50 ms become the 200 ms
 * sub-window of W's end, their oldest counted with the rest (it may have
 * been made as late as W - N's end, which the longer period still holds):
 * the key's room stays the limit less all 50. */
Test(synced_periods, a_longer_period_renumbers_the_totals_to_their_end)
{
    enum { NOW = 1000190 };
    period_key k;
    key_open(&k, 1000, NOW);
    uint64_t w = NOW / g_of(1000);
    cr_assert(rl_synced_note_totals(&k.s, k.e, w, NOW, 40, 10));
    k.e->acked = k.e->acked_prior = 30;
    k.rule.period_ms = 4000;
    rl_synced_rebalance(&k.s, k.e, 0, true);
    cr_assert_eq(k.e->window, ((w + 1) * g_of(1000) - 1) / g_of(4000));
    cr_assert_eq(k.e->current, 50);
    cr_assert_eq(k.e->previous, 0);
    cr_assert_eq(atomic_load(&k.e->mark), 30 + 50, "acked + the room left");
    /* The aggregator's totals of the new period are taken. */
    cr_assert(rl_synced_note_totals(&k.s, k.e, NOW / g_of(4000), NOW, 50,
                                    0));
    key_close(&k);
}

/* 4 s -> 1 s: totals of a 200 ms sub-window become the 50 ms one its end
 * falls in, so they stay in the new span until a period after it: at
 * 1,000,150 ms the sub-window 5000 (1,000,000 to 1,000,199) ends in 20003,
 * now's. One whose end is after now becomes now's. */
Test(synced_periods, a_shorter_period_renumbers_the_totals_to_their_end)
{
    enum { NOW = 1000150 };
    period_key k;
    key_open(&k, 4000, NOW);
    cr_assert(rl_synced_note_totals(&k.s, k.e, NOW / g_of(4000), NOW, 50,
                                    0));
    k.rule.period_ms = 1000;
    rl_synced_rebalance(&k.s, k.e, 0, true);
    cr_assert_eq(k.e->window, 20003);
    cr_assert_eq(k.e->current, 50);
    key_close(&k);

    key_open(&k, 4000, 1000010);
    cr_assert(rl_synced_note_totals(&k.s, k.e, 5000, 1000010, 50, 0));
    k.rule.period_ms = 1000;
    rl_synced_rebalance(&k.s, k.e, 0, true);
    cr_assert_eq(k.e->window, 1000010 / g_of(1000), "not past now's");
    key_close(&k);
}
