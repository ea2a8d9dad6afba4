/*
 * synced.c: local counting for synced rules. A check finds its (rule,
 * value) entry in an open-addressing table without a lock, compares what
 * this agent has counted with the entry's mark, and counts on its thread's
 * slot: no lock, no allocation, no system call, no network. Only the
 * first sighting of a key takes a lock (to insert it).
 *
 * The mark is the I/O thread's answer to "how much may this agent still
 * let through". The fleet's totals come per sub-window (wire.h): "recent"
 * (the last N - 1 sub-windows and this one) and "oldest" (the one before
 * them). While Redis's clock is still in the sub-window the totals were
 * read in, the estimate is recent + oldest, the oldest counted whole
 * although part of it is already outside the trailing period; once the
 * clock has moved on, the oldest has left and the estimate is recent (kept
 * so, conservatively, until news comes). The estimate never undercounts
 * what the totals held in the trailing period, whenever in it the requests
 * came: that is what bounds any span, not only aligned windows.
 *
 * Room is the limit less the estimate; each agent's share is
 * floor(room / agents), plus one for the agents whose rank for the key is
 * below room mod agents (share_of), so that the fleet's shares add up to
 * the room on average, not to room + agents. A share replaces the last
 * one, it does not add to it: mark = acked + share, where acked is what
 * this agent counted that the totals already hold, so what it let through
 * since its last acknowledged report is taken out of the new share, and
 * the fleet as a whole lets through at most the room between two totals.
 *
 * Fresh shares are given at the agent's tick (every agent ticks at the
 * same moments of Redis's clock, just before it reports) and when a
 * TOTALS message comes (a snapshot taken after the reports of the tick),
 * so that every agent's share is worked out from the same count. An
 * acknowledgement's totals can only bring the mark down: they may miss
 * reports other agents made the same moment, whose admissions would then
 * be given out again; a key whose totals came with an acknowledgement
 * since the last TOTALS that held it (partial) gets no fresh share until
 * the next one does.
 *
 * A global rule's (scope: global) totals are every region's together
 * (its region's aggregators fold the others' counts in), and its room is
 * split among the regions by their demand: this agent's share is of its
 * region's part of the room (the last TOTALS' share; before any, an equal
 * part per region), and a check that refuses counts its cost as refused,
 * its region's demand with what it admits (sync.c reports both). While a
 * region is not heard (cut) the part last known stands, and the key's
 * decisions say degraded.
 *
 * While no aggregator gives a key's totals (sync.c: degraded), the mark is
 * this agent's own share of the limit over a trailing period of its own
 * counts (own_counts.h), starting from what the last totals held: the
 * check is the same, it only says how it was decided.
 *
 * Check-then-count is not one atomic step: threads of one agent racing on
 * one key can pass together, at most one request each beyond the mark.
 *
 * Entries belong to the rule's identity, not to one config's rule: a
 * reload that keeps the rule keeps its keys and counts, and the I/O thread
 * reads the rule's numbers through the identity (io_rule) as its current
 * generation has them.
 *
 * Keys idle for two periods are forgotten: the I/O thread rebuilds the
 * table without them and swaps it in; the old table and entries are freed
 * once every check begun before the swap has left (graves.h), and any
 * count a late check made on a retired entry is carried over to the live
 * table.
 */
#include "synced.h"

#include "fallback.h"

#include "key_table.h"
#include "keys.h"
#include "rl.h"

#include "wire.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

/* A 64-bit mix (splitmix64's finaliser): the share's coin. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static rl_synced_table *table_new(size_t cap)
{
    rl_synced_table *t = calloc(1, sizeof *t + cap * sizeof t->slots[0]);
    if (t != NULL)
        t->cap = cap;
    return t;
}

int rl_synced_init(rl_synced *s, const rl_config *config, rl_calls *calls)
{
    memset(s, 0, sizeof *s);
    s->config = config;
    rl_graves_init(&s->graves, calls);
    /* The share coin's salt: agents of one fleet draw differently. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    s->salt = mix((uint64_t)(uintptr_t)s ^ (uint64_t)ts.tv_nsec
                  ^ ((uint64_t)ts.tv_sec << 32));
    s->max_keys = config->aggregator.max_keys;
    rl_synced_table *t = table_new(rl_key_table_cap(s->max_keys));
    if (t == NULL)
        return RL_ENOMEM;
    atomic_init(&s->table, t);
    pthread_mutex_init(&s->insert_lock, NULL);
    return RL_OK;
}

static rl_grave_free_fn free_buried;

static void free_entry(rl_synced_entry *e)
{
    if (e != NULL)
        rl_ident_unref(e->ident);
    free(e);
}

void rl_synced_fini(rl_synced *s)
{
    rl_synced_table *t = atomic_load(&s->table);
    if (t == NULL)
        return;
    rl_graves_free(&s->graves, true, free_buried, s);
    for (size_t i = 0; i < t->cap; i++)
        free_entry(atomic_load(&t->slots[i]));
    free(t);
    pthread_mutex_destroy(&s->insert_lock);
}

/* A per-thread-slot counter's sum (thread_slot.h). */
static uint64_t slots_sum(const atomic_uint_least64_t *c)
{
    unsigned used = atomic_load_explicit(&rl_thread_slots_used,
                                         memory_order_acquire);
    uint64_t n = atomic_load_explicit(&c[RL_THREAD_SLOT_SHARED],
                                      memory_order_relaxed);
    for (unsigned i = 0; i < used; i++)
        n += atomic_load_explicit(&c[i], memory_order_relaxed);
    return n;
}

