/*
 * check.c: the gateway thread's side of a check. Everything that can be
 * refused is refused here, before the store sees anything: bad arguments,
 * values too long or holding a NUL. The rules that apply are found and
 * their keys built, in one allocation, and the request goes to the I/O
 * thread. A blocking check then waits on a semaphore until the I/O thread
 * decides, which it does by the deadline at the latest. If the I/O thread
 * itself is held up past the deadline (it resolves a host name while
 * reconnecting, say), the caller stops waiting and decides on its own by
 * on_error: rl_check never blocks much past its deadline. Synced and local
 * rules never reach the I/O thread: they are decided here.
 *
 * A check reads the agent's current rule generation once, after entering,
 * and uses only it: a reload meanwhile changes nothing for it. A request
 * handed to the I/O thread holds a reference to its generation.
 */
#define _GNU_SOURCE /* sem_clockwait: a deadline on the monotonic clock */
#include "agent_impl.h"

#include "config_loader.h"
#include "error.h"
#include "keys.h"
#include "rules.h"
#include "window.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long past the deadline a caller waits for the I/O thread before it
 * decides alone. The I/O thread's own timer normally fires first. */
#define CALLER_GRACE_NS (5 * 1000000ULL)

void rl_request_release(rl_request *req)
{
    if (atomic_fetch_sub(&req->refs, 1) != 1)
        return;
    if (req->callback == NULL)
        sem_destroy(&req->done);
    rl_gen_unref(req->gen);
    free(req);
}

/* The attributes' part of rl_check_validate; a hold's estimate may be 0
 * (a check of room). */
static int validate_attrs(const rl_attr *attrs, size_t n)
{
    if ((attrs == NULL && n > 0) || n > RL_ATTRS_MAX)
        return RL_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (attrs[i].name == NULL || attrs[i].value == NULL)
            return RL_EINVAL;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(attrs[i].name, attrs[j].name) == 0)
                return RL_EINVAL;
        }
    }
    return RL_OK;
}

int rl_check_validate(const rl_attr *attrs, size_t n, uint32_t cost)
{
    return cost == 0 ? RL_EINVAL : validate_attrs(attrs, n);
}

static const rl_attr *find_attr(const rl_attr *attrs, size_t n,
                                const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(attrs[i].name, name) == 0)
            return &attrs[i];
    }
    return NULL;
}

/* Checks the value a rule applies to; the key is built from it later. */
static int check_value(const rl_gen *g, const rl_attr *attr)
{
    if (attr->value_len > g->config->max_value_bytes)
        return RL_ETOOLONG;
    if (attr->value_len == 0 || rl_key_has_nul(attr->value, attr->value_len))
        return RL_EINVAL;
    return RL_OK;
}

/* What a rule makes of a request, when it applies: the value its key is
 * built from, the rate (an override's or its own) and whether it is in
 * shadow. */
typedef struct applied {
    const char *value;
    size_t len;
    const rl_override *override;
    const rl_limit *rate;
    bool shadow;
} applied;

/* Whether the rule at index applies to the request, and how. A rule with
 * nothing but one attribute is found as before issue 15; any other goes
 * through rules.h (every part present, its when, the override). A rule
 * whose override is unlimited does not apply: no count, no store call.
 * buf holds a composite value (RL_VALUE_MAX + 1 bytes). */
static int rule_applies(const rl_gen *g, size_t index, const rl_attr *attrs,
                        size_t n, char *buf, applied *out, bool *applies)
{
    const rl_config *cfg = g->config;
    const rl_rule *r = &cfg->rules[index];
    if (g->args[index].plain) {
        const rl_attr *attr = find_attr(attrs, n, r->match);
        *applies = attr != NULL;
        if (attr == NULL)
            return RL_OK;
        *out = (applied){attr->value, attr->value_len, NULL, &r->own, false};
        return check_value(g, attr);
    }
    const char *value;
    size_t len;
    int rc = rl_rule_value(r, attrs, n, cfg->max_value_bytes, buf,
                           RL_VALUE_MAX + 1, &value, &len, applies);
    if (rc != RL_OK || !*applies)
        return rc;
    const rl_override *o = rl_rule_override(r, attrs, n, value, len);
    const rl_limit *rate = rl_rule_rate(r, o);
    if (rate->unlimited) {
        *applies = false;
        return RL_OK;
    }
    /* A global `shadow: true` is in every rule's shadow (config.c). */
    *out = (applied){value, len, o, rate, r->shadow};
    return RL_OK;
}

/* Synced and local rules are decided on the caller's thread, with no
 * round trip. value_hash is the value's rl_key_hash_value (keys.h), worked
 * out once per check: a rule with overrides uses it for its map too. */
static int spend_here(rl_agent *a, const rl_rule *rule, rl_ident *id,
                      const rl_limit *rate, const char *value, size_t len,
                      uint64_t value_hash, uint32_t cost,
                      rl_bucket_reply *reply, rl_synced_verdict *verdict)
{
    if (rule->mode == RL_MODE_LOCAL) {
        bool over_cap;
        rl_local_check_hashed(&a->local, rule, id, rate, value, len,
                              value_hash, cost, reply, &over_cap);
        *verdict = over_cap ? RL_SYNCED_ON_ERROR : RL_SYNCED_SHARED;
        return RL_OK;
    }
    return rl_synced_check_hashed(&a->synced, rule, id, rate, value, len,
                                  value_hash, cost, reply, verdict);
}

