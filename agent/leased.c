/*
 * leased.c: leases of an exact bucket's tokens. A check finds its (rule,
 * value) entry in an open-addressing table without a lock and takes its
 * cost from the tokens in hand with one compare-and-swap: a token is spent
 * once, by one check, and every token in hand was taken from the bucket by
 * one atomic call in Redis. So the fleet admits at most what the bucket
 * holds, as exact does, and at least the bucket minus the tokens held in
 * hand elsewhere.
 *
 * The I/O thread does everything else, so the table has one writer: it
 * inserts a key when its first check comes to wait, sizes and sends the
 * leases (about RL_LEASE_MS of the agent's own traffic for the key, at
 * least the cost waiting, at most burst / agents in hand), asks for the
 * next one when a check takes the hand below half of a lease (the check
 * pushes the entry on a lock-free stack and wakes the loop, once per
 * lease), and gives tokens back with the bucket's own call at a negative
 * cost (never above capacity): when a key has been idle RL_LEASE_IDLE_MS,
 * when its rule goes or changes rate on a reload, and at close.
 *
 * A lease that got fewer tokens than it asked for found the bucket dry:
 * once the hand is spent, checks are refused here, with no round trip,
 * until a later lease (sent when a lease's worth has had time to refill,
 * if checks kept coming) finds tokens again. A lease the store did not
 * answer leaves the key not dry: the next checks go to the I/O thread,
 * whose lease fails too, and their rule's on_error decides.
 *
 * A hand is spent only while the bucket still counts it (issue 28). A
 * lease leaves the bucket d units short; Redis refills them at the
 * bucket's rate, so a hand kept alive by a trickle of checks would
 * otherwise still be spendable once Redis is full again, and the fleet
 * pass a bucket and a hand (one agent at 100 a second: 163 where exact
 * passes 101). Picture the bucket's deficit as a stack of token slots
 * that sinks at the refill rate r: a lease's n tokens are the top n
 * slots below d, and a token whose slot has sunk below zero has been
 * refilled. Every slot of the hand is below the top of the last lease, so
 * the hand counts at most L(t) = d/r - (t - sent) tokens, and at most the
 * line before that lease plus n: the count line is the lower of the two,
 * one line falling at r, kept as the time it reaches zero (zero_ns;
 * sent is when the lease was sent, before Redis took it: earlier, so
 * the line is lower). A check spends from min(hand, L(now)), dropping the
 * rest in the same CAS, and a give-back returns only that (the rest the
 * bucket has refilled; returned, it would be refilled twice). Then the
 * hands of all agents, each within its own line, fit in the slots the
 * bucket is short of: bucket + hands <= burst at any time, and over any
 * span the fleet passes at most burst + r x span, as exact does. Whole
 * tokens: L rounds up, so a token the bucket has begun to refill counts
 * until it has, as Redis grants only whole tokens. What is not covered: a
 * give-back by one agent lowers the slots of leases taken after it by
 * others, whose lines do not know it, by at most the tokens given back.
 *
 * Leases taken from a bucket near full sink at once (their slots are
 * low), so an agent under the limit leases a little more often; a dry
 * bucket's slots are high (about burst), and its leases lose nothing.
 * Until whole_until_ns the line is above the whole hand and a check is
 * one compare of the clock and the CAS.
 *
 * Entries dropped from the table are freed once every check begun before
 * the drop has left (graves.h): a check that still holds one finds no
 * tokens and no rate in it, and goes to the I/O thread, which makes the
 * key afresh.
 */
#include "leased.h"

#include "key_table.h"
#include "rl.h"
#include "scripts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_MS 5
#define SWEEP_EVERY (RL_LEASE_MS / TICK_MS)

/* An entry's tokens word: the tokens in hand in its low HAND_BITS, and
 * above them the number (mod LEASES) of the last lease added to the hand.
 * A lease's remaining goes to remaining[its number % 2], tagged with the
 * number, before its tokens reach the hand, and a check answers with the
 * remaining of the lease its hand came from: never a new lease's
 * remaining with the hand from before it (short by the lease) nor the
 * other way round. */
#define HAND_BITS 54 /* the hand stays under burst + a cost: < 2^53 + 2^32 */
#define HAND_MASK ((UINT64_C(1) << HAND_BITS) - 1)
#define LEASE_ONE (UINT64_C(1) << HAND_BITS)
#define LEASES (UINT64_C(1) << (64 - HAND_BITS))

const char rl_leased_refused[] = "leased keys are at local.max_keys";

struct rl_lease_waiter {
    rl_lease_waiter *next;
    rl_bucket_fn fn;
    void *arg;
    uint32_t cost;
};

/* A lease call in flight. */
typedef struct lease_call {
    rl_leased *l;
    rl_leased_entry *e;
    uint64_t want;
    rl_bucket_args args;        /* the rate it was sent at */
    uint32_t epoch;             /* the entry's, then */
    uint64_t sent_ns;           /* uv_hrtime() when it was sent */
} lease_call;

static rl_leased_table *table_new(size_t cap)
{
    rl_leased_table *t = calloc(1, sizeof *t + cap * sizeof t->slots[0]);
    if (t != NULL)
        t->cap = cap;
    return t;
}

