/*
 * rl_calls, the grace period of a reload: a mark holds until every call
 * begun before it has left, on a thread's own slot and on the shared one;
 * calls begun after it do not hold it.
 */
#include "calls.h"
#include "thread_slot.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <semaphore.h>

static rl_calls calls;
static atomic_bool closing;

typedef struct caller {
    sem_t inside, may_leave;
    unsigned slot;
} caller;

/* Enters, says so, leaves when told. */
static void *call(void *arg)
{
    caller *c = arg;
    c->slot = rl_thread_slot();
    rl_calls_enter(&calls, &closing);
    sem_post(&c->inside);
    sem_wait(&c->may_leave);
    rl_calls_leave(&calls);
    return NULL;
}

static void start(caller *c, pthread_t *t)
{
    sem_init(&c->inside, 0, 0);
    sem_init(&c->may_leave, 0, 0);
    pthread_create(t, NULL, call, c);
    sem_wait(&c->inside);
}

Test(calls, a_call_begun_before_the_mark_holds_it)
{
    rl_calls_setup();
    caller before, after;
    pthread_t tb, ta;
    start(&before, &tb);
    cr_assert_neq(before.slot, RL_THREAD_SLOT_SHARED);
    rl_calls_mark m;
    rl_calls_mark_now(&calls, &m);
    cr_assert_not(rl_calls_passed(&calls, &m), "a call still inside was "
                  "taken for gone");
    start(&after, &ta);
    sem_post(&before.may_leave);
    pthread_join(tb, NULL);
    /* The call begun after the mark is still inside: it read the new
     * value, and does not hold the mark. */
    cr_assert(rl_calls_passed(&calls, &m));
    sem_post(&after.may_leave);
    pthread_join(ta, NULL);
    cr_assert(rl_calls_passed(&calls, &m));
}

static pthread_barrier_t hold;

static void *hold_a_slot(void *arg)
{
    (void)arg;
    rl_thread_slot();
    pthread_barrier_wait(&hold);
    pthread_barrier_wait(&hold);
    return NULL;
}

Test(calls, the_shared_slot_holds_the_mark_while_a_call_is_inside)
{
    rl_calls_setup();
    rl_thread_slot(); /* this thread's own slot */
    pthread_barrier_init(&hold, NULL, RL_THREAD_SLOTS);
    pthread_t t[RL_THREAD_SLOTS - 1];
    for (int i = 0; i < RL_THREAD_SLOTS - 1; i++)
        pthread_create(&t[i], NULL, hold_a_slot, NULL);
    pthread_barrier_wait(&hold); /* every slot taken */
    caller shared;
    pthread_t ts;
    start(&shared, &ts);
    cr_assert_eq(shared.slot, RL_THREAD_SLOT_SHARED);
    rl_calls_mark m;
    rl_calls_mark_now(&calls, &m);
    cr_assert_not(rl_calls_passed(&calls, &m), "a call inside on the "
                  "shared slot was taken for gone");
    sem_post(&shared.may_leave);
    pthread_join(ts, NULL);
    cr_assert(rl_calls_passed(&calls, &m));
    pthread_barrier_wait(&hold);
    for (int i = 0; i < RL_THREAD_SLOTS - 1; i++)
        pthread_join(t[i], NULL);
}