/* A rule decided here that its on_error took part in: a degraded synced
 * key's own share answered (as on_error: local's bucket does for the
 * store's rules), or on_error decides, from its fallback bucket with
 * on_error: local (a key over the cap). Or a global rule's key whose
 * region is cut off: its share answered, the decision is degraded. */
static void settle_degraded(rl_agent *a, const rl_gen *g, rl_rule_state *rs,
                            rl_synced_verdict verdict, const char *value,
                            size_t len, uint32_t cost)
{
    if (verdict == RL_SYNCED_CUT) {
        rs->outcome = RL_OUTCOME_ANSWERED;
        rs->cut = true;
        return;
    }
    rs->outcome = RL_OUTCOME_FAILED;
    if (verdict == RL_SYNCED_LOCAL)
        rs->fallback = true;
    else
        rl_fallback_decide(a, g, rs, value, len, cost);
}

/* The identity of a rule of generation g. */
static rl_ident *ident_of(const rl_gen *g, const rl_rule *rule)
{
    return g->idents[rule - g->config->rules];
}

static int decide_here(rl_agent *a, const rl_gen *g, const char *value,
                       size_t len, uint32_t cost, rl_rule_state *rs)
{
    rl_synced_verdict verdict;
    int rc = spend_here(a, rs->rule, ident_of(g, rs->rule), rs->rate, value,
                        len, rl_key_hash_value(value, len), cost, &rs->reply,
                        &verdict);
    rs->outcome = RL_OUTCOME_ANSWERED;
    if (verdict != RL_SYNCED_SHARED)
        settle_degraded(a, g, rs, verdict, value, len, cost);
    return rc;
}

/* What a hold's end needs of the moment its synced and local rules count
 * the estimate, stamped just before they do: each local fixed window's
 * number (an exact window's call keeps its own) and the time a synced
 * give-back is weighed against (rl_synced_settle). Before, not at the
 * decision, which waits for the store: a count that crosses a window's
 * end or a record's start meets a stamp from before it and the
 * give-back finds nothing to take back (admitting less), where a later
 * stamp would give it to a window, or counts, that never held the
 * estimate. The deadline reads the same time. */
static void stamp_check(rl_request *req)
{
    req->checked_ns = uv_hrtime();
    /* A plain check's end needs no window: no clock read for it. */
    for (int i = 0; req->takes_slots && i < req->n_rules; i++) {
        const rl_rule_state *rs = &req->rules[i];
        const rl_limit *rate = rs->rate != NULL ? rs->rate : &rs->rule->own;
        if (rs->rule->mode == RL_MODE_LOCAL
            && rs->rule->algorithm == RL_ALGO_FIXED_WINDOW)
            req->calls[i].window = rl_window_of(rl_window_wall_ms(),
                                                rate->period_ms);
    }
}

/* With charge: first_reject or atomic, a rejection here means no exact
 * rule is charged (this rule's own count stays: synced and local counts
 * are never taken back); a shadow rule's is not the request's. The value
 * is the key's tail, after the rule's prefix. A leased rule is decided
 * here when its hand can; else it goes to the I/O thread with the exact
 * rules. */
static int decide_synced(rl_agent *a, const rl_gen *g, rl_request *req)
{
    bool rejected = false;
    stamp_check(req);
    for (int i = 0; i < req->n_rules; i++) {
        rl_rule_state *rs = &req->rules[i];
        if (rl_mode_stored(rs->rule->mode))
            continue;
        size_t prefix = strlen(rs->rule->key_prefix);
        const char *value = req->keys + rs->key_offset + prefix;
        size_t len = rs->key_len - prefix;
        if (rs->rule->mode == RL_MODE_LEASED) {
            /* From the hand if it can; else it waits on the I/O thread. */
            if (rl_leased_check(&a->leased, ident_of(g, rs->rule), rs->rate,
                                value, len, rl_key_hash_value(value, len),
                                req->cost, &rs->reply))
                rs->outcome = RL_OUTCOME_ANSWERED;
            else
                rs->via_io = true;
        } else {
            int rc = decide_here(a, g, value, len, req->cost, rs);
            if (rc != RL_OK)
                return rc;
        }
        /* A degraded synced rule rejects too: its share ran out, or
         * on_error: deny. */
        rejected |= !rs->shadow
                    && (rs->outcome == RL_OUTCOME_ANSWERED
                            ? !rs->reply.allowed
                            : rs->outcome == RL_OUTCOME_FAILED
                                  && !rl_unanswered_allows(rs));
    }
    if (rejected && (g->config->charge == RL_CHARGE_FIRST_REJECT
                     || g->config->charge == RL_CHARGE_ATOMIC)) {
        for (int i = 0; i < req->n_rules; i++) {
            if (req->rules[i].outcome == RL_OUTCOME_PENDING)
                req->rules[i].outcome = RL_OUTCOME_SKIPPED;
        }
    }
    return RL_OK;
}