int rl_leased_init(rl_leased *l, size_t max_keys, uv_async_t *wakeup,
                   const atomic_bool *closing, rl_calls *calls)
{
    memset(l, 0, sizeof *l);
    rl_graves_init(&l->graves, calls);
    l->max_keys = max_keys;
    l->wakeup = wakeup;
    l->closing = closing;
    rl_leased_table *t = table_new(rl_key_table_cap(max_keys));
    if (t == NULL)
        return RL_ENOMEM;
    atomic_init(&l->table, t);
    atomic_init(&l->wanted, NULL);
    return RL_OK;
}

static void free_entry(rl_leased_entry *e)
{
    if (e == NULL)
        return;
    rl_ident_unref(e->ident);
    free(e);
}

static void free_buried(void *owner, void *table, void *entry, bool all)
{
    (void)owner;
    (void)all;
    free_entry(entry);
    free(table);
}

void rl_leased_fini(rl_leased *l)
{
    rl_leased_table *t = atomic_load(&l->table);
    if (t == NULL)
        return;
    rl_graves_free(&l->graves, true, free_buried, l);
    for (size_t i = 0; i < t->cap; i++)
        free_entry(atomic_load(&t->slots[i]));
    free(t);
}

static inline const char *value_of(const rl_leased_entry *e)
{
    return e->key + (e->key_len - e->value_len);
}

static inline rl_leased_entry *probe(rl_leased_table *t, uint64_t h,
                                     const rl_ident *id, const char *value,
                                     size_t len, size_t *free_slot)
{
    size_t mask = t->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        rl_leased_entry *e = atomic_load_explicit(&t->slots[i],
                                                  memory_order_acquire);
        if (e == NULL) {
            *free_slot = i;
            return NULL;
        }
        if (e->hash == h && e->ident == id && e->value_len == len
            && rl_key_equal(value_of(e), value, len))
            return e;
    }
}

static bool same_rate(const rl_leased_entry *e, const rl_limit *rate)
{
    return atomic_load_explicit(&e->limit, memory_order_relaxed)
               == rate->limit
           && atomic_load_explicit(&e->burst, memory_order_relaxed)
                  == rate->burst
           && atomic_load_explicit(&e->period_ms, memory_order_relaxed)
                  == rate->period_ms;
}

/* A check took the hand below half a lease: the I/O thread is asked for
 * the next one, once per lease. */
static void ask(rl_leased *l, rl_leased_entry *e)
{
    if (atomic_exchange(&e->asked, true))
        return;
    rl_leased_entry *head = atomic_load(&l->wanted);
    do
        atomic_store_explicit(&e->wanted_next, head, memory_order_relaxed);
    while (!atomic_compare_exchange_weak(&l->wanted, &head, e));
    if (!atomic_load(l->closing))
        uv_async_send(l->wakeup);
}

/* Until cost tokens could be had: what Redis held at the last lease and
 * the hand, against the rate. */
static int64_t retry_ms(const rl_leased_entry *e, const rl_limit *rate,
                        uint64_t hand, uint32_t cost)
{
    if (cost > rate->burst)
        return -1;
    uint64_t have = atomic_load_explicit(&e->avail, memory_order_relaxed)
                    + hand * rate->period_ms;
    uint64_t need = (uint64_t)cost * rate->period_ms;
    if (need <= have)
        return 1;
    return (int64_t)((need - have + rate->limit - 1) / rate->limit);
}

static inline uint64_t hand_of(uint64_t word)
{
    return word & HAND_MASK;
}

/* The bucket's remaining as the lease the hand in word came from saw it,
 * plus that hand. word was read with acquire: the slot was stored before
 * its lease reached the hand. Once two more leases came, the slot holds a
 * later one's: then the hand as it is now. */
static uint64_t remaining_with(const rl_leased_entry *e, uint64_t word)
{
    for (;;) {
        uint64_t lease = word >> HAND_BITS;
        uint64_t r = atomic_load_explicit(&e->remaining[lease % 2],
                                          memory_order_relaxed);
        if (r >> HAND_BITS == lease)
            return (r & HAND_MASK) + hand_of(word);
        word = atomic_load_explicit(&e->tokens, memory_order_acquire);
    }
}

/* word: the tokens word after the check's spend (or its failed try). */
static void answer(const rl_leased_entry *e, bool allowed, uint64_t word,
                   int64_t retry, rl_bucket_reply *out)
{
    out->allowed = allowed;
    out->remaining = remaining_with(e, word);
    out->reset_ms = atomic_load_explicit(&e->reset_ms, memory_order_relaxed);
    out->retry_ms = allowed ? 0 : retry;
}

/* How many tokens of the hand the bucket still counts at now_ns: the
 * count line (zero_ns, token_ns) read after the tokens word, as the I/O
 * thread stores it before the tokens it bounds (on_lease). */
static inline uint64_t counted_at(const rl_leased_entry *e, uint64_t now_ns)
{
    uint64_t zero = atomic_load_explicit(&e->zero_ns, memory_order_relaxed);
    uint64_t tk = atomic_load_explicit(&e->token_ns, memory_order_relaxed);
    return zero > now_ns && tk > 0 ? (zero - now_ns + tk - 1) / tk : 0;
}

/* n tokens left a hand because the bucket had refilled them. */
static void expire(rl_leased *l, rl_leased_entry *e, uint64_t n)
{
    atomic_fetch_add_explicit(&e->expired, n, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->expired_tokens, n, memory_order_relaxed);
}

/* Takes cost from the hand; true if it held them. *word: the tokens word
 * left; *before: the hand before, with what the line cut. Tokens the
 * bucket no longer counts (it has refilled them: see on_lease) leave the
 * hand first, in the same CAS; before whole_until_ns the whole hand
 * counts and no clock is read past that one compare. */