uint64_t rl_synced_counted(const rl_synced_entry *e)
{
    return slots_sum(e->counts);
}

uint64_t rl_synced_refused(const rl_synced_entry *e)
{
    return slots_sum(e->refusals);
}

static bool same_key(const rl_synced_entry *e, uint64_t h,
                     const rl_ident *id, const char *value, size_t len)
{
    return e->hash == h && e->ident == id && e->value_len == len
           && rl_key_equal(e->value, value, len);
}

static inline rl_synced_entry *probe(rl_synced_table *t, uint64_t h,
                                     const rl_ident *id, const char *value,
                                     size_t len, size_t *free_slot)
{
    size_t mask = t->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        rl_synced_entry *e = atomic_load_explicit(&t->slots[i],
                                                  memory_order_acquire);
        if (e == NULL) {
            *free_slot = i;
            return NULL;
        }
        if (same_key(e, h, id, value, len))
            return e;
    }
}

rl_synced_entry *rl_synced_find(rl_synced *s, const rl_ident *id,
                                const char *value, size_t value_len)
{
    size_t unused;
    return probe(atomic_load_explicit(&s->table, memory_order_acquire),
                 rl_key_hash((uintptr_t)id, value, value_len), id,
                 value, value_len, &unused);
}

/* This agent's share of room: floor(room / agents), plus one when this
 * agent's rank for the key (drawn once, from the agent's salt and the key)
 * is below room mod agents. Over the agents' random ranks the shares add up
 * to the room on average (ceil would give up to one request per agent more
 * each time), and a room smaller than the agent count still lets some
 * through. The rank does not change from share to share: the agents that
 * get the extra one when the rest is r are among those that get it when it
 * is more, so an agent that used an extra one is not charged it against a
 * share that no longer has it (a fresh coin per share would let through one
 * request per such agent, share after share). */
static uint64_t share_among(const rl_synced *s, const rl_synced_entry *e,
                            uint64_t room, uint64_t agents)
{
    uint64_t a = agents > 0 ? agents : 1;
    uint64_t share = room / a, rest = room % a;
    if (rest > 0 && mix(s->salt ^ e->hash) % a < rest)
        share++;
    return share;
}

/* The part of a key's room its region's agents share: a global rule's
 * region has the part the last TOTALS gave it (millionths, rounded down:
 * the regions' parts add up to the room at most), or before any, an equal
 * part per region; a regional rule's region has all of it. */
static uint64_t region_part(const rl_synced *s, const rl_synced_entry *e,
                            const rl_rule *r, uint64_t room)
{
    if (r == NULL || !r->global)
        return room;
    uint32_t share = atomic_load_explicit(&e->region_share,
                                          memory_order_relaxed);
    if (share == RL_SYNCED_SHARE_EQUAL) {
        size_t n = s->config->regions.n;
        return room / (n > 0 ? n : 1);
    }
    return (uint64_t)((unsigned __int128)room * share / RL_WIRE_SHARE_WHOLE);
}

void rl_synced_note_region(rl_synced_entry *e, uint64_t share, bool cut)
{
    atomic_store_explicit(&e->region_share, (uint32_t)share,
                          memory_order_relaxed);
    atomic_store_explicit(&e->cut, cut, memory_order_relaxed);
}

static uint64_t share_of(const rl_synced *s, const rl_synced_entry *e,
                         uint64_t room)
{
    return share_among(s, e, room,
                       atomic_load_explicit(&e->ident->agents,
                                            memory_order_relaxed));
}

/* Before any totals: this agent's share of the whole limit (a global
 * rule's: of its region's part). A rule no generation has any more (a
 * late count carried over) admits nothing. */