/* The co-location tag of a rule's key (its hash_tag's attribute), or
 * NULL: the rule has none, or the request lacks it (then the untagged key
 * counts it, as before the tag). */
static const rl_attr *tag_of(const rl_rule *r, const rl_attr *attrs,
                             size_t n)
{
    return r->tag_attr[0] != '\0' ? find_attr(attrs, n, r->tag_attr) : NULL;
}

/* The bytes of a rule's key, its NUL included; a tag is checked as a
 * value is. */
static int key_bytes_of(const rl_gen *g, const rl_rule *r,
                        const rl_attr *tag, size_t value_len, size_t *bytes)
{
    *bytes = strlen(r->key_prefix) + value_len + 1;
    if (tag == NULL)
        return RL_OK;
    *bytes += rl_key_tag_bytes(tag->value_len);
    return check_value(g, tag);
}

/* Builds the request: one allocation holding the rule states, the bucket
 * arguments of the exact rules an override applies to (formatted here,
 * for this request: an override's rate goes to the script as it is now),
 * and the keys. *out is NULL when no rule applies. Rules are looked at
 * twice, to size and then to fill the allocation: the exact path waits a
 * round trip, a second lookup is nothing beside it. */
static int build(rl_agent *a, rl_gen *g, const rl_attr *attrs, size_t n,
                 uint32_t cost, bool hold, rl_request **out)
{
    const rl_config *cfg = g->config;
    int n_rules = 0, n_args = 0;
    size_t key_bytes = 0;
    char buf[RL_VALUE_MAX + 1];
    applied ap;
    bool applies;
    *out = NULL;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        int rc = rule_applies(g, i, attrs, n, buf, &ap, &applies);
        if (rc != RL_OK)
            return rc;
        if (!applies)
            continue;
        size_t bytes;
        rc = key_bytes_of(g, &cfg->rules[i], tag_of(&cfg->rules[i], attrs, n),
                          ap.len, &bytes);
        if (rc != RL_OK)
            return rc;
        n_rules++;
        n_args += ap.override != NULL && rl_mode_stored(cfg->rules[i].mode);
        key_bytes += bytes;
    }
    if (n_rules == 0)
        return RL_OK;
    rl_request *req = calloc(1, sizeof *req
                                    + n_rules * (sizeof req->rules[0]
                                                 + sizeof *req->calls)
                                    + n_args * sizeof(rl_bucket_args)
                                    + key_bytes);
    if (req == NULL)
        return RL_ENOMEM;
    req->agent = a;
    req->gen = g;
    req->cost = cost;
    req->takes_slots = hold;
    req->n_rules = n_rules;
    req->calls = (rl_bucket_pending *)&req->rules[n_rules];
    rl_bucket_args *args = (rl_bucket_args *)&req->calls[n_rules];
    req->keys = (char *)&args[n_args];
    size_t offset = 0;
    int k = 0;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        if (rule_applies(g, i, attrs, n, buf, &ap, &applies) != RL_OK
            || !applies)
            continue;
        const rl_rule *r = &cfg->rules[i];
        const rl_bucket_args *ra = &g->args[i];
        if (ap.override != NULL && rl_mode_stored(r->mode)) {
            rl_bucket_args_rate(args, r, ap.rate);
            ra = args++;
        }
        size_t len;
        const rl_attr *tag = tag_of(r, attrs, n);
        rl_key_build_tagged(r->key_prefix, tag ? tag->value : NULL,
                            tag ? tag->value_len : 0, ap.value, ap.len,
                            req->keys + offset, key_bytes - offset, &len);
        req->rules[k++] = (rl_rule_state){
            .req = req, .rule = r, .args = ra, .override = ap.override,
            .rate = ap.rate, .shadow = ap.shadow,
            .key_offset = (uint32_t)offset, .key_len = (uint32_t)len};
        offset += len + 1;
    }
    int rc = decide_synced(a, g, req);
    if (rc != RL_OK) {
        free(req);
        return rc;
    }
    req->deadline_ns = req->checked_ns
                       + (uint64_t)a->store_config.timeout_ms * 1000000ULL;
    *out = req;
    return RL_OK;
}

/* Common entry checks; on RL_OK the caller counts as active. */
static int enter_as(rl_agent *a, const rl_attr *attrs, size_t n,
                    uint32_t cost, bool hold)
{
    if (a == NULL)
        return RL_EINVAL;
    if (a->forks != rl_forks())
        return RL_EFORKED;
    int rc = hold ? validate_attrs(attrs, n) : rl_check_validate(attrs, n,
                                                                 cost);
    if (rc != RL_OK)
        return rc;
    return rl_calls_enter(&a->calls, &a->closing) ? RL_OK : RL_ECLOSED;
}

static int enter(rl_agent *a, const rl_attr *attrs, size_t n, uint32_t cost)
{
    return enter_as(a, attrs, n, cost, false);
}

static void leave(rl_agent *a)
{
    rl_calls_leave(&a->calls);
}