static inline bool spend(rl_leased *l, rl_leased_entry *e, uint32_t cost,
                         uint64_t *word, uint64_t *before)
{
    uint64_t t = atomic_load_explicit(&e->tokens, memory_order_acquire);
    uint64_t counted = UINT64_MAX;
    if (hand_of(t) > 0) {
        uint64_t now = uv_hrtime();
        if (now >= atomic_load_explicit(&e->whole_until_ns,
                                        memory_order_relaxed))
            counted = counted_at(e, now);
    }
    for (;;) {
        uint64_t hand = hand_of(t);
        uint64_t left = hand < counted ? hand : counted;
        bool fits = left >= cost;
        if (!fits && left == hand)
            break;
        uint64_t next = t - (hand - left) - (fits ? cost : 0);
        if (atomic_compare_exchange_weak_explicit(&e->tokens, &t, next,
                                                  memory_order_acquire,
                                                  memory_order_acquire)) {
            if (left < hand)
                expire(l, e, hand - left);
            if (!fits) {
                t = next;
                break;
            }
            *before = hand;
            *word = next;
            return true;
        }
    }
    *word = t;
    return false;
}

bool rl_leased_check(rl_leased *l, rl_ident *id, const rl_limit *rate,
                     const char *value, size_t value_len,
                     uint64_t value_hash, uint32_t cost,
                     rl_bucket_reply *out)
{
    size_t unused;
    rl_leased_entry *e = probe(atomic_load_explicit(&l->table,
                                                    memory_order_acquire),
                               rl_key_hash_salt(value_hash, (uintptr_t)id),
                               id, value, value_len, &unused);
    if (e == NULL || !same_rate(e, rate))
        return false;
    uint64_t word, before;
    if (spend(l, e, cost, &word, &before)) {
        /* The hand before counts what the line took back with this
         * spend: a hand the bucket takes back asks for the next lease
         * as it crosses low, as a spent one does. */
        uint64_t low = atomic_load_explicit(&e->low, memory_order_relaxed);
        if (before >= low && hand_of(word) < low)
            ask(l, e);
        answer(e, true, word, 0, out);
        return true;
    }
    if (!atomic_load_explicit(&e->dry, memory_order_acquire))
        return false;
    atomic_fetch_add_explicit(&e->refused, cost, memory_order_relaxed);
    answer(e, false, word, retry_ms(e, rate, hand_of(word), cost), out);
    return true;
}

/* --- The I/O thread. ---------------------------------------------------- */

static void tick(uv_timer_t *t);

void rl_leased_start(rl_leased *l, rl_store *store, uv_loop_t *loop,
                     const rl_logger *log)
{
    if (l->started)
        return;
    l->store = store;
    l->loop = loop;
    l->log = log;
    uv_timer_init(loop, &l->tick);
    l->tick.data = l;
    l->started = true;
}

static void arm_tick(rl_leased *l)
{
    if (l->started && !uv_is_active((uv_handle_t *)&l->tick))
        uv_timer_start(&l->tick, tick, TICK_MS, TICK_MS);
}

/* Agents sharing the rule: the aggregator's count, else the config's
 * fleet_size, else this one alone (said once per rule: each agent may
 * then hold the whole burst). */
static uint64_t agents_of(rl_leased *l, rl_leased_entry *e,
                          const rl_rule *rule)
{
    uint64_t n = atomic_load_explicit(&e->ident->agents,
                                      memory_order_relaxed);
    if (n == 0)
        n = rule->fleet_size;
    if (n == 0 && !e->ident->lease_fleet_warned) {
        e->ident->lease_fleet_warned = true;
        rl_log(l->log, RL_LOG_WARN, "lease_fleet_unknown", "rule=%s "
               "reason=\"no agent count from an aggregator yet and no "
               "fleet_size: leases are sized as if this agent were "
               "alone\"", rule->name);
    }
    return n > 0 ? n : 1;
}

static uint64_t used_of(const rl_leased_entry *e)
{
    return e->taken
           - hand_of(atomic_load_explicit(&e->tokens, memory_order_relaxed))
           - atomic_load_explicit(&e->expired, memory_order_relaxed)
           + atomic_load_explicit(&e->refused, memory_order_relaxed);
}

/* At close: done once every give-back and lease is answered. */
static void closing_step(rl_leased *l)
{
    if (l->given_back == NULL || l->giving_back > 0 || l->leases_out > 0)
        return;
    void (*done)(void *) = l->given_back;
    l->given_back = NULL;
    uv_timer_stop(&l->tick);
    done(l->given_back_arg);
}

static void on_given_back(void *arg, const rl_bucket_reply *reply,
                          const char *error)
{
    (void)reply;
    (void)error; /* lost: the bucket refills them in time anyway */
    rl_leased *l = arg;
    l->giving_back--;
    closing_step(l);
}

/* ns from now_ns until a bucket units (1/period_ms tokens) short of full
 * at limit has refilled them, rounded down; saturating. */
static uint64_t refill_ns(uint64_t units, const rl_limit *rate)
{
    unsigned __int128 ns = (unsigned __int128)units * 1000000 / rate->limit;
    return ns > UINT64_MAX / 2 ? UINT64_MAX / 2 : (uint64_t)ns;
}