static void first_mark(rl_synced *s, rl_synced_entry *e, const rl_rule *rule)
{
    uint64_t limit = rule != NULL
                         ? atomic_load_explicit(&e->limit, memory_order_relaxed)
                         : 0;
    uint64_t room = region_part(s, e, rule, limit);
    uint64_t period = rule != NULL ? rule->period_ms : 0;
    /* The agent count known, else the rule's fleet_size, else 1. */
    uint64_t agents = rule != NULL ? rl_fallback_agents(rule, e->ident) : 1;
    atomic_store_explicit(&e->mark, share_among(s, e, room, agents),
                          memory_order_relaxed);
    atomic_store_explicit(&e->room, room, memory_order_relaxed);
    atomic_store_explicit(&e->reset_ms, period, memory_order_relaxed);
    atomic_store_explicit(&e->retry_ms, period, memory_order_relaxed);
}

static rl_synced_entry *insert(rl_synced *s, const rl_rule *rule,
                               rl_ident *id, uint64_t limit,
                               const char *value, size_t len,
                               uint64_t h)
{
    pthread_mutex_lock(&s->insert_lock);
    rl_synced_table *t = atomic_load(&s->table);
    size_t slot;
    rl_synced_entry *e = probe(t, h, id, value, len, &slot);
    if (e != NULL || atomic_load(&s->n_entries) >= s->max_keys) {
        if (e == NULL)
            atomic_fetch_add(&s->keys_refused, 1);
        pthread_mutex_unlock(&s->insert_lock);
        return e;
    }
    size_t bytes = (sizeof *e + len + RL_CACHE_LINE - 1)
                   / RL_CACHE_LINE * RL_CACHE_LINE;
    e = aligned_alloc(RL_CACHE_LINE, bytes);
    if (e != NULL) {
        memset(e, 0, bytes);
        e->ident = id;
        rl_ident_ref(id);
        atomic_init(&e->limit, limit);
        e->hash = h;
        e->value_len = (uint16_t)len;
        memcpy(e->value, value, len);
        atomic_init(&e->region_share, RL_SYNCED_SHARE_EQUAL);
        first_mark(s, e, rule);
        atomic_store_explicit(&t->slots[slot], e, memory_order_release);
        atomic_fetch_add(&s->n_entries, 1);
    }
    pthread_mutex_unlock(&s->insert_lock);
    return e;
}

/* The key is now checked at limit instead of old: its room and this
 * agent's mark move by the difference (its share of it, of its region's
 * part for a global rule), at once; the next totals work the mark out
 * afresh from the new limit. Rare (a reload, or a key whose override
 * depends on other attributes), so a CAS loop. */
static void retune(const rl_synced *s, rl_synced_entry *e,
                   const rl_rule *rule, uint64_t old, uint64_t limit)
{
    if (!atomic_compare_exchange_strong(&e->limit, &old, limit))
        return; /* another thread did it */
    uint64_t agents = atomic_load_explicit(&e->ident->agents,
                                           memory_order_relaxed);
    uint64_t a = agents > 0 ? agents : 1;
    bool up = limit > old;
    uint64_t diff = region_part(s, e, rule, up ? limit - old : old - limit);
    uint64_t step = (diff + a - 1) / a;
    uint64_t m = atomic_load(&e->mark);
    while (!atomic_compare_exchange_weak(&e->mark, &m,
                                         up ? m + step
                                            : (m > step ? m - step : 0)))
        ;
    uint64_t r = atomic_load(&e->room);
    while (!atomic_compare_exchange_weak(&e->room, &r,
                                         up ? r + diff
                                            : (r > diff ? r - diff : 0)))
        ;
}

/* A global rule's refusal: its region's demand (sync.c reports it). */
static void count_refusal(rl_synced_entry *e, const rl_rule *rule,
                          uint32_t cost)
{
    if (rule->global)
        rl_slot_add(e->refusals, rl_thread_slot(), cost);
}

/* A degraded key of a rule whose on_error is allow or deny: what allow
 * lets through is counted, as any admission (the fleet's totals get it
 * once the aggregator is back), what deny refuses as any refusal. */
static __attribute__((noinline)) int
on_error_decides(rl_synced_entry *e, const rl_rule *rule, uint32_t cost,
                 rl_bucket_reply *out, rl_synced_verdict *verdict)
{
    *out = (rl_bucket_reply){0};
    *verdict = RL_SYNCED_ON_ERROR;
    if (rule->on_error == RL_ON_ERROR_ALLOW)
        rl_slot_add(e->counts, rl_thread_slot(), cost);
    else
        count_refusal(e, rule, cost);
    return RL_OK;
}

/* rl_synced_check's body, for a value's hash h: inlined into both entry
 * points, so that neither pays a call the other does not. */
