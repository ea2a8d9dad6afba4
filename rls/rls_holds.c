/*
 * rls_holds.c: the instance's holds (rls_holds.h). A hash table of
 * entries, each also on a list in the order of its deadline: every
 * entry is kept the same timeout, so the list's order is the order
 * entries were added (or re-added, when an expired hold's key is kept
 * again). Expired entries are swept on each take, a few at a time, so
 * that no call pays for a backlog.
 */
#include "rls_holds.h"

#include "keys.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Buckets of the hash table (a power of two), and entries swept at most
 * per take. */
#define BUCKETS (1u << 17)
#define SWEEP_MAX 64

typedef enum state {
    PENDING, /* in the table, its first call's check out */
    HELD,    /* in the table, its hold open */
    CLOSED,  /* in the table, holding nothing: a stream-done call charges
              * nothing (its first was rejected, or its hold expired) */
    ENDING,  /* out of the table, its check out: ended at actual when it
              * answers */
} state;

struct rls_hold_entry {
    rls_hold_entry *chain;        /* the bucket's next */
    rls_hold_entry *prev, *next;  /* the deadline list */
    state state;
    uint64_t deadline_ms;
    uint32_t estimate, actual;
    rl_hold *hold;
    size_t len;
    char key[];
};

struct rls_holds {
    pthread_mutex_t lock;
    const rl_logger *log;
    size_t max, n;
    uint64_t timeout_ms;
    uint64_t full_logged_ms;      /* when "full" was last logged */
    rls_hold_entry *head, *tail;  /* the deadline list, soonest first */
    rls_hold_entry *buckets[BUCKETS];
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

rls_holds *rls_holds_new(size_t max, uint64_t timeout_ms,
                         const rl_logger *log)
{
    rls_holds *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    pthread_mutex_init(&t->lock, NULL);
    t->log = log;
    t->max = max;
    t->timeout_ms = timeout_ms;
    return t;
}

static rls_hold_entry **bucket(rls_holds *t, const char *key, size_t len)
{
    return &t->buckets[rl_key_hash_value(key, len) & (BUCKETS - 1)];
}

static rls_hold_entry *find(rls_holds *t, const char *key, size_t len)
{
    for (rls_hold_entry *e = *bucket(t, key, len); e != NULL; e = e->chain) {
        if (e->len == len && memcmp(e->key, key, len) == 0)
            return e;
    }
    return NULL;
}

static void append(rls_holds *t, rls_hold_entry *e, uint64_t now)
{
    e->deadline_ms = now + t->timeout_ms;
    e->next = NULL;
    e->prev = t->tail;
    if (t->tail != NULL)
        t->tail->next = e;
    else
        t->head = e;
    t->tail = e;
}

static void unlist(rls_holds *t, rls_hold_entry *e)
{
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        t->head = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    else
        t->tail = e->prev;
}

/* Takes e out of the table and the list; the caller frees it (or leaves
 * it ENDING for its check's answer). */
static void detach(rls_holds *t, rls_hold_entry *e)
{
    rls_hold_entry **p = bucket(t, e->key, e->len);
    while (*p != e)
        p = &(*p)->chain;
    *p = e->chain;
    unlist(t, e);
    t->n--;
}

/* Holds to end once the lock is let go: rl_hold_end never waits, but
 * takes the agent's own locks. */
typedef struct to_end {
    rl_hold *holds[SWEEP_MAX + 1];
    uint32_t actual[SWEEP_MAX + 1];
    int n;
} to_end;

static void end_later(to_end *te, rl_hold *hold, uint32_t actual)
{
    te->holds[te->n] = hold;
    te->actual[te->n++] = actual;
}

static void end_now(to_end *te)
{
    for (int i = 0; i < te->n; i++)
        rl_hold_end(te->holds[i], te->actual[i]);
}

/* Entries past their deadline, SWEEP_MAX at most: a hold is ended at its
 * estimate and its key kept as long again (CLOSED); a CLOSED key is let
 * go; a check that has not answered in all that time ends its hold at
 * the estimate when it does. */
static void sweep(rls_holds *t, uint64_t now, to_end *te)
{
    for (int i = 0; i < SWEEP_MAX && t->head != NULL
                    && t->head->deadline_ms <= now; i++) {
        rls_hold_entry *e = t->head;
        if (e->state == HELD) {
            end_later(te, e->hold, e->estimate);
            e->hold = NULL;
            e->state = CLOSED;
            unlist(t, e);
            append(t, e, now);
        } else if (e->state == CLOSED) {
            detach(t, e);
            free(e);
        } else {
            detach(t, e);
            e->actual = e->estimate;
            e->state = ENDING;
        }
    }
}

static void log_full(rls_holds *t, uint64_t now)
{
    if (t->full_logged_ms != 0 && now - t->full_logged_ms < 1000)
        return;
    t->full_logged_ms = now;
    rl_log(t->log, RL_LOG_WARN, "rls_holds_full",
           "holds=%zu timeout_ms=%llu what=\"a descriptor with a hold was "
           "decided by its on_error\"", t->n,
           (unsigned long long)t->timeout_ms);
}

/* The key's stream-done call, under the lock: e ends at actual. */
static void end_entry(rls_holds *t, rls_hold_entry *e, uint32_t actual,
                      to_end *te)
{
    detach(t, e);
    if (e->state == PENDING) {
        e->actual = actual;
        e->state = ENDING;
        return;
    }
    if (e->state == HELD)
        end_later(te, e->hold, actual);
    free(e);
}

rls_holds_taken rls_holds_take(rls_holds *t, const char *key, size_t len,
                               uint32_t estimate, uint32_t actual,
                               rls_hold_entry **opened)
{
    to_end te = {.n = 0};
    rls_holds_taken taken = RLS_HOLDS_OPENED;
    uint64_t now = now_ms();
    pthread_mutex_lock(&t->lock);
    sweep(t, now, &te);
    rls_hold_entry *e = find(t, key, len);
    if (e != NULL) {
        end_entry(t, e, actual, &te);
        taken = RLS_HOLDS_ENDED;
    } else if (t->n >= t->max
               || (e = malloc(sizeof *e + len)) == NULL) {
        log_full(t, now);
        taken = RLS_HOLDS_FULL;
    } else {
        *e = (rls_hold_entry){.state = PENDING, .estimate = estimate,
                              .len = len};
        memcpy(e->key, key, len);
        rls_hold_entry **b = bucket(t, key, len);
        e->chain = *b;
        *b = e;
        append(t, e, now);
        t->n++;
        *opened = e;
    }
    pthread_mutex_unlock(&t->lock);
    end_now(&te);
    return taken;
}

void rls_holds_decided(rls_holds *t, rls_hold_entry *e, rl_hold *hold)
{
    pthread_mutex_lock(&t->lock);
    bool ending = e->state == ENDING;
    if (!ending) {
        e->hold = hold;
        e->state = hold != NULL ? HELD : CLOSED;
    }
    pthread_mutex_unlock(&t->lock);
    if (!ending)
        return;
    if (hold != NULL)
        rl_hold_end(hold, e->actual);
    free(e);
}

void rls_holds_free(rls_holds *t)
{
    if (t == NULL)
        return;
    for (rls_hold_entry *e = t->head, *next; e != NULL; e = next) {
        next = e->next;
        if (e->state == HELD)
            rl_hold_end(e->hold, e->estimate);
        free(e);
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}
