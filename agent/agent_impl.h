/*
 * agent_impl.h: the agent and a check in flight, shared by the files of the
 * agent. Private to librl.
 *
 * Threads: a gateway thread builds a request (check.c) and hands it to the
 * I/O thread through the submission queue; from then on only the I/O thread
 * (agent.c, exact.c) touches its rule states. The decision goes back through
 * a semaphore (rl_check) or a callback (rl_check_async).
 */
#ifndef RL_AGENT_IMPL_H
#define RL_AGENT_IMPL_H

#include "config.h"
#include "log.h"
#include "agent_id.h"
#include "bucket.h"
#include "calls.h"
#include "fallback.h"
#include "gen.h"
#include "hold.h"
#include "ident.h"
#include "in_flight.h"
#include "leased.h"
#include "local.h"
#include "redis_tls.h"
#include "stats.h"
#include "store.h"
#include "sync.h"
#include "synced.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <sys/types.h>
#include <uv.h>

/* How one rule of a request came out. */
typedef enum rl_outcome {
    RL_OUTCOME_PENDING,  /* no answer yet */
    RL_OUTCOME_ANSWERED, /* the bucket script answered */
    RL_OUTCOME_FAILED,   /* the store did not answer: on_error decides */
    RL_OUTCOME_SKIPPED,  /* not checked (charge: first_reject) */
} rl_outcome;

typedef struct rl_request rl_request;

typedef struct rl_rule_state {
    rl_request *req;
    const rl_rule *rule;        /* set by the caller, then read-only */
    const rl_bucket_args *args; /* likewise: at the rate that applies */
    /* Likewise: the override whose rate applies (NULL: the rule's own)
     * and that rate (NULL also means the rule's own). */
    const rl_override *override;
    const rl_limit *rate;
    bool shadow;                /* likewise: charged, never decides */
    /* A leased rule the caller could not decide: the I/O thread does, so
     * its outcome is the I/O thread's, as an exact rule's. */
    bool via_io;
    uint32_t key_offset;        /* likewise: into req->keys */
    uint32_t key_len;
    rl_outcome outcome;         /* I/O thread only */
    rl_bucket_reply reply;      /* I/O thread only */
    /* I/O thread only: answered and allowed, but its call charged nothing
     * (charge: atomic, another rule of the same call rejected). A refund
     * skips it. */
    bool uncharged;
    bool grouped;               /* I/O thread only: in a call (exact.c) */
    /* FAILED, and the rule's on_error: local bucket decided: reply is
     * that bucket's answer (fallback.h). Written with outcome. */
    bool fallback;
    /* ANSWERED by a global rule's share while a region is cut off (its
     * last part of the room stands): the decision is degraded, not
     * fallback. Written with outcome. */
    bool cut;
    /* I/O thread only: an in_flight rule's slot is taken and held for
     * the request (in_flight.h), until its end or its rejection. */
    bool slot_taken;
} rl_rule_state;

/* Who completed a blocking check: the I/O thread with a decision, or the
 * caller, which gave up waiting (the I/O thread was stuck). The I/O thread
 * claims the request (DECIDING) before it decides, so that the fallback
 * buckets of on_error: local are charged by exactly one of the two; the
 * caller that finds it claimed waits the few microseconds to DONE. */
enum { RL_OWNER_PENDING, RL_OWNER_DECIDING, RL_OWNER_DONE,
       RL_OWNER_ABANDONED };

struct rl_request {
    rl_request *next;             /* submission queue */
    rl_request *live_prev, *live_next; /* I/O thread: by deadline */
    rl_agent *agent;
    rl_gen *gen;                  /* the rules it was built under: held */
    atomic_int refs;              /* the caller's (sync) and the I/O thread's */
    atomic_int owner;             /* RL_OWNER_*, blocking checks only */
    sem_t done;                   /* blocking checks only */
    rl_check_fn callback;         /* async checks only */
    void *callback_arg;
    uint64_t deadline_ns;         /* uv_hrtime() clock */
    /* uv_hrtime() just before its synced and local rules counted (a
     * hold's end weighs a synced give-back against it; check.c). */
    uint64_t checked_ns;
    uint32_t cost;
    /* A hold (known as it is built): its in_flight rules take a slot
     * each, where a plain check's only see whether one is free, and its
     * local windows are stamped for its end (check.c). */
    bool takes_slots;
    int n_rules;
    int outstanding;              /* store calls not yet answered */
    int next_rule;                /* charge: first_reject */
    bool finalized;
    rl_decision decision;         /* written by the I/O thread */
    char *keys;
    /* I/O thread: each rule's bucket call while it is out, by the rule's
     * index (in the request's block: a call allocates nothing). */
    rl_bucket_pending *calls;
    rl_rule_state rules[];
};