/* ns a token takes to refill at rate, rounded up. */
static uint64_t token_ns_of(const rl_limit *rate)
{
    return refill_ns(rate->period_ms, rate) + 1;
}

/* Of held tokens that a lease sent at sent_ns left d units short: those
 * the bucket still counts now. */
static uint64_t counted_of_lease(uint64_t held, uint64_t sent_ns, uint64_t d,
                                 const rl_limit *rate)
{
    uint64_t zero = sent_ns + refill_ns(d, rate), now = uv_hrtime();
    uint64_t tk = token_ns_of(rate);
    uint64_t counted = zero > now ? (zero - now + tk - 1) / tk : 0;
    return held < counted ? held : counted;
}

static void on_debt_paid(void *arg, const redisReply *reply,
                         const char *error)
{
    rl_leased *l = arg;
    if (reply == NULL)
        rl_log(l->log, RL_LOG_WARN, "hold_commit_failed", "reason=\"%s\"",
               error);
    l->giving_back--;
    closing_step(l);
}

/* A debt outlives the hand that owed it only as one call of its own. */
static void pay_debt(rl_leased *l, rl_leased_entry *e)
{
    uint64_t debt = e->debt;
    e->debt = 0;
    if (debt == 0 || l->store == NULL)
        return;
    l->giving_back++;
    rl_bucket_commit(l->store, &e->args, e->key, e->key_len, (int64_t)debt,
                     on_debt_paid, l);
}

/* The hand goes back to the bucket, at the rate it was leased at: only
 * what the bucket still counts (the rest it has refilled already, and
 * would refill twice). A debt goes with it. */
static void give_back(rl_leased *l, rl_leased_entry *e)
{
    pay_debt(l, e);
    uint64_t held = hand_of(atomic_fetch_and(&e->tokens, ~HAND_MASK));
    uint64_t counted = counted_at(e, uv_hrtime());
    uint64_t n = held < counted ? held : counted;
    if (held > n)
        expire(l, e, held - n);
    if (n == 0 || l->store == NULL)
        return;
    e->taken -= n;
    atomic_fetch_add_explicit(&l->returns, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->returned_tokens, n, memory_order_relaxed);
    l->giving_back++;
    rl_bucket_call(l->store, &e->args, e->key, e->key_len, -(int64_t)n,
                   on_given_back, l);
}

/* The key will be leased afresh, at whatever rate its next check has. */
static void forget_rate(rl_leased_entry *e)
{
    e->epoch++;
    atomic_store(&e->limit, 0);
    atomic_store(&e->dry, false);
}

static void send_lease(rl_leased *l, rl_leased_entry *e, uint64_t waiting);

static void reply_to(rl_lease_waiter *w, const rl_bucket_reply *reply,
                     const char *error)
{
    rl_bucket_fn fn = w->fn;
    void *arg = w->arg;
    free(w);
    fn(arg, reply, error);
}

static void fail_waiters(rl_leased_entry *e, const char *error)
{
    rl_lease_waiter *w = e->waiters;
    e->waiters = NULL;
    e->waiters_tail = &e->waiters;
    while (w != NULL) {
        rl_lease_waiter *next = w->next;
        reply_to(w, NULL, error);
        w = next;
    }
}

/* Checks waiting for a lease of a rule a reload removed or changed: they
 * started under the old rule and finish under it (rl.h), each decided by
 * one bucket call at the rate they waited at, as an exact rule's are. The
 * entry is left without waiters, free to leave the table. */
static void decide_exact(rl_leased *l, rl_leased_entry *e)
{
    if (l->store == NULL) {
        fail_waiters(e, "shutting down");
        return;
    }
    rl_lease_waiter *w = e->waiters;
    e->waiters = NULL;
    e->waiters_tail = &e->waiters;
    while (w != NULL) {
        rl_lease_waiter *next = w->next;
        rl_bucket_fn fn = w->fn;
        void *arg = w->arg;
        uint32_t cost = w->cost;
        free(w);
        rl_bucket_call(l->store, &e->args, e->key, e->key_len, cost, fn, arg);
        w = next;
    }
}

static const rl_limit *rate_of(const rl_leased_entry *e)
{
    return &e->args.rate;
}

/* Serves the waiters in order from the hand; those it cannot serve are
 * refused if the bucket is dry, else keep waiting. Returns the cost still
 * waiting. */
static uint64_t serve_waiters(rl_leased *l, rl_leased_entry *e)
{
    bool dry = atomic_load(&e->dry);
    while (e->waiters != NULL) {
        rl_lease_waiter *w = e->waiters;
        uint64_t word, before;
        bool ok = spend(l, e, w->cost, &word, &before);
        if (!ok && !dry && w->cost <= rate_of(e)->burst)
            break;
        e->waiters = w->next;
        if (e->waiters == NULL)
            e->waiters_tail = &e->waiters;
        if (!ok)
            atomic_fetch_add(&e->refused, w->cost);
        rl_bucket_reply r;
        answer(e, ok, word,
               ok ? 0 : retry_ms(e, rate_of(e), hand_of(word), w->cost), &r);
        reply_to(w, &r, NULL);
    }
    uint64_t waiting = 0;
    for (rl_lease_waiter *w = e->waiters; w != NULL; w = w->next)
        waiting += w->cost;
    return waiting;
}

