/*
 * bucket.h: one call of the bucket script through the store, and its
 * answer; the answer's arithmetic is shared with mode: local. Private to
 * librl; calls run on the I/O thread.
 */
#ifndef RL_AGENT_BUCKET_H
#define RL_AGENT_BUCKET_H

#include "config.h"
#include "store.h"

#include <stdint.h>

/* A bucket script's answer. */
typedef struct rl_bucket_reply {
    bool allowed;
    uint64_t remaining; /* whole tokens left */
    int64_t retry_ms;   /* 0 when allowed, -1 when the cost can never pass */
    uint64_t reset_ms;  /* until the bucket is full */
} rl_bucket_reply;

/* The fixed arguments of a rule's calls at one rate, formatted once: the
 * rule's own rate at open, an override's when a request needs it. The
 * reply is read against the same rate, so the numbers Redis was sent and
 * the arithmetic on its answer always agree. */
typedef struct rl_bucket_args {
    const rl_rule *rule;
    rl_limit rate;
    /* The rule has nothing of issue 15's per-request work: one attribute,
     * no when, no overrides, not in shadow. Its checks take the path they
     * took before, past this one flag test. */
    bool plain;
    /* Not plain only for its values overrides: one attribute, no when, no
     * `when` overrides, not in shadow. Its checks look the value up in the
     * map and otherwise take the plain path (check.c). */
    bool by_value;
    char burst[24];
    char limit[24];
    char period[24];
} rl_bucket_args;

/* Called exactly once per rl_bucket_call: with the answer, or with reply
 * NULL and the reason the store did not give one. */
typedef void (*rl_bucket_fn)(void *arg, const rl_bucket_reply *reply,
                             const char *error);

/* The rule's own rate (and its plain flag). */
void rl_bucket_args_init(rl_bucket_args *args, const rl_rule *rule);
/* The same for rate, an override's (plain and by_value are false). */
void rl_bucket_args_rate(rl_bucket_args *args, const rl_rule *rule,
                         const rl_limit *rate);

/* rl_bucket_answer fills out for a bucket at rate that is missing units
 * (1/period_ms tokens) of full after a call of cost, allowed or not. */
void rl_bucket_answer(const rl_limit *rate, uint64_t missing, bool allowed,
                      int64_t cost, rl_bucket_reply *out);

/* What a bucket call keeps until it is answered. The rate is a copy: an
 * override's args may live in a request that is gone when a late reply
 * comes. */
typedef struct rl_bucket_pending {
    rl_bucket_fn fn;
    void *arg;
    rl_limit rate;
    int64_t cost;
    bool owned; /* rl_bucket_call's own block, freed once answered */
    /* A fixed window's call (window.h): the window charged, and when by
     * the store's clock. */
    uint64_t window;
    uint64_t at_ms;
    bool slot; /* an in_flight item of a multi call */
} rl_bucket_pending;

/* rl_bucket_call spends cost tokens of key (a negative cost gives them
 * back) and reports the answer to fn. */
void rl_bucket_call(rl_store *store, const rl_bucket_args *args,
                    const char *key, size_t key_len, int64_t cost,
                    rl_bucket_fn fn, void *arg);

/* The same in the caller's storage p, which must stay until fn has run
 * (a request's rule state: a check's call allocates nothing here). */
void rl_bucket_call_in(rl_store *store, rl_bucket_pending *p,
                       const rl_bucket_args *args, const char *key,
                       size_t key_len, int64_t cost, rl_bucket_fn fn,
                       void *arg);

/* rl_bucket_commit takes a hold's difference delta from key's bucket
 * (a negative one gives tokens back, never above capacity): taken whole,
 * into debt past empty (scripts.c). fn(arg, ...) gets the store's answer
 * (the bucket's d, not needed) or why there is none. */
void rl_bucket_commit(rl_store *store, const rl_bucket_args *args,
                      const char *key, size_t key_len, int64_t delta,
                      rl_store_fn fn, void *arg);

/* How a multi call (several buckets of one shard in one function call,
 * scripts.c) charges them: the letter the function reads. */
typedef enum rl_multi_mode {
    RL_MULTI_EACH = 'c',         /* each as if alone (charge: all, refund) */
    RL_MULTI_FIRST_REJECT = 'f', /* in order, to the first rejection */
    RL_MULTI_ATOMIC = 'a',       /* all of them, or none */
} rl_multi_mode;

/* One bucket of a multi call: its arguments, its key, and whether its
 * rejection counts (false for a shadow rule). An in_flight rule's item
 * names the agent's slots instead (slot_id non-NULL: the agent's id, and
 * lease its in_flight_lease_ms as text): take holds a slot when one is
 * free; without it the call only says whether one is. Its answer's
 * remaining is the slots free after the call. */
typedef struct rl_bucket_item {
    const rl_bucket_args *args;
    const char *key;
    size_t key_len;
    bool enforced;
    const char *slot_id;
    const char *lease;
    bool take;
} rl_bucket_item;

/* Called exactly once per rl_bucket_multi: with n answers in the items'
 * order (fewer than the items when RL_MULTI_FIRST_REJECT stopped; the
 * last is then an enforced rejection), or with replies NULL and the
 * reason. With RL_MULTI_ATOMIC, if an enforced item rejected, no bucket
 * was charged: the allowing ones answer as they stand. */
typedef void (*rl_multi_fn)(void *arg, const rl_bucket_reply *replies,
                            int n, const char *error);

/* rl_bucket_multi spends cost tokens of each of n items (at most
 * RL_RULES_MAX, all in one cluster slot) in one call, charged by mode. */
void rl_bucket_multi(rl_store *store, rl_multi_mode mode,
                     const rl_bucket_item *items, int n, int64_t cost,
                     rl_multi_fn fn, void *arg);

/* The bucket script, for rl_store_new. */
extern const rl_script_set rl_bucket_scripts;

#endif