static inline __attribute__((always_inline)) int
check(rl_synced *s, const rl_rule *rule, rl_ident *id, const rl_limit *rate,
      const char *value, size_t value_len, uint64_t h, uint32_t cost,
      rl_bucket_reply *out, rl_synced_verdict *verdict)
{
    size_t unused;
    rl_synced_entry *e = probe(atomic_load_explicit(&s->table,
                                                    memory_order_acquire),
                               h, id, value, value_len, &unused);
    if (e == NULL)
        e = insert(s, rule, id, rate->limit, value, value_len, h);
    if (e == NULL) {
        /* The key cap is reached (or memory is out): on_error decides. */
        *out = (rl_bucket_reply){0};
        *verdict = RL_SYNCED_ON_ERROR;
        return atomic_load(&s->n_entries) >= s->max_keys ? RL_OK : RL_ENOMEM;
    }
    /* The cut flag sits on the line the mark is read from. */
    *verdict = atomic_load_explicit(&e->cut, memory_order_relaxed)
                   ? RL_SYNCED_CUT
                   : RL_SYNCED_SHARED;
    if (atomic_load_explicit(&e->degraded, memory_order_relaxed)) {
        if (rule->on_error != RL_ON_ERROR_LOCAL)
            return on_error_decides(e, rule, cost, out, verdict);
        /* The mark is this agent's own share now (rl_synced_rebalance). */
        *verdict = RL_SYNCED_LOCAL;
    }
    uint64_t limit = atomic_load_explicit(&e->limit, memory_order_relaxed);
    if (limit != rate->limit)
        retune(s, e, rule, limit, rate->limit);
    uint64_t counted = rl_synced_counted(e);
    uint64_t mark = atomic_load_explicit(&e->mark, memory_order_acquire);
    out->reset_ms = atomic_load_explicit(&e->reset_ms, memory_order_relaxed);
    if (counted + cost > mark) {
        count_refusal(e, rule, cost);
        uint64_t retry = atomic_load_explicit(&e->retry_ms,
                                              memory_order_relaxed);
        out->allowed = false;
        out->remaining = 0;
        out->retry_ms = (int64_t)(retry > 0 ? retry : 1);
        return RL_OK;
    }
    rl_slot_add(e->counts, rl_thread_slot(), cost);
    uint64_t room = atomic_load_explicit(&e->room, memory_order_relaxed);
    /* A hold's give-back can take the count below the mark's. */
    uint64_t at_mark = atomic_load_explicit(&e->counted_at_mark,
                                            memory_order_relaxed);
    uint64_t since = counted + cost > at_mark ? counted + cost - at_mark : 0;
    out->allowed = true;
    out->remaining = room > since ? room - since : 0;
    out->retry_ms = 0;
    return RL_OK;
}

int rl_synced_check(rl_synced *s, const rl_rule *rule, rl_ident *id,
                    const rl_limit *rate,
                    const char *value, size_t value_len, uint32_t cost,
                    rl_bucket_reply *out, rl_synced_verdict *verdict)
{
    return check(s, rule, id, rate, value, value_len,
                 rl_key_hash((uintptr_t)id, value, value_len), cost, out,
                 verdict);
}

int rl_synced_check_hashed(rl_synced *s, const rl_rule *rule, rl_ident *id,
                           const rl_limit *rate, const char *value,
                           size_t value_len, uint64_t value_hash,
                           uint32_t cost, rl_bucket_reply *out,
                           rl_synced_verdict *verdict)
{
    return check(s, rule, id, rate, value, value_len,
                 rl_key_hash_salt(value_hash, (uintptr_t)id), cost, out,
                 verdict);
}

/* How much of a give-back the counts not yet recorded nor reported can
 * take: the estimate is among them only if its check came after the last
 * record began reading them. */
static uint64_t unrecorded_room(const rl_synced_entry *e, uint64_t checked_ns,
                                uint64_t want)
{
    if (checked_ns <= e->recorded_ns)
        return 0;
    uint64_t counted = rl_synced_counted(e);
    uint64_t taken = e->own.counted > e->reported ? e->own.counted
                                                  : e->reported;
    uint64_t left = counted > taken ? counted - taken : 0;
    return left < want ? left : want;
}

void rl_synced_settle(rl_synced *s, rl_ident *id, const char *value,
                      size_t value_len, int64_t delta, uint64_t checked_ns)
{
    /* The I/O thread alone forgets entries: this one stays. */
    rl_synced_entry *e = rl_synced_find(s, id, value, value_len);
    if (e == NULL || delta == 0)
        return;
    if (delta > 0) {
        rl_slot_add(e->counts, rl_thread_slot(), (uint64_t)delta);
        return;
    }
    /* The counters sum modulo 2^64: this thread's slot going below 0
     * leaves the key's count exact. */
    uint64_t want = (uint64_t)-delta;
    uint64_t back = unrecorded_room(e, checked_ns, want);
    rl_slot_add(e->counts, rl_thread_slot(), (uint64_t)0 - back);
    /* The rest was recorded, in the sub-window the next report takes it
     * off (sync.c), if the aggregators read give-backs. */
    if (back < want)
        rl_own_give_back(&e->own, rl_own_window_of(&e->own, checked_ns),
                         want - back);
}