/* Validates the call and builds its request (NULL when no rule applies)
 * under the current rules, *g. On RL_OK the caller counts as active until
 * it calls leave(). */
static int begin(rl_agent *a, const rl_attr *attrs, size_t n, uint32_t cost,
                 bool hold, rl_request **req, rl_gen **g)
{
    int rc = enter_as(a, attrs, n, cost, hold);
    if (rc != RL_OK)
        return rc;
    *g = rl_agent_rules(a);
    rc = build(a, *g, attrs, n, cost, hold, req);
    if (rc != RL_OK)
        leave(a);
    return rc;
}

/* A caller that gave up on the I/O thread decides and counts alone (the
 * I/O thread counts only the requests it claims). Its count needs what
 * each rule's fallback bucket answered, kept here in a copy of the rule
 * states: the request's own may still be written by the I/O thread. */
typedef struct given_up {
    rl_request *req;
    rl_rule_state *states;
} given_up;

static bool answer_and_note(void *arg, const rl_rule_state *rs,
                            rl_bucket_reply *out)
{
    given_up *g = arg;
    bool answered = rl_fallback_answer(g->req, rs, out);
    rl_rule_state *mine = &g->states[rs - g->req->rules];
    mine->fallback = answered;
    if (answered)
        mine->reply = *out;
    return answered;
}

/* What the caller may read of a rule's state: a store rule's fields set
 * before submit, and then FAILED (unanswered); a synced or local rule's
 * whole state, which nobody writes after submit. */
static rl_rule_state given_up_state(const rl_rule_state *rs)
{
    if (!rl_mode_stored(rs->rule->mode) && !rs->via_io)
        return *rs;
    return (rl_rule_state){.req = rs->req, .rule = rs->rule,
                           .args = rs->args, .override = rs->override,
                           .rate = rs->rate, .shadow = rs->shadow,
                           .via_io = rs->via_io,
                           .key_offset = rs->key_offset,
                           .key_len = rs->key_len,
                           .outcome = RL_OUTCOME_FAILED};
}

static void decide_given_up(rl_request *req, rl_decision *out)
{
    enum { ON_STACK = 16 };
    rl_rule_state on_stack[ON_STACK];
    int n = req->n_rules;
    given_up g = {req, n <= ON_STACK ? on_stack
                                     : malloc((size_t)n * sizeof *g.states)};
    if (g.states == NULL) {
        /* No memory to count the rules: decide, count the request. */
        rl_decide_unanswered(req->rules, n, rl_fallback_answer, req, out);
        rl_stats_count(&req->gen->stats, NULL, 0, out,
                       req->gen->config->rules);
        return;
    }
    for (int i = 0; i < n; i++)
        g.states[i] = given_up_state(&req->rules[i]);
    rl_decide_unanswered(req->rules, n, answer_and_note, &g, out);
    rl_stats_count(&req->gen->stats, g.states, n, out,
                   req->gen->config->rules);
    if (g.states != on_stack)
        free(g.states);
}

static void wait_for_decision(rl_request *req, rl_decision *out)
{
    uint64_t until = req->deadline_ns + CALLER_GRACE_NS;
    struct timespec ts = {(time_t)(until / 1000000000ULL),
                          (long)(until % 1000000000ULL)};
    int rc;
    while ((rc = sem_clockwait(&req->done, CLOCK_MONOTONIC, &ts)) != 0
           && errno == EINTR)
        ;
    int expected = RL_OWNER_PENDING;
    if (rc != 0 && atomic_compare_exchange_strong(&req->owner, &expected,
                                                  RL_OWNER_ABANDONED)) {
        /* Reads only what this thread wrote before submitting: safe while
         * the I/O thread still holds the request. */
        decide_given_up(req, out);
        return;
    }
    if (rc != 0) {
        /* The I/O thread is deciding (it claimed the request) or decided
         * just now; its post is on the way. */
        while (sem_wait(&req->done) != 0 && errno == EINTR)
            ;
    }
    /* The semaphore already orders the I/O thread's write of the decision
     * before this read; this acquire load of the CAS that published it says
     * so in a way ThreadSanitizer sees (it does not model sem_clockwait). */
    if (atomic_load(&req->owner) == RL_OWNER_DONE)
        *out = req->decision;
}

/* Requests only synced and local rules apply to are decided right here,
 * with the rule states on the stack: no allocation, no system call, and no
 * lock but a local bucket's. */
#define LOCAL_RULES_MAX 16

static bool any_leased(const rl_rule_state *states, int k)
{
    for (int i = 0; i < k; i++) {
        if (states[i].rule->mode == RL_MODE_LEASED)
            return true;
    }
    return false;
}

/* One rule whose on_error took part (its key over the cap, or degraded),
 * or cut off from a region: decided from the reply already had (or, with on_error: local over the
 * cap, its fallback bucket). Spending again through the general path
 * would count the key twice. */
static void decide_one_degraded(rl_agent *a, rl_gen *g,
                                const rl_rule_state *rs,
                                const rl_bucket_reply *reply,
                                rl_synced_verdict verdict, const char *value,
                                size_t len, uint32_t cost, rl_decision *out)
{
    rl_rule_state state = *rs;
    state.reply = *reply;
    settle_degraded(a, g, &state, verdict, value, len, cost);
    rl_decide(&state, 1, out);
    rl_stats_count(&g->stats, &state, 1, out, g->config->rules);
}