struct rl_agent {
    /* The config it was opened with: its store, aggregator and local
     * settings are the agent's for life (a reload changes the rules). */
    rl_config *owned_config;      /* NULL when the config is borrowed */
    const rl_config *config;
    rl_store_config store_config; /* the config's, with overrides */
    rl_redis_tls *redis_tls;      /* store.tls's context, or NULL */
    rl_logger log;
    unsigned forks;               /* rl_forks() when it was opened */
    char id[RL_AGENT_ID_MAX + 1]; /* agent_id.h */

    /* Submission queue: gateway threads -> I/O thread. */
    pthread_mutex_t queue_lock;
    rl_request *queue_head, **queue_tail;
    bool queue_closed;            /* under queue_lock */
    atomic_bool closing;
    rl_calls calls;               /* callers inside rl_check* */

    /* The rules checks start with (gen.h). A check loads it once after
     * entering (rl_agent_rules) and keeps it to its end. */
    _Atomic(rl_gen *) gen;
    /* Reloads, one at a time; also held by rl_agent_stats and close. */
    pthread_mutex_t reload_lock;
    rl_gen *retired;              /* replaced, not yet freed */
    size_t n_retired;
    rl_ident *idents;             /* every identity a generation or an
                                   * entry still uses */
    rl_agent_counters retired_counts; /* requests of generations freed */
    uint64_t reloads;
    /* The I/O thread's generation: the next one under queue_lock, with
     * its sequence number; the one it applied last, signalled. */
    rl_gen *io_next;
    uint64_t io_posted, io_applied;
    pthread_cond_t io_applied_cond;
    rl_gen *io_gen;               /* I/O thread only */

    /* I/O thread: the agent's own, or, with rl_options.host_loop, the
     * host's thread that opened the agent (host_thread), which runs the
     * loop in rl_agent_run. */
    uv_thread_t thread;
    bool host_loop;
    pthread_t host_thread;
    bool host_running;            /* inside rl_agent_run */
    uv_loop_t loop;
    uv_async_t wakeup;
    /* Requests the I/O thread submits itself (a callback checking again):
     * served later in the same turn of the loop, with no wakeup through
     * the kernel (agent.c). */
    uv_idle_t own_wakeup;
    uv_timer_t deadline_timer;
    rl_store *store;
    rl_store_counters store_counters; /* read by tests from any thread */
    rl_request *live_head, *live_tail;

    /* Synced rules: local counters, and the sync with the aggregators.
     * The has_ flags say what exists; set before a generation that needs
     * it is published, never cleared while open. */
    bool has_synced;
    rl_synced synced;
    rl_sync *sync;

    /* Local rules: a bucket per key in this process. */
    bool has_local;
    rl_local local;
    /* on_error: local: a bucket per key, at the rule's share of the
     * fleet's rate, for when the store does not answer (fallback.h). */
    bool has_fallback;
    rl_local fallback;

    /* in_flight rules: the slots this agent holds (in_flight.h). */
    rl_in_flight in_flight;

    /* Leased rules: tokens in hand per key (leased.h). */
    bool has_leased;
    rl_leased leased;
    bool io_leased;               /* I/O thread: it serves leased keys */
    bool io_closing;              /* I/O thread: the close has begun */
    rl_sync *closing_sync;        /* I/O thread: stopped at the close's end */

    /* Holds (rl_check_hold) not yet ended, and those their callers
     * ended, for the I/O thread (hold.h). */
    rl_holds holds;

    rl_stats stats;
};

/* agent.c: how many times this process is a fork()ed child of the one
 * before; an agent opened at another count belongs to another process.
 * A plain load: no system call on the hot path (getpid() is one). */
unsigned rl_forks(void);

/* check.c: the current rules, for a caller inside rl_calls. */
static inline rl_gen *rl_agent_rules(rl_agent *a)
{
    /* Sequentially consistent: ordered after entering (calls.c). */
    return atomic_load(&a->gen);
}

