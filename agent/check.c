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

#include "error.h"
#include "keys.h"

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

static int validate(const rl_attr *attrs, size_t n, uint32_t cost)
{
    if ((attrs == NULL && n > 0) || n > RL_ATTRS_MAX || cost == 0)
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

/* Synced and local rules are decided on the caller's thread, with no
 * round trip. */
static int spend_here(rl_agent *a, const rl_rule *rule, rl_ident *id,
                      const rl_attr *attr, uint32_t cost,
                      rl_bucket_reply *reply, bool *degraded)
{
    if (rule->mode == RL_MODE_LOCAL) {
        rl_local_check(&a->local, rule, id, attr->value, attr->value_len,
                       cost, reply, degraded);
        return RL_OK;
    }
    return rl_synced_check(&a->synced, rule, id, attr->value,
                           attr->value_len, cost, reply, degraded);
}

/* The identity of a rule of generation g. */
static rl_ident *ident_of(const rl_gen *g, const rl_rule *rule)
{
    return g->idents[rule - g->config->rules];
}

static int decide_here(rl_agent *a, const rl_gen *g, const rl_attr *attr,
                       uint32_t cost, rl_rule_state *rs)
{
    bool degraded;
    int rc = spend_here(a, rs->rule, ident_of(g, rs->rule), attr, cost,
                        &rs->reply, &degraded);
    rs->outcome = degraded ? RL_OUTCOME_FAILED : RL_OUTCOME_ANSWERED;
    return rc;
}

/* With charge: first_reject, a rejection here means no exact rule is
 * charged. */
static int decide_synced(rl_agent *a, const rl_gen *g, rl_request *req,
                         const rl_attr *attrs, size_t n)
{
    bool rejected = false;
    for (int i = 0; i < req->n_rules; i++) {
        rl_rule_state *rs = &req->rules[i];
        if (rs->rule->mode == RL_MODE_EXACT)
            continue;
        int rc = decide_here(a, g, find_attr(attrs, n, rs->rule->match),
                             req->cost, rs);
        if (rc != RL_OK)
            return rc;
        rejected |= rs->outcome == RL_OUTCOME_ANSWERED && !rs->reply.allowed;
    }
    if (rejected && g->config->charge == RL_CHARGE_FIRST_REJECT) {
        for (int i = 0; i < req->n_rules; i++) {
            if (req->rules[i].outcome == RL_OUTCOME_PENDING)
                req->rules[i].outcome = RL_OUTCOME_SKIPPED;
        }
    }
    return RL_OK;
}

/* Builds the request: one allocation holding the rule states and keys.
 * *out is NULL when no rule applies. */
static int build(rl_agent *a, rl_gen *g, const rl_attr *attrs, size_t n,
                 uint32_t cost, rl_request **out)
{
    const rl_config *cfg = g->config;
    int n_rules = 0;
    size_t key_bytes = 0;
    *out = NULL;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_attr *attr = find_attr(attrs, n, cfg->rules[i].match);
        if (attr == NULL)
            continue;
        int rc = check_value(g, attr);
        if (rc != RL_OK)
            return rc;
        n_rules++;
        key_bytes += strlen(cfg->rules[i].key_prefix) + attr->value_len + 1;
    }
    if (n_rules == 0)
        return RL_OK;
    rl_request *req = calloc(1, sizeof *req + n_rules * sizeof req->rules[0]
                                    + key_bytes);
    if (req == NULL)
        return RL_ENOMEM;
    req->agent = a;
    req->gen = g;
    req->cost = cost;
    req->n_rules = n_rules;
    req->keys = (char *)&req->rules[n_rules];
    size_t offset = 0;
    int k = 0;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_attr *attr = find_attr(attrs, n, cfg->rules[i].match);
        if (attr == NULL)
            continue;
        size_t len;
        rl_key_build(cfg->rules[i].key_prefix, attr->value, attr->value_len,
                     req->keys + offset, key_bytes - offset, &len);
        req->rules[k++] = (rl_rule_state){
            .req = req, .rule = &cfg->rules[i], .args = &g->args[i],
            .key_offset = (uint32_t)offset, .key_len = (uint32_t)len};
        offset += len + 1;
    }
    int rc = decide_synced(a, g, req, attrs, n);
    if (rc != RL_OK) {
        free(req);
        return rc;
    }
    req->deadline_ns = uv_hrtime()
                       + (uint64_t)a->store_config.timeout_ms * 1000000ULL;
    *out = req;
    return RL_OK;
}

/* Common entry checks; on RL_OK the caller counts as active. */
static int enter(rl_agent *a, const rl_attr *attrs, size_t n, uint32_t cost)
{
    if (a == NULL)
        return RL_EINVAL;
    if (a->forks != rl_forks())
        return RL_EFORKED;
    int rc = validate(attrs, n, cost);
    if (rc != RL_OK)
        return rc;
    return rl_calls_enter(&a->calls, &a->closing) ? RL_OK : RL_ECLOSED;
}