/* One enforced rule at rs's rate: decided and counted without the general
 * machinery. value_hash is the value's rl_key_hash_value. False only for
 * a leased rule whose hand cannot decide: the general way then. */
static bool decide_one(rl_agent *a, rl_gen *g, const rl_rule_state *rs,
                       const char *value, size_t len, uint64_t value_hash,
                       uint32_t cost, rl_decision *out, int *rc)
{
    rl_bucket_reply reply;
    rl_synced_verdict verdict;
    if (rs->rule->mode == RL_MODE_LEASED) {
        *rc = RL_OK;
        if (!rl_leased_check(&a->leased, ident_of(g, rs->rule), rs->rate,
                             value, len, value_hash, cost, &reply))
            return false;
        rl_decide_one(rs->rule, rs->override, rs->rate, &reply, out);
        rl_stats_count_one(&g->stats, (size_t)(rs->rule - g->config->rules),
                           reply.allowed);
        return true;
    }
    *rc = spend_here(a, rs->rule, ident_of(g, rs->rule), rs->rate, value,
                     len, value_hash, cost, &reply, &verdict);
    if (*rc != RL_OK)
        return true;
    if (verdict != RL_SYNCED_SHARED) {
        decide_one_degraded(a, g, rs, &reply, verdict, value, len, cost,
                            out);
        return true;
    }
    rl_decide_one(rs->rule, rs->override, rs->rate, &reply, out);
    rl_stats_count_one(&g->stats, (size_t)(rs->rule - g->config->rules),
                       reply.allowed);
    return true;
}

/* decide_locally for requests some rule of issue 15's kind applies to (a
 * composite key, a when, overrides, shadow): the same, through
 * rule_applies. Apart, so that the plain path keeps its small frame. */
static __attribute__((noinline)) bool
decide_locally_rules(rl_agent *a, rl_gen *g, const rl_attr *attrs, size_t n,
                     uint32_t cost, rl_decision *out, int *rc)
{
    const rl_config *cfg = g->config;
    /* Room for two composite values: a small frame (no stack probes) on
     * a path every request of such rules takes. More composite rules, or
     * more than LOCAL_RULES_MAX rules, go the general way. */
    char arena[2][RL_VALUE_MAX + 1];
    int composites = 0;
    applied aps[LOCAL_RULES_MAX + 1]; /* the last: one rule too many */
    rl_rule_state states[LOCAL_RULES_MAX];
    int k = 0;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        bool applies;
        char *buf = arena[composites < 2 ? composites : 1];
        if ((*rc = rule_applies(g, i, attrs, n, buf, &aps[k], &applies))
            != RL_OK)
            return true;
        if (!applies)
            continue;
        if (rl_mode_stored(cfg->rules[i].mode) || k == LOCAL_RULES_MAX
            || (cfg->rules[i].n_parts > 1 && composites++ == 2))
            return false;
        states[k] = (rl_rule_state){.rule = &cfg->rules[i],
                                    .override = aps[k].override,
                                    .rate = aps[k].rate,
                                    .shadow = aps[k].shadow};
        k++;
    }
    if (k == 1 && !states[0].shadow)
        return decide_one(a, g, &states[0], aps[0].value, aps[0].len,
                          rl_key_hash_value(aps[0].value, aps[0].len), cost,
                          out, rc);
    if (any_leased(states, k))
        return false;
    for (int i = 0; i < k; i++) {
        if ((*rc = decide_here(a, g, aps[i].value, aps[i].len, cost,
                               &states[i])) != RL_OK)
            return true;
    }
    rl_decide(states, k, out);
    rl_stats_count(&g->stats, states, k, out, cfg->rules);
    return true;
}

/* Several synced or local rules, their states made: each decided here,
 * then the request. True when decided (or *rc says why not); false when
 * a leased rule is among them: the general way, which decides what it
 * can here and sends the rest to the I/O thread. */
static bool decide_states(rl_agent *a, rl_gen *g, rl_rule_state *states,
                          const rl_attr *const *values, int k, uint32_t cost,
                          rl_decision *out, int *rc)
{
    if (any_leased(states, k))
        return false;
    for (int i = 0; i < k; i++) {
        if ((*rc = decide_here(a, g, values[i]->value, values[i]->value_len,
                               cost, &states[i])) != RL_OK)
            return true;
    }
    rl_decide(states, k, out);
    rl_stats_count(&g->stats, states, k, out, g->config->rules);
    return true;
}

/* decide_locally for requests plain rules and by_value ones (bucket.h: a
 * rule whose only per-request work is its values overrides) apply to: the
 * plain path plus one lookup in the rule's map, with the value hashed once
 * for the map and the synced table. The general machinery (rule_applies,
 * its buffers, a second hash) took 1.8 times a plain check with 100,000
 * overrides on the rule. Any other rule sends the request the general
 * way. */
