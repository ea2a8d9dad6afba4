/*
 * rlctl_view.h: what a rule holds for one value, read from the store
 * without changing it: an exact rule's bucket (tokens now, time to full,
 * TTL) or fixed window (its count, time to its end), a synced rule's
 * window counts, an in_flight rule's slots and the agents holding them.
 * Private to rlctl.
 */
#ifndef RL_RLCTL_VIEW_H
#define RL_RLCTL_VIEW_H

#include "config.h"
#include "rlctl_store.h"

#include <stdbool.h>
#include <stdint.h>

/* Agents an in_flight view names at most; it counts them all. */
#define RLCTL_HOLDERS_MAX 32

/* One agent's field of an in_flight hash: its id (rlctl agents names it
 * alike), the slots it holds and until when (expired: a dead agent's,
 * free already and dropped at the next take). */
typedef struct rlctl_holder {
    char agent[72];
    uint64_t slots;
    long long expires_in_ms; /* <= 0: expired */
} rlctl_holder;

typedef struct rlctl_view {
    const rl_rule *rule;
    char key[RL_KEY_MAX + 32];   /* the bucket, or the sub-windows' hash */
    char previous_key[RL_KEY_MAX + 32]; /* unused: "" */
    bool exists;
    char state[96];              /* the raw value (synced: the current
                                  * sub-window's count), "" if none */
    long long ttl_ms;            /* -2: no key, -1: no expiry */
    /* exact */
    uint64_t level;              /* tokens x period_ms, now */
    uint64_t tokens;             /* whole tokens now (a fixed window: the
                                  * limit less its count) */
    uint64_t full_in_ms;         /* synced: until the sub-window ends; a
                                  * fixed window: until it ends */
    /* synced (wire.h): the sub-window, recent (w-N+1..w), oldest (w-N),
     * their sum; a fixed window: its number, its count in current */
    uint64_t window, current, previous, estimate;
    /* in_flight: slots held by live fields, and the fields (the first
     * RLCTL_HOLDERS_MAX of n_agents) */
    uint64_t held;
    rlctl_holder holders[RLCTL_HOLDERS_MAX];
    size_t n_holders, n_agents;
} rlctl_view;

/* Reads the view of (rule, value) at Redis time now_ms; tag is the value
 * of the rule's hash_tag attribute when it co-locates its keys (NULL:
 * the untagged key). Local rules have nothing in the store: returns -1
 * with a message, as on a store error. */
int rlctl_view_read(rlctl_store *s, const rl_rule *rule, const char *tag,
                    const char *value, unsigned long long now_ms,
                    rlctl_view *out, char *err, size_t errlen);

/* Whether a request of cost would pass, and if not in how many ms (-1:
 * never), as the scripts and the agent would decide. */
bool rlctl_view_allows(const rlctl_view *v, uint32_t cost,
                       long long *retry_ms);

/* Deletes what the view read (the bucket, or the sub-windows' hash); returns the
 * number of keys removed, or -1 with a message. */
long long rlctl_view_forget(rlctl_store *s, const rlctl_view *v, char *err,
                            size_t errlen);

#endif