static void on_lease(void *arg, const redisReply *reply, const char *error)
{
    lease_call c = *(lease_call *)arg;
    free(arg);
    rl_leased *l = c.l;
    rl_leased_entry *e = c.e;
    e->in_flight = false;
    l->leases_out--;
    const rl_limit *rate = &c.args.rate;
    uint64_t cap = rate->burst * rate->period_ms;
    if (reply != NULL
        && (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2
            || reply->element[0]->type != REDIS_REPLY_INTEGER
            || reply->element[1]->type != REDIS_REPLY_INTEGER
            || reply->element[0]->integer < 0
            || (uint64_t)reply->element[0]->integer > c.want
            || reply->element[1]->integer < 0
            || (uint64_t)reply->element[1]->integer > cap)) {
        reply = NULL;
        error = "unexpected reply from the lease script";
    }
    if (reply == NULL) {
        /* The store is away: the hand keeps serving; then on_error. */
        atomic_store(&e->dry, false);
        fail_waiters(e, error);
        closing_step(l);
        return;
    }
    uint64_t n = (uint64_t)reply->element[0]->integer;
    uint64_t d = (uint64_t)reply->element[1]->integer;
    atomic_fetch_add_explicit(&l->leases, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->lease_tokens, n, memory_order_relaxed);
    if (c.epoch != e->epoch) {
        /* The key moved to another rate meanwhile (an override, a
         * reload) or was let go (idle, a reload, the close): these
         * tokens go back at the rate they were taken at, and the key is
         * leased again at its own when a check needs it. */
        uint64_t counted = counted_of_lease(n, c.sent_ns, d, rate);
        atomic_fetch_add_explicit(&l->expired_tokens, n - counted,
                                  memory_order_relaxed);
        n = counted;
        if (n > 0) {
            atomic_fetch_add_explicit(&l->returns, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&l->returned_tokens, n,
                                      memory_order_relaxed);
            l->giving_back++;
            rl_bucket_call(l->store, &c.args, e->key, e->key_len,
                           -(int64_t)n, on_given_back, l);
        }
        if (l->given_back == NULL && e->waiters != NULL)
            send_lease(l, e, serve_waiters(l, e));
        closing_step(l);
        return;
    }
    e->taken += n;
    bool dry = n < c.want;
    /* A hold's excess the hand could not pay comes out of this lease
     * before the hand admits again. */
    uint64_t paid = n < e->debt ? n : e->debt;
    e->debt -= paid;
    n -= paid;
    uint64_t lease = ((atomic_load(&e->tokens) >> HAND_BITS) + 1) % LEASES;
    atomic_store_explicit(&e->remaining[lease % 2],
                          (lease << HAND_BITS) | (cap - d) / rate->period_ms,
                          memory_order_relaxed);
    atomic_store_explicit(&e->reset_ms, (d + rate->limit - 1) / rate->limit,
                          memory_order_relaxed);
    atomic_store_explicit(&e->avail, cap - d, memory_order_relaxed);
    atomic_store_explicit(&e->low, e->target / 2, memory_order_relaxed);
    if (dry) {
        /* Try again once a lease's worth (or the cost waiting) can have
         * refilled, if checks keep coming (tick). */
        uint64_t want = c.want > 0 ? c.want : 1;
        uint64_t need = want * rate->period_ms, avail = cap - d;
        uint64_t wait = need > avail ? (need - avail + rate->limit - 1)
                                           / rate->limit
                                     : 0;
        if (wait > RL_LEASE_MS)
            wait = RL_LEASE_MS;
        e->dry_due_ms = uv_now(l->loop) + wait;
        e->dry_refused = atomic_load(&e->refused);
        if (!e->dry_listed) {
            e->dry_listed = true;
            e->dry_next = l->dry_head;
            l->dry_head = e;
        }
    }
    /* The hand is taken off while its count line moves (checks that find
     * it empty meanwhile wait on this thread): a check must never pair
     * the old hand with the new line. */
    uint64_t held = hand_of(atomic_fetch_and(&e->tokens, ~HAND_MASK));
    uint64_t now = uv_hrtime();
    uint64_t kept = counted_at(e, now);
    if (kept > held)
        kept = held;
    uint64_t tk = token_ns_of(rate);
    uint64_t zero = c.sent_ns + refill_ns(d, rate);
    uint64_t moved = atomic_load(&e->zero_ns)
                     + refill_ns(n * rate->period_ms, rate);
    /* Kept with the new tokens, the old hand holds the line at the old
     * one's height plus n; if that line would cut into the hand before
     * an idle key's give-back, the old tokens (about to be refilled anyway) are let
     * go instead and the line is the new lease's alone, which a bucket
     * far from full puts far off. */
    if (kept > 0 && moved < zero) {
        unsigned __int128 whole_ns = (unsigned __int128)(kept + n) * tk;
        if (whole_ns + now + (uint64_t)RL_LEASE_IDLE_MS * 1000000 < moved)
            zero = moved;
        else
            kept = 0;
    }
    if (held > kept)
        expire(l, e, held - kept);
    unsigned __int128 whole_ns = (unsigned __int128)(kept + n) * tk;
    atomic_store_explicit(&e->token_ns, tk, memory_order_relaxed);
    atomic_store_explicit(&e->zero_ns, zero, memory_order_relaxed);
    atomic_store_explicit(&e->whole_until_ns,
                          whole_ns < zero ? zero - (uint64_t)whole_ns : 0,
                          memory_order_relaxed);
    atomic_fetch_add_explicit(&e->tokens, LEASE_ONE + kept + n,
                              memory_order_release);
    if (l->given_back != NULL) {
        /* Closing: what came in goes straight back. */
        give_back(l, e);
        closing_step(l);
        return;
    }
    atomic_store_explicit(&e->dry, dry, memory_order_release);
    uint64_t waiting = serve_waiters(l, e);
    if (!dry && (waiting > 0
                 || hand_of(atomic_load(&e->tokens))
                        < atomic_load(&e->low)))
        send_lease(l, e, waiting);
}

