/*
 * thread_slot.c: slots are handed out under a lock and given back by a
 * thread-specific key's destructor when the thread exits. The lock also
 * orders the last counts of a slot's old owner before the first of its new
 * one, so a counter never has two writers at once.
 *
 * A slot is never given back while the thread lives: a gateway's worker
 * threads keep theirs. In a child after fork() the parent's other threads'
 * slots stay taken (the child just has fewer to hand out).
 */
#include "thread_slot.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
static bool key_made;
static bool taken[RL_THREAD_SLOTS];
_Thread_local unsigned rl_thread_slot_mine = RL_THREAD_SLOT_UNASKED;
atomic_uint rl_thread_slots_used;

/* At thread exit; the value is the slot + 1 (a key's value is never
 * passed to its destructor when NULL). */
static void give_back(void *value)
{
    unsigned slot = (unsigned)((uintptr_t)value - 1);
    pthread_mutex_lock(&lock);
    taken[slot] = false;
    pthread_mutex_unlock(&lock);
    /* Should a later destructor call into librl, it asks anew. */
    rl_thread_slot_mine = RL_THREAD_SLOT_UNASKED;
}

static void make_key(void)
{
    key_made = pthread_key_create(&key, give_back) == 0;
}

static unsigned take(void)
{
    pthread_once(&key_once, make_key);
    unsigned slot = RL_THREAD_SLOT_SHARED;
    pthread_mutex_lock(&lock);
    for (unsigned i = 0; key_made && i < RL_THREAD_SLOTS; i++) {
        if (!taken[i]) {
            taken[i] = true;
            slot = i;
            if (i >= atomic_load_explicit(&rl_thread_slots_used,
                                          memory_order_relaxed))
                atomic_store_explicit(&rl_thread_slots_used, i + 1,
                                      memory_order_release);
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    if (slot != RL_THREAD_SLOT_SHARED
        && pthread_setspecific(key, (void *)(uintptr_t)(slot + 1)) != 0) {
        pthread_mutex_lock(&lock);
        taken[slot] = false;
        pthread_mutex_unlock(&lock);
        slot = RL_THREAD_SLOT_SHARED;
    }
    return slot;
}

unsigned rl_thread_slot_take(void)
{
    rl_thread_slot_mine = take();
    return rl_thread_slot_mine;
}