void rl_synced_set_time(rl_synced *s, uint64_t server_ms, uint64_t loop_ms)
{
    s->server_ms = server_ms;
    s->server_at_loop_ms = loop_ms;
}

uint64_t rl_synced_now(const rl_synced *s, uint64_t loop_ms)
{
    if (s->server_ms == 0)
        return 0;
    return s->server_ms + (loop_ms - s->server_at_loop_ms);
}

/* The totals' sub-windows are numbered now / g by the aggregator's period,
 * which a reload that reached one side first makes differ from this
 * agent's. The number says which: read at the message's clock less its
 * lag (totals noted during an interval, and a call's time at Redis), a
 * number of this agent's g is within a few of now / g, and one of
 * another g is off by about now x |1/g - 1/g'|, hundreds of thousands of
 * sub-windows at today's clock for periods that differ by a second. So
 * every old and new aggregator's totals say their period without a field
 * an older agent would refuse. */
static bool numbered_in(const rl_synced *s, uint64_t window, uint64_t now_ms,
                        uint64_t g)
{
    if (now_ms == 0)
        return true;
    uint64_t w = now_ms / g;
    uint64_t lag = 2 + 2 * (uint64_t)s->config->aggregator.sync_interval_ms / g;
    return window <= w + 1 && window + lag >= w;
}

/* The totals noted were numbered in sub-windows of another length (the
 * rule's period changed here): they become the new sub-window of their
 * span's end, recent and oldest together, as late as their requests may
 * have been, though not after now's: they stay in the span as long as
 * they may have to, never less (the limit admits less, never more). */
static void renumber(rl_synced_entry *e, uint64_t g, uint64_t now_ms)
{
    if (e->window_g != g)
        e->mark_window = 0; /* numbered in the old sub-windows */
    if (e->window != 0 && e->window_g != 0 && e->window_g != g) {
        uint64_t w = ((e->window + 1) * e->window_g - 1) / g;
        if (now_ms != 0 && w > now_ms / g)
            w = now_ms / g;
        e->window = w;
        e->current += e->previous;
        e->previous = 0;
        e->n_leaving = 0; /* numbered in the old sub-windows */
    }
    e->window_g = g;
}

/* Another recent than the one the counts after the oldest noted were
 * read with: they may be more than it holds of them (a give-back since),
 * or less. */
static void take_current(rl_synced_entry *e, uint64_t current,
                         uint64_t now_ms)
{
    e->current = current;
    e->current_ms = now_ms;
    e->n_leaving = 0;
}

bool rl_synced_note_totals(rl_synced *s, rl_synced_entry *e, uint64_t window,
                           uint64_t now_ms, uint64_t current,
                           uint64_t previous)
{
    const rl_rule *r = e->ident->io_rule;
    if (r != NULL) {
        uint64_t g = rl_wire_subwindow_ms(r->period_ms);
        if (!numbered_in(s, window, now_ms, g))
            return false;
        renumber(e, g, now_ms);
    }
    /* A reading after this agent's give-back was applied, and after the
     * totals held: it holds the give-back, and may be lower. */
    bool after_back = e->back_ms != 0 && now_ms >= e->back_ms
                      && now_ms >= e->totals_ms;
    if (window > e->window || (window == e->window && after_back)) {
        e->window = window;
        take_current(e, current, now_ms);
        e->previous = previous;
        e->totals_ms = now_ms;
    } else if (window == e->window) {
        /* An equal recent is this message's too: its LEAVING, which an
         * acknowledgement (read in the same call, often) does not carry,
         * may come; counts already had stay as good. */
        if (current > e->current
            || (current == e->current && e->n_leaving == 0))
            take_current(e, current, now_ms);
        e->previous = previous > e->previous ? previous : e->previous;
        e->totals_ms = now_ms > e->totals_ms ? now_ms : e->totals_ms;
    }
    /* Older totals say nothing the newer ones do not. */
    return true;
}

void rl_synced_note_leaving(rl_synced_entry *e, uint64_t window,
                            uint64_t now_ms, const uint64_t *counts,
                            size_t n)
{
    if (window == 0 || window != e->window || now_ms != e->current_ms)
        return;
    e->n_leaving = (uint8_t)(n < RL_WIRE_LEAVING_MAX ? n
                                                     : RL_WIRE_LEAVING_MAX);
    memcpy(e->leaving, counts, e->n_leaving * sizeof *counts);
}