/* Sends a lease for e: enough to bring the hand to the target (about
 * RL_LEASE_MS of the key's traffic here, refused checks included), at
 * least the cost waiting, at most burst / agents in hand. */
static void send_lease(rl_leased *l, rl_leased_entry *e, uint64_t waiting)
{
    const rl_rule *rule = e->ident->io_rule;
    if (rule == NULL) {
        decide_exact(l, e);
        return;
    }
    /* A forgotten rate is set again by the next check that waits. */
    if (e->in_flight || l->store == NULL || atomic_load(&e->limit) == 0)
        return;
    uint64_t now = uv_hrtime();
    uint64_t used = used_of(e);
    uint64_t elapsed = now - e->snap_ns;
    if (elapsed >= 1000000) {
        /* The rate over the time since the last lease: about half a
         * lease's time in steady traffic. */
        unsigned __int128 per = (unsigned __int128)(used - e->used_snap)
                                * RL_LEASE_MS * 1000000;
        e->target = (uint64_t)((per + elapsed - 1) / elapsed);
        e->used_snap = used;
        e->snap_ns = now;
    }
    const rl_limit *rate = rate_of(e);
    /* A lease from a bucket near full sinks as fast as the bucket
     * refills (leased.c's top): under a lease's time of the rule's own
     * rate, it would be gone before it is spent, whatever the key's
     * traffic, and the key would cost a call per few checks. */
    uint64_t floor = (uint64_t)((unsigned __int128)rate->limit * RL_LEASE_MS
                                / rate->period_ms);
    if (e->target < floor)
        e->target = floor;
    uint64_t hand = hand_of(atomic_load(&e->tokens));
    uint64_t counted = counted_at(e, uv_hrtime());
    if (hand > counted)
        hand = counted;
    /* At most this agent's part of the room: what the bucket held at
     * the last lease and the hand, over the agents sharing it; a hand
     * taken from a bucket others are emptying too would sit here while
     * they refuse. */
    uint64_t room = e->taken == 0 ? rate->burst
                                  : atomic_load(&e->avail) / rate->period_ms
                                        + hand;
    if (room > rate->burst)
        room = rate->burst;
    uint64_t share = room / agents_of(l, e, rule);
    if (e->target > share)
        e->target = share;
    uint64_t want = e->target > hand ? e->target - hand : 0;
    if (want < waiting)
        want = waiting;
    want += e->debt;
    if (want == 0)
        return;
    lease_call *c = malloc(sizeof *c);
    if (c == NULL) {
        fail_waiters(e, "out of memory");
        return;
    }
    *c = (lease_call){l, e, want, e->args, e->epoch, uv_hrtime()};
    e->in_flight = true;
    l->leases_out++;
    char want_text[24];
    snprintf(want_text, sizeof want_text, "%llu", (unsigned long long)want);
    const char *argv[] = {"1", e->key, e->args.burst, e->args.limit,
                          e->args.period, want_text};
    size_t lens[6];
    for (int i = 0; i < 6; i++)
        lens[i] = i == 1 ? e->key_len : strlen(argv[i]);
    rl_store_run(l->store, RL_SCRIPT_LEASE, 6, argv, lens, on_lease, c);
}

/* n tokens a hold did not use come back to the hand, after any debt:
 * only as many as keep the hand within its count line (the rest the
 * bucket has refilled since they were leased). The line does not move,
 * so the hand need not leave it: whole_until_ns comes down first, and a
 * check that sees the new hand sees it (release). */
static void settle_give_back(rl_leased *l, rl_leased_entry *e, uint64_t n)
{
    uint64_t paid = n < e->debt ? n : e->debt;
    e->debt -= paid;
    n -= paid;
    uint64_t now = uv_hrtime();
    uint64_t hand = hand_of(atomic_load(&e->tokens));
    uint64_t counted = counted_at(e, now);
    uint64_t room = counted > hand ? counted - hand : 0;
    uint64_t back = n < room ? n : room;
    e->taken += n;
    if (n > back)
        expire(l, e, n - back);
    if (back == 0)
        return;
    uint64_t zero = atomic_load(&e->zero_ns);
    unsigned __int128 whole_ns = (unsigned __int128)(hand + back)
                                 * atomic_load(&e->token_ns);
    uint64_t whole = whole_ns < zero ? zero - (uint64_t)whole_ns : 0;
    if (whole < atomic_load(&e->whole_until_ns))
        atomic_store_explicit(&e->whole_until_ns, whole,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&e->tokens, back, memory_order_release);
}

/* n tokens a hold used past its estimate are taken from the hand, as a
 * check takes its cost (tokens past the line leave first); what it lacks
 * is owed. Taking the hand below low asks for the next lease, as a
 * check's spend does. */
