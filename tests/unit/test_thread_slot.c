/*
 * Thread slots: live threads never share a slot, threads beyond the slots
 * share the shared one, and a slot comes back when its thread exits. Then
 * counting through slots and the shared counter loses nothing: many more
 * threads than slots on one synced key count every check exactly once.
 */
#include "agent_impl.h"
#include "rl.h"
#include "thread_slot.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define THREADS (RL_THREAD_SLOTS + 9)

typedef struct batch {
    pthread_barrier_t all_in;
    unsigned slots[THREADS];
    int next;
    pthread_mutex_t lock;
} batch;

/* Takes a slot, and holds it until every thread of the batch has one. */
static void *take(void *arg)
{
    batch *b = arg;
    unsigned slot = rl_thread_slot();
    cr_assert_eq(slot, rl_thread_slot(), "a thread's slot changed");
    pthread_mutex_lock(&b->lock);
    b->slots[b->next++] = slot;
    pthread_mutex_unlock(&b->lock);
    pthread_barrier_wait(&b->all_in);
    return NULL;
}

/* Runs a batch of THREADS live at once; returns how many had own slots. */
static int run_batch(void)
{
    batch b = {.next = 0};
    pthread_barrier_init(&b.all_in, NULL, THREADS);
    pthread_mutex_init(&b.lock, NULL);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, take, &b);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    bool seen[RL_THREAD_SLOTS] = {false};
    int own = 0;
    for (int i = 0; i < THREADS; i++) {
        unsigned s = b.slots[i];
        cr_assert_leq(s, RL_THREAD_SLOT_SHARED);
        if (s == RL_THREAD_SLOT_SHARED)
            continue;
        cr_assert(!seen[s], "two live threads were given slot %u", s);
        seen[s] = true;
        own++;
    }
    pthread_barrier_destroy(&b.all_in);
    pthread_mutex_destroy(&b.lock);
    return own;
}

Test(thread_slot, live_threads_never_share_and_exited_ones_give_back)
{
    unsigned main_slot = rl_thread_slot();
    cr_assert_neq(main_slot, RL_THREAD_SLOT_SHARED);
    int first = run_batch();
    /* Every slot but the ones held elsewhere (this thread's at least). */
    cr_assert_geq(first, 1);
    cr_assert_lt(first, RL_THREAD_SLOTS, "the shared slot was not used");
    /* The batch's threads exited: their slots are free again. */
    cr_assert_eq(run_batch(), first, "slots were not given back");
    cr_assert_eq(rl_thread_slot(), main_slot);
}

#define CHECKS 5000

static void *check_many(void *arg)
{
    rl_agent *a = arg;
    rl_attr attr = {"tenant", "org_many", 8};
    for (int i = 0; i < CHECKS; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
        cr_assert(d.allowed);
    }
    return NULL;
}

Test(thread_slot, many_more_threads_than_slots_count_every_check)
{
    /* Nothing listens at the aggregator's address: synced rules are
     * decided locally all the same. */
    static const char yaml[] =
        "store: {url: \"redis://127.0.0.1:1\"}\n"
        "aggregator: {reports: \"tcp://127.0.0.1:1\", "
        "totals: \"tcp://127.0.0.1:2\"}\n"
        "rules:\n  - {name: per-tenant, match: tenant, "
        "limit: 1000000000, period: 1m, mode: synced}\n";
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "slots.yaml", &cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, check_many, a);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    rl_agent_counters c;
    rl_rule_counters r[1];
    cr_assert_eq(rl_agent_stats(a, &c, r, 1), RL_OK);
    cr_assert_eq(c.allowed, (uint64_t)THREADS * CHECKS, "allowed %llu",
                 (unsigned long long)c.allowed);
    cr_assert_eq(r[0].allowed, (uint64_t)THREADS * CHECKS);
    /* The key's own count, which the reports to the aggregator carry. */
    rl_synced_entry *e = rl_synced_find(&a->synced,
                                        atomic_load(&a->gen)->idents[0],
                                        "org_many", 8);
    cr_assert_not_null(e);
    cr_assert_eq(rl_synced_counted(e), (uint64_t)THREADS * CHECKS);
    rl_agent_close(a);
    rl_config_free(cfg);
}