static __attribute__((noinline)) bool
decide_locally_values(rl_agent *a, rl_gen *g, const rl_attr *attrs, size_t n,
                      uint32_t cost, rl_decision *out, int *rc)
{
    const rl_config *cfg = g->config;
    /* What applies, in arrays of pointers: rule states are made only when
     * deciding (filling one in the loop, at a variable index, zeroed the
     * whole state with `rep stos`: 13% of a check in perf). */
    const rl_attr *values[LOCAL_RULES_MAX];
    const rl_rule *rules[LOCAL_RULES_MAX];
    const rl_override *overrides[LOCAL_RULES_MAX];
    uint64_t hash = 0;
    int k = 0;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_bucket_args *ra = &g->args[i];
        if (!ra->plain && !ra->by_value)
            return decide_locally_rules(a, g, attrs, n, cost, out, rc);
        const rl_rule *r = &cfg->rules[i];
        const rl_attr *attr = find_attr(attrs, n, r->match);
        if (attr == NULL)
            continue;
        if (rl_mode_stored(r->mode) || k == LOCAL_RULES_MAX)
            return false;
        if ((*rc = check_value(g, attr)) != RL_OK)
            return true;
        const rl_override *o = NULL;
        uint64_t h = 0;
        if (ra->by_value) {
            h = rl_key_hash_value(attr->value, attr->value_len);
            if (r->mode == RL_MODE_SYNCED)
                rl_synced_prefetch(&a->synced, g->idents[i], h);
            o = rl_override_map_find_hashed(r->values, attr->value,
                                            attr->value_len, h);
        }
        if (rl_rule_rate(r, o)->unlimited)
            continue; /* not counted, not in the decision */
        hash = h; /* the last rule's that applies: the only one's if k is 1 */
        rules[k] = r;
        overrides[k] = o;
        values[k++] = attr;
    }
    if (k == 1) {
        const rl_attr *v = values[0];
        const rl_rule *r = rules[0];
        if (!g->args[r - cfg->rules].by_value)
            hash = rl_key_hash_value(v->value, v->value_len);
        rl_rule_state one = {.rule = r, .override = overrides[0],
                             .rate = rl_rule_rate(r, overrides[0])};
        return decide_one(a, g, &one, v->value, v->value_len, hash, cost,
                          out, rc);
    }
    rl_rule_state states[LOCAL_RULES_MAX];
    for (int i = 0; i < k; i++)
        states[i] = (rl_rule_state){.rule = rules[i],
                                    .override = overrides[i],
                                    .rate = rl_rule_rate(rules[i],
                                                         overrides[i])};
    return decide_states(a, g, states, values, k, cost, out, rc);
}

static bool decide_locally(rl_agent *a, rl_gen *g, const rl_attr *attrs,
                           size_t n, uint32_t cost, rl_decision *out, int *rc)
{
    const rl_config *cfg = g->config;
    const rl_attr *values[LOCAL_RULES_MAX];
    size_t index[LOCAL_RULES_MAX];
    int k = 0;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        if (!g->args[i].plain)
            return g->args[i].by_value
                       ? decide_locally_values(a, g, attrs, n, cost, out, rc)
                       : decide_locally_rules(a, g, attrs, n, cost, out, rc);
        const rl_attr *attr = find_attr(attrs, n, cfg->rules[i].match);
        if (attr == NULL)
            continue;
        if (rl_mode_stored(cfg->rules[i].mode) || k == LOCAL_RULES_MAX)
            return false;
        if ((*rc = check_value(g, attr)) != RL_OK)
            return true;
        index[k] = i;
        values[k++] = attr;
    }
    if (k == 1) {
        const rl_rule *r = &cfg->rules[index[0]];
        rl_rule_state one = {.rule = r, .rate = &r->own};
        const rl_attr *v = values[0];
        return decide_one(a, g, &one, v->value, v->value_len,
                          rl_key_hash_value(v->value, v->value_len), cost,
                          out, rc);
    }
    rl_rule_state states[LOCAL_RULES_MAX];
    for (int i = 0; i < k; i++)
        states[i] = (rl_rule_state){.rule = &cfg->rules[index[i]],
                                    .rate = &cfg->rules[index[i]].own};
    return decide_states(a, g, states, values, k, cost, out, rc);
}

/* Whether any rule still waits for Redis (synced ones are decided). */
static bool needs_store(const rl_request *req)
{
    for (int i = 0; i < req->n_rules; i++) {
        if (req->rules[i].outcome == RL_OUTCOME_PENDING)
            return true;
    }
    return false;
}

/* The request decided on the caller's thread, if it can be without a
 * round trip (see decide_locally); false with nothing charged if not. */
static inline bool decide_now(rl_agent *a, rl_gen *g, const rl_attr *attrs,
                              size_t n, uint32_t cost, rl_decision *out,
                              int *rc)
{
    return g->by_value ? decide_locally_values(a, g, attrs, n, cost, out, rc)
                       : decide_locally(a, g, attrs, n, cost, out, rc);
}