/* reload.c: makes what generation g needs that the agent lacks: local
 * buckets, synced counters and the link to the aggregators (an exact
 * rule's store is made by the I/O thread, rl_agent_io_apply). Under the
 * reload lock (or at open). */
int rl_agent_take_modes(rl_agent *a, rl_gen *g, rl_error *err);

/* reload.c, the I/O thread (or open, before it runs: started false): serve
 * generation g from now on; drops the reference to the one before. */
void rl_agent_io_apply(rl_agent *a, rl_gen *g, bool started);

/* Whether the caller is the thread that runs the agent's loop. */
bool rl_agent_on_loop_thread(const rl_agent *a);

/* reload.c, the I/O thread: logs fallback_fleet_unknown, once per rule
 * identity, for g's on_error: local rules without fleet_size. */
void rl_agent_warn_fleet_unknown(rl_agent *a, const rl_gen *g);

/* reload.c: the counters of the current rules, their earlier generations
 * included, and the requests of every generation. Under the reload lock. */
void rl_agent_rule_stats(rl_agent *a, rl_agent_counters *out,
                         rl_rule_counters *rules, size_t cap);

/* exact.c: the I/O thread's side of a check. */
void rl_exact_start(rl_agent *agent, rl_request *req);
void rl_exact_expire(rl_agent *agent, uint64_t now_ns);
void rl_exact_finalize_all(rl_agent *agent);
void rl_exact_arm_deadline(rl_agent *agent);

/* agent.c: queue a request for the I/O thread; RL_ECLOSED once the queue is
 * closed. */
int rl_agent_submit(rl_agent *agent, rl_request *req);

/* check.c: drop one reference; the last one frees the request. */
void rl_request_release(rl_request *req);
/* check.c: rl_check's own refusals of its arguments (RL_EINVAL), before
 * any rule is looked at. */
int rl_check_validate(const rl_attr *attrs, size_t n, uint32_t cost);

/* decision.c: combine the rules' outcomes into one decision. */
void rl_decide(const rl_rule_state *rules, int n, rl_decision *out);

/* The decision of a request one enforced rule applied to, which answered,
 * at rate (o's, or the rule's own when o is NULL). */
void rl_decide_one(const rl_rule *rule, const rl_override *o,
                   const rl_limit *rate, const rl_bucket_reply *reply,
                   rl_decision *out);
/* The answer of an unanswered rule's fallback bucket (on_error: local),
 * for rl_decide_unanswered: false when there is none (the rule allows). */
typedef bool (*rl_fallback_fn)(void *arg, const rl_rule_state *rs,
                               rl_bucket_reply *out);
/* The same as if the store had not answered for any of its rules; reads
 * the outcomes of synced rules only (the caller's, fixed before submit),
 * never those of exact rules, which the I/O thread may be writing: their
 * fallback answers come from fallback(arg, ...) (NULL: none). */
void rl_decide_unanswered(const rl_rule_state *rules, int n,
                          rl_fallback_fn fallback, void *arg,
                          rl_decision *out);
/* Whether an unanswered rule lets the request through: its fallback
 * bucket's answer when it has one, else its on_error (local without a
 * bucket: allow). */
bool rl_unanswered_allows(const rl_rule_state *rs);

/* exact.c, the I/O thread: lets go of the in_flight slots a request
 * holds (its end, or its rejection). */
void rl_exact_release_slots(rl_agent *agent, rl_request *req);

/* fallback.c: rs's rule is unanswered and its on_error is local: its
 * fallback bucket decides, charged cost for value (the key without the
 * rule's prefix); sets rs->fallback and rs->reply (left as they are when
 * no bucket can be had). Any thread that owns rs. */
void rl_fallback_decide(rl_agent *a, const rl_gen *g, rl_rule_state *rs,
                        const char *value, size_t len, uint32_t cost);
/* The same for a rule of a request the I/O thread decides. */
void rl_fallback_decide_key(rl_agent *a, rl_request *req,
                            rl_rule_state *rs);
/* An rl_fallback_fn for a caller that gave up on the I/O thread (arg is
 * the request): charges rs's fallback bucket without writing rs. */
bool rl_fallback_answer(void *arg, const rl_rule_state *rs,
                        rl_bucket_reply *out);

#endif
