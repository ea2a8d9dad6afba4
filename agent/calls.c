/*
 * calls.c: an asymmetric Dekker. A caller stores "I am in", then loads
 * "closing" (or the agent's current rules); the closer (or a reload) stores
 * "closing" (or new rules), then loads every "I am in". One of them must
 * see the other's store, which needs a full barrier on both sides. The
 * caller's side is every check; the other side is once per agent or per
 * reload. So that side pays: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
 * makes every running thread of the process execute a full barrier, and
 * the callers only need the compiler not to reorder their store and load.
 * Where the kernel refuses (old kernels, seccomp filters), the callers
 * count themselves in with a sequentially consistent add instead.
 *
 * Leaving is a release store and the closer's loads acquire it, so
 * whatever a caller did inside happens before the agent (or a retired
 * generation of its rules) is freed.
 */
#define _GNU_SOURCE /* syscall */
#include "calls.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static atomic_bool expedited;

static int membarrier(int cmd)
{
    return (int)syscall(SYS_membarrier, cmd, 0, 0);
}

static void register_process(void)
{
    atomic_store(&expedited,
                 membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0);
}

void rl_calls_setup(void)
{
    pthread_once(&setup_once, register_process);
}

bool rl_calls_enter(rl_calls *c, const atomic_bool *closing)
{
    unsigned slot = rl_thread_slot();
    atomic_uint_least64_t *n = &c->inside[slot].enters;
    if (slot != RL_THREAD_SLOT_SHARED
        && atomic_load_explicit(&expedited, memory_order_relaxed)) {
        atomic_store_explicit(n, atomic_load_explicit(n, memory_order_relaxed)
                                     + 1, memory_order_relaxed);
        /* The other side's membarrier orders this store before the
         * loads that follow. */
        atomic_signal_fence(memory_order_seq_cst);
    } else {
        /* A sequentially consistent read-modify-write: a full barrier of
         * its own. */
        atomic_fetch_add(n, 1);
    }
    if (!atomic_load(closing))
        return true;
    rl_calls_leave(c);
    return false;
}

/* Leaves first: enters only grow, so leaves >= enters read after them
 * means the slot was idle when its leaves were read. */
static bool slot_idle(rl_calls *c, int i)
{
    uint64_t left = atomic_load(&c->inside[i].leaves);
    return left >= atomic_load(&c->inside[i].enters);
}

static bool idle(rl_calls *c)
{
    for (int i = 0; i <= RL_THREAD_SLOTS; i++) {
        if (!slot_idle(c, i))
            return false;
    }
    return true;
}

void rl_calls_wait_idle(rl_calls *c)
{
    /* closing was set by a sequentially consistent exchange. */
    if (atomic_load(&expedited))
        membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    while (!idle(c))
        usleep(1000);
}

void rl_calls_mark_now(rl_calls *c, rl_calls_mark *m)
{
    if (atomic_load(&expedited))
        membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    for (int i = 0; i < RL_THREAD_SLOTS; i++)
        m->enters[i] = atomic_load(&c->inside[i].enters);
    m->enters[RL_THREAD_SLOT_SHARED] = 0;
}

bool rl_calls_passed(rl_calls *c, const rl_calls_mark *m)
{
    for (int i = 0; i < RL_THREAD_SLOTS; i++) {
        if (atomic_load_explicit(&c->inside[i].leaves, memory_order_acquire)
            < m->enters[i])
            return false;
    }
    return slot_idle(c, RL_THREAD_SLOT_SHARED);
}