int rl_check(rl_agent *a, const rl_attr *attrs, size_t n, uint32_t cost,
             rl_decision *out)
{
    if (out == NULL)
        return RL_EINVAL;
    int rc = enter(a, attrs, n, cost);
    if (rc != RL_OK)
        return rc;
    rl_gen *g = rl_agent_rules(a);
    if (decide_now(a, g, attrs, n, cost, out, &rc)) {
        leave(a);
        return rc;
    }
    /* What it would wait for runs on this very thread. */
    if (a->host_loop && rl_agent_on_loop_thread(a)) {
        leave(a);
        return RL_EAGAIN;
    }
    rl_request *req;
    rc = build(a, g, attrs, n, cost, false, &req);
    if (rc != RL_OK) {
        leave(a);
        return rc;
    }
    if (req == NULL) {
        memset(out, 0, sizeof *out);
        out->allowed = true;
        rl_stats_count(&g->stats, NULL, 0, out, g->config->rules);
    } else if (!needs_store(req)) {
        rl_decide(req->rules, req->n_rules, out);
        rl_stats_count(&g->stats, req->rules, req->n_rules, out,
                       g->config->rules);
        free(req);
    } else {
        sem_init(&req->done, 0, 0);
        atomic_init(&req->owner, RL_OWNER_PENDING);
        atomic_init(&req->refs, 2);
        rl_gen_ref(g);
        rc = rl_agent_submit(a, req);
        if (rc == RL_OK) {
            wait_for_decision(req, out);
            rl_request_release(req);
        } else {
            rl_gen_unref(g);
            sem_destroy(&req->done);
            free(req);
        }
    }
    leave(a);
    return rc;
}

int rl_check_nowait(rl_agent *a, const rl_attr *attrs, size_t n,
                    uint32_t cost, rl_decision *out)
{
    if (out == NULL)
        return RL_EINVAL;
    int rc = enter(a, attrs, n, cost);
    if (rc != RL_OK)
        return rc;
    if (!decide_now(a, rl_agent_rules(a), attrs, n, cost, out, &rc))
        rc = RL_EAGAIN;
    leave(a);
    return rc;
}

/* A request no rule applies to; NULL when out of memory. */
static rl_request *empty_request(rl_agent *a, rl_gen *g)
{
    rl_request *req = calloc(1, sizeof *req);
    if (req != NULL) {
        req->agent = a;
        req->gen = g;
    }
    return req;
}

/* Hands req (NULL: no rule applies) to the I/O thread, which calls
 * callback with its decision; the caller is active (begin) and leaves. */
static int submit_async(rl_agent *a, rl_gen *g, rl_request *req,
                        rl_check_fn callback, void *arg)
{
    int rc = RL_OK;
    /* No rule applies: still answered from the I/O thread, as the
     * contract says, through an empty request. */
    if (req == NULL && (req = empty_request(a, g)) == NULL)
        rc = RL_ENOMEM;
    if (rc == RL_OK) {
        req->callback = callback;
        req->callback_arg = arg;
        atomic_init(&req->refs, 1);
        rl_gen_ref(g);
        rc = rl_agent_submit(a, req);
        if (rc != RL_OK) {
            rl_gen_unref(g);
            free(req);
        }
    }
    leave(a);
    return rc;
}

int rl_check_async(rl_agent *a, const rl_attr *attrs, size_t n,
                   uint32_t cost, rl_check_fn callback, void *arg)
{
    rl_request *req;
    rl_gen *g;
    int rc = callback != NULL ? begin(a, attrs, n, cost, false, &req, &g)
                              : RL_EINVAL;
    if (rc != RL_OK)
        return rc;
    return submit_async(a, g, req, callback, arg);
}

/* A hold's request (NULL: no rule applies) to the I/O thread, which calls
 * callback with its decision and, when allowed, the hold; the caller is
 * active (begin) and leaves. */
static int submit_hold(rl_agent *a, rl_gen *g, rl_request *req,
                       rl_hold_fn callback, void *arg)
{
    rl_hold *h = rl_hold_new(a, callback, arg);
    if (h != NULL && req == NULL)
        req = empty_request(a, g);
    if (h == NULL || req == NULL) {
        rl_hold_discard(h);
        free(req);
        leave(a);
        return RL_ENOMEM;
    }
    rl_hold_bind(h, req);
    int rc = submit_async(a, g, req, rl_hold_decided, h);
    if (rc != RL_OK)
        rl_hold_discard(h);
    return rc;
}

int rl_check_hold(rl_agent *a, const rl_attr *attrs, size_t n,
                  uint32_t estimate, rl_hold_fn callback, void *arg)
{
    rl_request *req;
    rl_gen *g;
    int rc = callback != NULL ? begin(a, attrs, n, estimate, true, &req, &g)
                              : RL_EINVAL;
    if (rc != RL_OK)
        return rc;
    return submit_hold(a, g, req, callback, arg);
}

/* --- One rule, named by the caller ------------------------------------ */

static int rule_index(const rl_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_rules; i++) {
        if (strcmp(cfg->rules[i].name, name) == 0)
            return (int)i;
    }
    return -1;
}