static void leave(rl_agent *a)
{
    rl_calls_leave(&a->calls);
}

/* Validates the call and builds its request (NULL when no rule applies)
 * under the current rules, *g. On RL_OK the caller counts as active until
 * it calls leave(). */
static int begin(rl_agent *a, const rl_attr *attrs, size_t n, uint32_t cost,
                 rl_request **req, rl_gen **g)
{
    int rc = enter(a, attrs, n, cost);
    if (rc != RL_OK)
        return rc;
    *g = rl_agent_rules(a);
    rc = build(a, *g, attrs, n, cost, req);
    if (rc != RL_OK)
        leave(a);
    return rc;
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
        rl_decide_unanswered(req->rules, req->n_rules, out);
        return;
    }
    if (rc != 0) {
        /* The I/O thread decided just now; its post is on the way. */
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

/* One rule whose on_error decides (its key over the cap): decided from
 * the reply already had. Spending again through the general path would
 * count the refused key twice. */
static void decide_one_degraded(rl_gen *g, const rl_rule *rule,
                                const rl_bucket_reply *reply,
                                rl_decision *out)
{
    rl_rule_state state = {.rule = rule, .reply = *reply,
                           .outcome = RL_OUTCOME_FAILED};
    rl_decide(&state, 1, out);
    rl_stats_count(&g->stats, &state, 1, out, g->config->rules);
}

/* The common case, one rule: decided and counted without the general
 * machinery. */
static void decide_one_here(rl_agent *a, rl_gen *g, size_t index,
                            const rl_attr *attr, uint32_t cost,
                            rl_decision *out, int *rc)
{
    const rl_rule *rule = &g->config->rules[index];
    rl_bucket_reply reply;
    bool degraded;
    *rc = spend_here(a, rule, g->idents[index], attr, cost, &reply,
                     &degraded);
    if (*rc != RL_OK)
        return;
    if (degraded) {
        decide_one_degraded(g, rule, &reply, out);
        return;
    }
    rl_decide_one(rule, &reply, out);
    rl_stats_count_one(&g->stats, index, reply.allowed);
}

static bool decide_locally(rl_agent *a, rl_gen *g, const rl_attr *attrs,
                           size_t n, uint32_t cost, rl_decision *out, int *rc)
{
    const rl_config *cfg = g->config;
    const rl_attr *values[LOCAL_RULES_MAX];
    size_t index[LOCAL_RULES_MAX];
    int k = 0;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_attr *attr = find_attr(attrs, n, cfg->rules[i].match);
        if (attr == NULL)
            continue;
        if (cfg->rules[i].mode == RL_MODE_EXACT || k == LOCAL_RULES_MAX)
            return false;
        if ((*rc = check_value(g, attr)) != RL_OK)
            return true;
        index[k] = i;
        values[k++] = attr;
    }
    if (k == 1) {
        decide_one_here(a, g, index[0], values[0], cost, out, rc);
        return true;
    }
    rl_rule_state states[LOCAL_RULES_MAX];
    for (int i = 0; i < k; i++)
        states[i] = (rl_rule_state){.rule = &cfg->rules[index[i]]};
    for (int i = 0; i < k; i++) {
        if ((*rc = decide_here(a, g, values[i], cost, &states[i]))
            != RL_OK)
            return true;
    }
    rl_decide(states, k, out);
    rl_stats_count(&g->stats, states, k, out, cfg->rules);
    return true;
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

int rl_check(rl_agent *a, const rl_attr *attrs, size_t n, uint32_t cost,
             rl_decision *out)
{
    if (out == NULL)
        return RL_EINVAL;
    int rc = enter(a, attrs, n, cost);
    if (rc != RL_OK)
        return rc;
    rl_gen *g = rl_agent_rules(a);
    if (decide_locally(a, g, attrs, n, cost, out, &rc)) {
        leave(a);
        return rc;
    }
    rl_request *req;
    rc = build(a, g, attrs, n, cost, &req);
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

int rl_check_async(rl_agent *a, const rl_attr *attrs, size_t n,
                   uint32_t cost, rl_check_fn callback, void *arg)
{
    rl_request *req;
    rl_gen *g;
    int rc = callback != NULL ? begin(a, attrs, n, cost, &req, &g)
                              : RL_EINVAL;
    if (rc != RL_OK)
        return rc;
    if (req == NULL) {
        /* No rule applies: still answered from the I/O thread, as the
         * contract says, through an empty request. */
        req = calloc(1, sizeof *req);
        if (req == NULL) {
            rc = RL_ENOMEM;
        } else {
            req->agent = a;
            req->gen = g;
        }
    }
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