/* The fleet's count in the trailing period as the totals last known hold
 * it, at sub-window w of Redis's clock: once the clock has moved on, the
 * oldest has left the span, and so have the sub-windows of recent before
 * w - N, whose counts LEAVING gave (the others, until fresh totals come,
 * stay: the estimate never undercounts). */
static uint64_t estimate(const rl_synced_entry *e, uint64_t w)
{
    if (e->window == 0 || w <= e->window)
        return e->current + e->previous;
    if (w - e->window > RL_WIRE_SUBWINDOWS)
        return 0; /* all of it has left */
    uint64_t used = e->current;
    for (uint64_t i = 0; i < e->n_leaving && i + 1 < w - e->window; i++)
        used -= e->leaving[i] < used ? e->leaving[i] : used;
    return used;
}

/* What this agent counted that the totals used hold. A fresh share is
 * worked out from the last TOTALS snapshot, which holds the last
 * acknowledged report only if that report was acknowledged before the
 * snapshot was taken; taking it as held when it is not would give out its
 * admissions again. A lowered mark comes from an ack's own totals, which
 * hold its report. */
static uint64_t base(const rl_synced_entry *e, bool fresh_share)
{
    if (!fresh_share || e->acked_ms < e->snap_ms)
        return e->acked;
    return e->acked_prior;
}

/* Redis's clock as the agent knows it, or, before it has heard it (an
 * agent started while no aggregator answers), the wall clock it stands
 * for: own counts need a sub-window whenever they are made, and the wall
 * clock is off Redis's by the hosts' skew only. */