/* The caller's rate as the rule's kind of rate, as an override's is: a
 * synced rule's keeps the rule's period (its aggregator counts one window
 * per rule, in sub-windows of that period: a key counted in another could
 * not be added up) and counts limit per period, with no bucket; any other
 * rule's bucket is countable as a config's (a fixed window counts hits,
 * whatever limit x period: 4,294,967,295 a year is one). */
static int caller_rate(const rl_rule *r, const rl_rate *in, rl_limit *out)
{
    char why[256];
    *out = (rl_limit){.limit = in->limit, .period_ms = in->period_ms,
                      .burst = in->burst != 0 ? in->burst : in->limit};
    if (out->limit == 0 || out->period_ms == 0)
        return RL_EINVAL;
    if (r->mode == RL_MODE_SYNCED)
        return out->period_ms == r->own.period_ms
                       && out->limit <= RL_LIMIT_MAX
                   ? RL_OK
                   : RL_EINVAL;
    if (r->algorithm != RL_ALGO_FIXED_WINDOW
        && !rl_config_rate_countable(out, why, sizeof why))
        return RL_EINVAL;
    return RL_OK;
}

/* The request of one rule for value: its state, its rate (the caller's, or
 * the rule's own when rate is NULL), the bucket arguments of that rate for
 * an exact rule, and the key, in one allocation. */
static int build_rule(rl_agent *a, rl_gen *g, int index, const char *value,
                      size_t len, const rl_rate *rate, uint32_t cost,
                      bool hold, rl_request **out)
{
    const rl_rule *r = &g->config->rules[index];
    rl_limit limit;
    int rc = rate != NULL ? caller_rate(r, rate, &limit) : RL_OK;
    if (rc != RL_OK)
        return rc;
    size_t key_bytes = strlen(r->key_prefix) + len + 1;
    rl_request *req = calloc(1, sizeof *req + sizeof req->rules[0]
                                    + sizeof *req->calls + sizeof limit
                                    + sizeof(rl_bucket_args) + key_bytes);
    if (req == NULL)
        return RL_ENOMEM;
    *req = (rl_request){.agent = a, .gen = g, .cost = cost,
                        .takes_slots = hold, .n_rules = 1};
    req->calls = (rl_bucket_pending *)&req->rules[1];
    rl_limit *own = (rl_limit *)&req->calls[1];
    rl_bucket_args *args = (rl_bucket_args *)&own[1];
    req->keys = (char *)&args[1];
    *own = rate != NULL ? limit : r->own;
    if (rate != NULL)
        rl_bucket_args_rate(args, r, own);
    size_t key_len;
    rl_key_build_tagged(r->key_prefix, NULL, 0, value, len, req->keys,
                        key_bytes, &key_len);
    req->rules[0] = (rl_rule_state){
        .req = req, .rule = r,
        .args = rate != NULL ? args : &g->args[index],
        .rate = own, .shadow = r->shadow,
        .key_len = (uint32_t)key_len};
    if ((rc = decide_synced(a, g, req)) != RL_OK) {
        free(req);
        return rc;
    }
    req->deadline_ns = req->checked_ns
                       + (uint64_t)a->store_config.timeout_ms * 1000000ULL;
    *out = req;
    return RL_OK;
}

/* rl_check_rule_async's request, under the current rules, *g; on RL_OK
 * the caller counts as active until it calls leave(). */
static int begin_rule(rl_agent *a, const char *rule, const char *value,
                      size_t len, const rl_rate *rate, uint32_t cost,
                      bool hold, rl_request **req, rl_gen **g)
{
    if (a == NULL || rule == NULL || value == NULL)
        return RL_EINVAL;
    if (a->forks != rl_forks())
        return RL_EFORKED;
    if (!rl_calls_enter(&a->calls, &a->closing))
        return RL_ECLOSED;
    *g = rl_agent_rules(a);
    int index = rule_index((*g)->config, rule);
    rl_attr attr = {rule, value, len};
    int rc = index < 0 ? RL_EINVAL : check_value(*g, &attr);
    *req = NULL;
    if (rc == RL_OK)
        rc = build_rule(a, *g, index, value, len, rate, cost, hold, req);
    if (rc != RL_OK)
        leave(a);
    return rc;
}

int rl_check_rule_async(rl_agent *a, const char *rule, const char *value,
                        size_t len, const rl_rate *rate, uint32_t cost,
                        rl_check_fn callback, void *arg)
{
    rl_request *req;
    rl_gen *g;
    int rc = callback != NULL
                 ? begin_rule(a, rule, value, len, rate, cost, false, &req,
                              &g)
                 : RL_EINVAL;
    if (rc != RL_OK)
        return rc;
    return submit_async(a, g, req, callback, arg);
}

int rl_check_rule_hold(rl_agent *a, const char *rule, const char *value,
                       size_t len, const rl_rate *rate, uint32_t estimate,
                       rl_hold_fn callback, void *arg)
{
    rl_request *req;
    rl_gen *g;
    int rc = callback != NULL
                 ? begin_rule(a, rule, value, len, rate, estimate, true,
                              &req, &g)
                 : RL_EINVAL;
    if (rc != RL_OK)
        return rc;
    return submit_hold(a, g, req, callback, arg);
}