static void settle_excess(rl_leased *l, rl_leased_entry *e, uint64_t n)
{
    uint64_t counted = counted_at(e, uv_hrtime());
    uint64_t t = atomic_load_explicit(&e->tokens, memory_order_acquire);
    uint64_t hand, left, take;
    do {
        hand = hand_of(t);
        left = hand < counted ? hand : counted;
        take = left < n ? left : n;
    } while (!atomic_compare_exchange_weak_explicit(
        &e->tokens, &t, t - (hand - left) - take, memory_order_acquire,
        memory_order_acquire));
    if (left < hand)
        expire(l, e, hand - left);
    e->debt += n - take;
    uint64_t low = atomic_load_explicit(&e->low, memory_order_relaxed);
    if (hand >= low && left - take < low && !e->in_flight)
        send_lease(l, e, 0);
}

bool rl_leased_settle(rl_leased *l, rl_ident *id, const rl_limit *rate,
                      const char *value, size_t value_len, int64_t delta)
{
    size_t unused;
    rl_leased_entry *e = probe(atomic_load(&l->table),
                               rl_key_hash((uintptr_t)id, value, value_len),
                               id, value, value_len, &unused);
    if (e == NULL || e->gone || !same_rate(e, rate))
        return false;
    if (delta < 0)
        settle_give_back(l, e, (uint64_t)-delta);
    else if (delta > 0)
        settle_excess(l, e, (uint64_t)delta);
    return true;
}

static void set_rate(rl_leased_entry *e, const rl_rule *rule,
                     const rl_limit *rate)
{
    e->epoch++;
    rl_bucket_args_rate(&e->args, rule, rate);
    atomic_store(&e->burst, rate->burst);
    atomic_store(&e->period_ms, rate->period_ms);
    atomic_store(&e->limit, rate->limit);
}

static rl_leased_entry *insert(rl_leased *l, const rl_rule *rule,
                               rl_ident *id, const rl_limit *rate,
                               const char *key, size_t key_len,
                               size_t value_len, uint64_t h, size_t slot)
{
    if (atomic_load(&l->n_entries) >= l->max_keys) {
        atomic_fetch_add(&l->keys_refused, 1);
        return NULL;
    }
    size_t bytes = (sizeof(rl_leased_entry) + key_len + RL_CACHE_LINE - 1)
                   / RL_CACHE_LINE * RL_CACHE_LINE;
    rl_leased_entry *e = aligned_alloc(RL_CACHE_LINE, bytes);
    if (e == NULL)
        return NULL;
    memset(e, 0, bytes);
    e->ident = id;
    rl_ident_ref(id);
    e->hash = h;
    e->value_len = (uint16_t)value_len;
    e->key_len = (uint16_t)key_len;
    memcpy(e->key, key, key_len);
    e->waiters_tail = &e->waiters;
    e->snap_ns = uv_hrtime();
    e->idle_since_ms = uv_now(l->loop);
    set_rate(e, rule, rate);
    rl_leased_table *t = atomic_load(&l->table);
    atomic_store_explicit(&t->slots[slot], e, memory_order_release);
    atomic_fetch_add(&l->n_entries, 1);
    arm_tick(l);
    return e;
}

void rl_leased_wait(rl_leased *l, const rl_rule *rule, rl_ident *id,
                    const rl_limit *rate, const char *key, size_t key_len,
                    size_t value_len, uint32_t cost, rl_bucket_fn fn,
                    void *arg)
{
    const char *value = key + (key_len - value_len);
    uint64_t h = rl_key_hash((uintptr_t)id, value, value_len);
    size_t slot;
    rl_leased_entry *e = probe(atomic_load(&l->table), h, id, value,
                               value_len, &slot);
    if (e == NULL)
        e = insert(l, rule, id, rate, key, key_len, value_len, h, slot);
    if (e == NULL) {
        fn(arg, NULL, rl_leased_refused);
        return;
    }
    if (!same_rate(e, rate)) {
        /* Another rate (an override, a reload): the hand goes back at
         * the old one and the key is leased at the new. */
        give_back(l, e);
        set_rate(e, rule, rate);
        atomic_store(&e->dry, false);
    }
    rl_lease_waiter *w = malloc(sizeof *w);
    if (w == NULL) {
        fn(arg, NULL, "out of memory");
        return;
    }
    *w = (rl_lease_waiter){NULL, fn, arg, cost};
    *e->waiters_tail = w;
    e->waiters_tail = &w->next;
    /* A lease may have come since the check looked, or the bucket be
     * known dry: served or refused at once. */
    uint64_t waiting = e->in_flight ? 0 : serve_waiters(l, e);
    if (waiting > 0)
        send_lease(l, e, waiting);
}

void rl_leased_drain(rl_leased *l)
{
    rl_leased_entry *e = atomic_exchange(&l->wanted, NULL);
    while (e != NULL) {
        rl_leased_entry *next = atomic_load_explicit(&e->wanted_next,
                                                     memory_order_relaxed);
        /* Off the stack: only now may a check push it again (asked is
         * the stack's membership; cleared anywhere else, a second push
         * would link the entry to itself). A lease in flight sends the
         * next one itself when it finds the hand low. */
        atomic_store(&e->asked, false);
        if (!e->gone && !e->in_flight)
            send_lease(l, e, 0);
        e = next;
    }
}

/* A dry key whose wait is over: leased again if checks kept coming,
 * else no longer dry (its next check goes to the I/O thread). */
static void refill_dry(rl_leased *l, rl_leased_entry *e, uint64_t now)
{
    if (!atomic_load(&e->dry) || e->in_flight || now < e->dry_due_ms)
        return;
    if (atomic_load(&e->refused) == e->dry_refused && e->waiters == NULL) {
        atomic_store(&e->dry, false);
        return;
    }
    send_lease(l, e, 1);
}