static uint64_t counting_now(const rl_synced *s, uint64_t loop_ms)
{
    uint64_t now = rl_synced_now(s, loop_ms);
    if (now != 0)
        return now;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void rl_synced_record(rl_synced *s, rl_synced_entry *e, uint64_t loop_ms,
                      uint64_t at_ms)
{
    const rl_rule *r = e->ident->io_rule;
    if (r == NULL)
        return;
    uint64_t g = rl_wire_subwindow_ms(r->period_ms);
    uint64_t at = at_ms != 0 ? at_ms : counting_now(s, loop_ms);
    e->recorded_ns = uv_hrtime();
    /* Lengths are whole ms: an odd basis is Redis's clock. */
    uint64_t basis = 2 * g + (s->server_ms != 0);
    rl_own_record(&e->own, at / g, basis, rl_synced_counted(e));
    rl_own_recorded_at(&e->own, e->recorded_ns);
}

bool rl_synced_by_redis(const rl_synced_entry *e)
{
    return e->own.basis % 2 == 1;
}

uint64_t rl_synced_window_start(const rl_synced_entry *e, uint64_t window)
{
    return window * (e->own.basis / 2);
}

/* The first sub-window of the span that ends at w: the trailing period
 * and the oldest sub-window before it. */
static uint64_t span_start(uint64_t w)
{
    return w > RL_WIRE_SUBWINDOWS ? w - RL_WIRE_SUBWINDOWS : 1;
}

/* What the fleet's last totals say of the span that ends at w, while no
 * fresh ones come: their count, leaving the span as this agent's own part
 * of it does. The fleet's counts by sub-window are not known here, this
 * agent's are; the agents of a fleet see a key's traffic in the same
 * moments (a balancer spreads it), and their shares are given at the same
 * ticks, so the fleet's count leaves as this agent's does. An agent that
 * had no part in them lets them leave as the totals' own estimate says:
 * the oldest sub-window first, the rest a period after they were read. */
static uint64_t seed_in_span(const rl_synced_entry *e, uint64_t w)
{
    if (e->seed_own == 0)
        return estimate(e, w);
    uint64_t held = rl_own_since_before(&e->own, span_start(w),
                                        e->seed_counted);
    if (held >= e->seed_own)
        return e->seed_used;
    return (uint64_t)((unsigned __int128)e->seed_used * held / e->seed_own);
}

/* Degraded, the mark is this agent's share of the limit over the span
 * that ends now: the limit less the last totals' count still in it,
 * divided among the agents last known (or the rule's fleet_size), less
 * what this agent counted since those totals, in the span. */
static void degraded_mark(rl_synced *s, rl_synced_entry *e,
                          const rl_rule *r, uint64_t loop_ms)
{
    /* The counts up to now, in the sub-windows of the clock now used (it
     * may have just become Redis's). */
    rl_synced_record(s, e, loop_ms, 0);
    uint64_t now = counting_now(s, loop_ms);
    uint64_t g = rl_wire_subwindow_ms(r->period_ms), w = now / g;
    uint64_t limit = atomic_load_explicit(&e->limit, memory_order_relaxed);
    uint64_t used = seed_in_span(e, w);
    uint64_t room = region_part(s, e, r, limit > used ? limit - used : 0);
    uint64_t share = share_among(s, e, room,
                                 rl_fallback_agents(r, e->ident));
    uint64_t start = span_start(w);
    uint64_t since = rl_own_since(&e->own, start)
                     - rl_own_since_before(&e->own, start, e->seed_counted);
    uint64_t left = share > since ? share - since : 0;
    atomic_store_explicit(&e->counted_at_mark, e->own.counted,
                          memory_order_relaxed);
    atomic_store_explicit(&e->room, left, memory_order_relaxed);
    atomic_store_explicit(&e->mark, e->own.counted + left,
                          memory_order_release);
    atomic_store_explicit(&e->retry_ms, left >= 1 ? 0 : g - now % g,
                          memory_order_relaxed);
    atomic_store_explicit(&e->reset_ms, RL_WIRE_SUBWINDOWS * g - now % g,
                          memory_order_relaxed);
}

/* What a degraded share starts from: the totals last noted, and this
 * agent's part in them by sub-window, kept while they are fresh (worked
 * out again only when they change: a ring that moved on since would have
 * lost the part's oldest sub-windows). */
static void note_seed(rl_synced_entry *e)
{
    uint64_t held = base(e, true);
    /* The count grows within a sub-window (others' reports), the part of
     * it that is this agent's only with held. */
    e->seed_used = e->current + e->previous;
    if (e->window == e->seed_window && held == e->seed_counted)
        return;
    e->seed_window = e->window;
    e->seed_counted = held;
    e->seed_own = e->window > 0 ? rl_own_since_before(&e->own,
                                                      span_start(e->window),
                                                      held)
                                : 0;
}

void rl_synced_degrade(rl_synced_entry *e)
{
    atomic_store_explicit(&e->degraded, true, memory_order_relaxed);
}

void rl_synced_recover(rl_synced_entry *e)
{
    atomic_store_explicit(&e->degraded, false, memory_order_relaxed);
}

bool rl_synced_settled(const rl_synced_entry *e)
{
    return e->acked + e->refused_counts >= e->degraded_counted
           && base(e, true) == e->acked;
}

void rl_synced_rebalance(rl_synced *s, rl_synced_entry *e, uint64_t loop_ms,
                         bool fresh_share)
{
    const rl_rule *r = e->ident->io_rule;
    if (r == NULL)
        return; /* a rule reloaded away: nobody checks it */
    /* A rule reloaded from global to regional: no region is its. */
    if (!r->global && atomic_load_explicit(&e->cut, memory_order_relaxed))
        atomic_store_explicit(&e->cut, false, memory_order_relaxed);
    renumber(e, rl_wire_subwindow_ms(r->period_ms), rl_synced_now(s, loop_ms));
    /* Totals of another period came since the last of its own (a reload
     * on one side only): the totals held miss the acknowledgements since,
     * and a share from them would give those admissions out again. */
    fresh_share = fresh_share && e->foreign_ms == 0;
    if (atomic_load_explicit(&e->degraded, memory_order_relaxed)) {
        degraded_mark(s, e, r, loop_ms);
        return;
    }
    note_seed(e);
    uint64_t now = rl_synced_now(s, loop_ms);
    if (now == 0) {
        if (fresh_share)
            first_mark(s, e, r);
        return;
    }
    uint64_t g = rl_wire_subwindow_ms(r->period_ms);
    uint64_t w = now / g;
    uint64_t used = estimate(e, w);
    uint64_t limit = atomic_load_explicit(&e->limit, memory_order_relaxed);
    uint64_t room = region_part(s, e, r, limit > used ? limit - used : 0);
    uint64_t mark = base(e, fresh_share) + share_of(s, e, room);
    if (fresh_share || mark < atomic_load(&e->mark)) {
        e->mark_window = w;
        atomic_store_explicit(&e->counted_at_mark, rl_synced_counted(e),
                              memory_order_relaxed);
        atomic_store_explicit(&e->room, room, memory_order_relaxed);
        atomic_store_explicit(&e->mark, mark, memory_order_release);
    }
    /* A full key may get room when the next sub-window starts (its oldest
     * leaves the span); what is counted now has left it a period on. */
    uint64_t to_next = g - now % g;
    atomic_store_explicit(&e->retry_ms, room >= 1 ? 0 : to_next,
                          memory_order_relaxed);
    atomic_store_explicit(&e->reset_ms, RL_WIRE_SUBWINDOWS * g - now % g,
                          memory_order_relaxed);
}

/* Not a fresh share: the mark may have come down since it was worked out
 * (an acknowledgement's totals), and a fresh share is only ever worked
 * out from a TOTALS snapshot (the top of this file says why), which an
 * edge inside an interval has no new one of. What the totals held that
 * left the span since is room given back all the same, to every agent at
 * the same edge, each its share. */
void rl_synced_edge(rl_synced *s, rl_synced_entry *e, uint64_t loop_ms)
{
    const rl_rule *r = e->ident->io_rule;
    if (r == NULL)
        return;
    if (atomic_load_explicit(&e->degraded, memory_order_relaxed)) {
        rl_synced_rebalance(s, e, loop_ms, false);
        return;
    }
    uint64_t g = rl_wire_subwindow_ms(r->period_ms);
    uint64_t w = rl_synced_now(s, loop_ms) / g;
    if (e->window_g != g || e->mark_window == 0 || w <= e->mark_window)
        return;
    uint64_t limit = atomic_load_explicit(&e->limit, memory_order_relaxed);
    uint64_t was = estimate(e, e->mark_window), now = estimate(e, w);
    e->mark_window = w;
    if (now >= was)
        return;
    uint64_t before = region_part(s, e, r, limit > was ? limit - was : 0);
    uint64_t after = region_part(s, e, r, limit > now ? limit - now : 0);
    /* Added, not stored: a reload's new limit may move both at once
     * (rl_synced_limit). */
    atomic_fetch_add(&e->mark,
                     share_of(s, e, after) - share_of(s, e, before));
    atomic_fetch_add(&e->room, after - before);
    uint64_t now_ms = rl_synced_now(s, loop_ms);
    atomic_store_explicit(&e->retry_ms, atomic_load(&e->room) >= 1
                                            ? 0 : g - now_ms % g,
                          memory_order_relaxed);
    atomic_store_explicit(&e->reset_ms, RL_WIRE_SUBWINDOWS * g - now_ms % g,
                          memory_order_relaxed);
}

/* Counts a late check made on a retired entry go to the live one. */
static void carry_over(rl_synced *s, rl_synced_entry *old)
{
    uint64_t late = rl_synced_counted(old) - old->reported;
    if (late == 0)
        return;
    rl_synced_entry *e = insert(s, old->ident->io_rule, old->ident,
                                atomic_load(&old->limit),
                                old->value, old->value_len, old->hash);
    if (e != NULL)
        atomic_fetch_add(&e->counts[RL_THREAD_SLOT_SHARED], late);
}

static void free_buried(void *owner, void *table, void *entry, bool all)
{
    if (entry != NULL && !all)
        carry_over(owner, entry);
    free_entry(entry);
    free(table);
}

/* A rule reloaded away keeps its keys only until their counts are
 * acknowledged. */
static bool is_idle(const rl_synced_entry *e, uint64_t loop_ms)
{
    const rl_rule *r = e->ident->io_rule;
    rl_own_part backs[RL_OWN_WINDOWS + 1];
    return e->in_report == 0 && rl_own_backs(&e->own, backs) == 0
           && rl_synced_counted(e) == e->acked + e->refused_counts
           && e->active_ms != 0
           && (r == NULL || loop_ms - e->active_ms > 2 * r->period_ms);
}

void rl_synced_sweep(rl_synced *s, uint64_t loop_ms)
{
    rl_graves_free(&s->graves, false, free_buried, s);
    rl_synced_table *t = atomic_load(&s->table);
    size_t idle = 0;
    for (size_t i = 0; i < t->cap; i++) {
        rl_synced_entry *e = atomic_load(&t->slots[i]);
        if (e != NULL && is_idle(e, loop_ms))
            idle++;
    }
    if (idle == 0)
        return;
    rl_synced_table *fresh = table_new(t->cap);
    if (fresh == NULL)
        return;
    pthread_mutex_lock(&s->insert_lock);
    for (size_t i = 0; i < t->cap; i++) {
        rl_synced_entry *e = atomic_load(&t->slots[i]);
        if (e == NULL)
            continue;
        if (is_idle(e, loop_ms)) {
            rl_graves_add(&s->graves, NULL, e);
            atomic_fetch_sub(&s->n_entries, 1);
            continue;
        }
        size_t j = e->hash & (fresh->cap - 1);
        while (atomic_load(&fresh->slots[j]) != NULL)
            j = (j + 1) & (fresh->cap - 1);
        atomic_init(&fresh->slots[j], e);
    }
    rl_graves_add(&s->graves, t, NULL);
    /* Sequentially consistent (graves.h): a check that still found the
     * old table began before the mark. */
    atomic_store(&s->table, fresh);
    pthread_mutex_unlock(&s->insert_lock);
    rl_graves_mark(&s->graves);
}