static bool droppable(rl_leased_entry *e, uint64_t now)
{
    if (e->in_flight || e->waiters != NULL)
        return false;
    uint64_t used = used_of(e);
    if (used != e->idle_used) {
        e->idle_used = used;
        e->idle_since_ms = now;
    }
    return e->ident->io_rule == NULL
           || now - e->idle_since_ms >= RL_LEASE_IDLE_MS;
}

/* Idle keys give their tokens back and leave the table: it is rebuilt
 * without them and swapped in (one writer, this thread). */
static void sweep(rl_leased *l, uint64_t now)
{
    rl_graves_free(&l->graves, false, free_buried, l);
    rl_leased_table *t = atomic_load(&l->table);
    size_t dropped = 0;
    for (size_t i = 0; i < t->cap; i++) {
        rl_leased_entry *e = atomic_load(&t->slots[i]);
        if (e != NULL && droppable(e, now)) {
            give_back(l, e);
            forget_rate(e);
            e->gone = true;
            dropped++;
        }
    }
    if (dropped == 0)
        return;
    rl_leased_table *fresh = table_new(t->cap);
    if (fresh == NULL) {
        for (size_t i = 0; i < t->cap; i++) {
            rl_leased_entry *e = atomic_load(&t->slots[i]);
            if (e != NULL)
                e->gone = false; /* kept, with no tokens: leased again */
        }
        return;
    }
    size_t kept = 0;
    for (size_t i = 0; i < t->cap; i++) {
        rl_leased_entry *e = atomic_load(&t->slots[i]);
        if (e == NULL)
            continue;
        if (e->gone) {
            rl_graves_add(&l->graves, NULL, e);
            continue;
        }
        size_t j = e->hash & (fresh->cap - 1);
        while (atomic_load(&fresh->slots[j]) != NULL)
            j = (j + 1) & (fresh->cap - 1);
        atomic_init(&fresh->slots[j], e);
        kept++;
    }
    rl_graves_add(&l->graves, t, NULL);
    /* Sequentially consistent (graves.h): a check that still found the
     * old table began before the mark. */
    atomic_store(&l->table, fresh);
    atomic_store(&l->n_entries, kept);
    rl_graves_mark(&l->graves);
}

/* Every tick the dry keys (a list: those at their limit), every
 * SWEEP_EVERY ticks the whole table. */
static void tick(uv_timer_t *timer)
{
    rl_leased *l = timer->data;
    uint64_t now = uv_now(l->loop);
    rl_leased_entry **link = &l->dry_head;
    while (*link != NULL) {
        rl_leased_entry *e = *link;
        if (!e->gone && atomic_load(&e->dry)) {
            refill_dry(l, e, now);
            link = &e->dry_next;
            continue;
        }
        *link = e->dry_next;
        e->dry_listed = false;
    }
    if (++l->ticks < SWEEP_EVERY)
        return;
    l->ticks = 0;
    sweep(l, now);
    uint64_t refused = atomic_load(&l->keys_refused);
    if (refused != l->refused_logged && now - l->logged_at_ms >= 1000) {
        rl_log(l->log, RL_LOG_WARN, "leased_keys_capped", "refused=%llu "
               "max_keys=%zu", (unsigned long long)refused, l->max_keys);
        l->refused_logged = refused;
        l->logged_at_ms = now;
    }
    if (atomic_load(&l->n_entries) == 0 && l->graves.head == NULL)
        uv_timer_stop(&l->tick);
}

void rl_leased_reloaded(rl_leased *l)
{
    rl_leased_table *t = atomic_load(&l->table);
    for (size_t i = 0; i < t->cap; i++) {
        rl_leased_entry *e = atomic_load(&t->slots[i]);
        if (e != NULL && (e->ident->io_rule == NULL
                          || e->ident->io_changed)) {
            give_back(l, e);
            decide_exact(l, e);
            forget_rate(e);
        }
    }
}

static void close_deadline(uv_timer_t *timer)
{
    rl_leased *l = timer->data;
    uv_timer_stop(timer);
    if (l->given_back != NULL) {
        void (*done)(void *) = l->given_back;
        l->given_back = NULL;
        done(l->given_back_arg);
    }
}

void rl_leased_close(rl_leased *l, uint32_t timeout_ms,
                     void (*done)(void *arg), void *arg)
{
    if (!l->started) {
        done(arg);
        return;
    }
    uv_timer_stop(&l->tick);
    l->given_back = done;
    l->given_back_arg = arg;
    /* Bounded: a store that does not answer holds the close up for one
     * deadline at most. */
    uv_timer_start(&l->tick, close_deadline, timeout_ms, 0);
    /* Held while the calls go out: one that fails at once answers
     * inside rl_bucket_call and must not end the close early. */
    l->giving_back++;
    rl_leased_table *t = atomic_load(&l->table);
    for (size_t i = 0; i < t->cap; i++) {
        rl_leased_entry *e = atomic_load(&t->slots[i]);
        if (e == NULL)
            continue;
        fail_waiters(e, "shutting down");
        give_back(l, e);
        forget_rate(e);
    }
    l->giving_back--;
    closing_step(l);
}

void rl_leased_stop(rl_leased *l)
{
    if (!l->started)
        return;
    l->store = NULL; /* closed: late answers find none to call */
    uv_timer_stop(&l->tick);
    uv_close((uv_handle_t *)&l->tick, NULL);
}
