/*
 * rls_service.c: one ShouldRateLimit call (rls_service.h). The request is
 * decoded and each descriptor's limit found first, so that `replaces` can
 * drop the limits another one replaces; then each limited descriptor is
 * one rl check, all out at once, and the response is built when the last
 * has answered. What the response needs of a limit (its name, rate, unit)
 * is copied into the call: a reload may free the config meanwhile.
 *
 * With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, upstream's two steps: each
 * limit is read first (a check of cost 0), then counted by what the read
 * found: every descriptor its hits when none would go over, else only the
 * ones that would (the others are read again, at cost 0).
 */
#include "rls_service.h"
#include "rls_arena.h"

#include "envoy/service/ratelimit/v3/rls.pb-c.h"
#include "keys.h"
#include "resp.h"
#include "rls_stat_key.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef Envoy__Service__Ratelimit__V3__RateLimitRequest request;
typedef Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor
    descriptor;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse response;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus
    status;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit
    rate_limit;
typedef Envoy__Config__Core__V3__HeaderValue header;

#define UINT32_ALL 4294967295u

/* One descriptor's part of the call. */
typedef struct slot {
    rls_call *call;
    bool limited;       /* a limit applies: a current_limit to answer */
    bool unlimited;
    bool shadow;
    bool quota;
    bool over;
    bool waiting;       /* its check is out */
    uint32_t hits;      /* what the request counts against it */
    const char *rule;   /* the rl rule it is checked by */
    bool deny;          /* its on_error: deny */
    uint32_t burst;     /* a token bucket's, 0: rpu */
    uint32_t rpu;
    rls_unit unit;
    char *name;         /* the limit's, copied; NULL for none */
    uint32_t remaining;
    int64_t reset_s;
    rls_series *series; /* its counters (USE_PROMETHEUS), or NULL */
    /* rl: {hold}: the request's id (its entry's value, while the call
     * starts; NULL: no hold), the first call's charge (0: its hits), and
     * the entry its hold check is to decide. */
    const char *id;
    size_t id_len;
    const char *id_key;
    uint32_t estimate;
    bool in_flight;     /* its hold is a slot: one a request */
    rls_hold_entry *entry;
} slot;

struct rls_call {
    rls_reply_fn fn;
    void *arg;
    const rls_options *o;
    rl_agent *agent;
    rls_pool *pool;
    bool cancelled;     /* answered already (or its client is gone) */
    bool reading;       /* the first of the two steps' checks are out */
    bool degraded;      /* a check or the call's deadline: on_error */
    bool expired;       /* answered at the call's deadline */
    int pending;        /* checks out, plus one while starting */
    char (*values)[RLS_VALUE_MAX + 1];  /* each descriptor's rl value */
    size_t *lens;
    size_t n;
    slot slots[];
};

/* --- The value a descriptor counts under ------------------------------- */

static size_t put_part(char *out, size_t at, const char *bytes, size_t len)
{
    /* By hand: snprintf was 7 % of a call's instructions. */
    char head[24];
    size_t h = 0;
    if (at > 0)
        head[h++] = ':';
    h += rl_resp_unsigned(head + h, len);
    head[h++] = ':';
    size_t room = 4 * RLS_VALUE_MAX;
    if (at < room)
        memcpy(out + at, head, h < room - at ? h : room - at);
    at += h;
    if (at < room)
        memcpy(out + at, bytes, len < room - at ? len : room - at);
    return at + len;
}

size_t rls_descriptor_value(const char *domain, const rls_entry *entries,
                            size_t n, const char *const *shared, char *out)
{
    /* Written whole into a scratch of four times the cap, hashed when
     * longer: the hash is of every byte, the scratch only what fits. */
    char scratch[4 * RLS_VALUE_MAX];
    size_t at = put_part(scratch, 0, domain, strlen(domain));
    uint64_t h = rl_key_hash_value(domain, strlen(domain));
    for (size_t i = 0; i < n; i++) {
        const char *v = shared != NULL && shared[i] != NULL ? shared[i]
                                                            : entries[i].value;
        size_t vlen = v == entries[i].value ? entries[i].value_len
                                            : strlen(v);
        at = put_part(scratch, at, entries[i].key, entries[i].key_len);
        at = put_part(scratch, at, v, vlen);
        h = h * 31 + rl_key_hash_value(entries[i].key, entries[i].key_len);
        h = h * 31 + rl_key_hash_value(v, vlen);
    }
    if (at <= RLS_VALUE_MAX) {
        memcpy(out, scratch, at);
        return at;
    }
    /* The first bytes say what it is; the hash, of the whole, which. */
    size_t keep = RLS_VALUE_MAX - 18;
    memcpy(out, scratch, keep);
    return keep + (size_t)snprintf(out + keep, 19, ":#%016llx",
                                   (unsigned long long)h);
}

/* --- Finding the limits ------------------------------------------------ */

/* The hits a descriptor counts: its own hits_addend (0 included), else
 * the request's, at least 1 (upstream's GetHitsAddends). */
static uint64_t hits_of(const request *r, const descriptor *d)
{
    if (d->hits_addend != NULL)
        return d->hits_addend->value;
    return r->hits_addend > 0 ? r->hits_addend : 1;
}

static void take_limit(slot *s, const rls_limit *l, const rls_options *o)
{
    s->rule = o->rule_of != NULL ? o->rule_of(l) : o->rule;
    s->burst = l->burst;
    s->deny = l->deny_on_error;
    s->limited = !l->unlimited;
    s->unlimited = l->unlimited;
    s->shadow = l->shadow_mode;
    s->quota = l->quota_mode;
    s->rpu = l->requests_per_unit;
    s->unit = l->unit;
    s->name = l->name;  /* the config's, until copied */
    s->estimate = l->hold_estimate;
    s->in_flight = l->in_flight > 0;
}

/* With a hold, the entries counted (all but the id's, which s takes) and
 * their shared patterns; n_out of them. Without, or with no entry of the
 * id's key in the request, all of them and no hold. */
static void counted_entries(slot *s, const rls_limit *l, rls_entry *entries,
                            size_t n, const char **shared, size_t *n_out)
{
    *n_out = n;
    if (l->hold_id == NULL)
        return;
    size_t kept = 0, key_len = strlen(l->hold_id);
    for (size_t i = 0; i < n; i++) {
        if (entries[i].key_len == key_len
            && memcmp(entries[i].key, l->hold_id, key_len) == 0) {
            if (s->id == NULL) {
                s->id = entries[i].value;
                s->id_len = entries[i].value_len;
                s->id_key = l->hold_id;
            }
            continue;
        }
        shared[kept] = shared[i];
        entries[kept++] = entries[i];
    }
    *n_out = kept;
}

/* A descriptor's entries as lookups take them; false for more than a
 * lookup walks (no limit then, as upstream finds none that deep). */
static bool entries_of(const descriptor *d, rls_entry *out)
{
    if (d->n_entries > RLS_ENTRIES_MAX)
        return false;
    for (size_t i = 0; i < d->n_entries; i++)
        out[i] = (rls_entry){d->entries[i]->key, strlen(d->entries[i]->key),
                             d->entries[i]->value,
                             strlen(d->entries[i]->value)};
    return true;
}

/* The labels of a limited descriptor's counters into labels (NULL: no
 * metrics); none (the overflow series) without memory. */
static void stat_labels(const request *r, const rls_entry *entries,
                        size_t n, const rls_match *m, char *labels,
                        size_t *labels_len)
{
    if (labels == NULL)
        return;
    long len = rls_stat_labels(r->domain, entries, n, m, labels);
    *labels_len = len > 0 ? (size_t)len : 0;
}

/* Finds descriptor i's limit (*found: the config's, NULL for none or the
 * descriptor's own) and, for a limited one, its value and its counters'
 * labels. */
static void find_limit(const rls_config *cfg, const rls_options *o,
                       const request *r, size_t i, slot *s,
                       const rls_limit **found, char *value,
                       size_t *value_len, char *labels, size_t *labels_len)
{
    const descriptor *d = r->descriptors[i];
    const rls_domain *dom = rls_config_domain(cfg, r->domain,
                                              strlen(r->domain));
    rls_entry entries[RLS_ENTRIES_MAX];
    *found = NULL;
    if (dom == NULL || !entries_of(d, entries))
        return;
    rls_match m = {0};
    if (d->limit != NULL) {
        /* The descriptor's own limit: used as it is, never in shadow. */
        int unit = (int)d->limit->unit;
        if (unit <= 0 || unit > (int)RLS_UNIT_WEEK)
            return;
        s->limited = true;
        s->rule = o->rule;
        s->rpu = d->limit->requests_per_unit;
        s->unit = (rls_unit)unit;
        s->name = "";
        stat_labels(r, entries, d->n_entries, NULL, labels, labels_len);
    } else {
        rls_config_lookup(dom, entries, d->n_entries, &m);
        if (m.limit == NULL)
            return;
        take_limit(s, m.limit, o);
        *found = m.limit;
        stat_labels(r, entries, d->n_entries, &m, labels, labels_len);
    }
    size_t n = d->n_entries;
    if (*found != NULL)
        counted_entries(s, *found, entries, n, m.shared, &n);
    *value_len = rls_descriptor_value(r->domain, entries, n, m.shared,
                                      value);
}

/* Whether a found limit (unlimited ones too) replaces the named one. */
static bool replaced(const rls_limit *const *found, size_t n,
                     const char *name)
{
    if (name == NULL || name[0] == '\0')
        return false;
    for (size_t j = 0; j < n; j++) {
        for (size_t k = 0; found[j] != NULL && k < found[j]->n_replaces;
             k++) {
            if (strcmp(found[j]->replaces[k], name) == 0)
                return true;
        }
    }
    return false;
}

/* --- The response ------------------------------------------------------ */

static int64_t seconds_to_reset(rls_unit unit)
{
    int64_t sec = (int64_t)rls_unit_seconds(unit);
    return sec - (int64_t)time(NULL) % sec;
}

/* The status whose numbers the RateLimit headers carry: the last over
 * the limit, else the one with the least remaining (upstream's). */
static const slot *headed_by(const rls_call *c)
{
    const slot *min = NULL;
    for (size_t i = 0; i < c->n; i++) {
        const slot *s = &c->slots[i];
        if (!s->limited)
            continue;
        if (s->over && !s->shadow && !s->quota && !c->o->quota_mode)
            min = s;
        else if (min == NULL || (!(min->over && !min->shadow)
                                 && s->remaining < min->remaining))
            min = s;
    }
    return min;
}

static void header_value(header *h, const char *key, char *buf, size_t cap,
                         unsigned long long v)
{
    snprintf(buf, cap, "%llu", v);
    *h = (header)ENVOY__CONFIG__CORE__V3__HEADER_VALUE__INIT;
    h->key = (char *)key;
    h->value = buf;
}

/* upstream's overall code: OVER_LIMIT when a descriptor is over that is
 * no quota, or when every quota descriptor is (SHADOW_MODE then makes it
 * OK). */
static bool overall_over(const rls_call *c)
{
    int quotas = 0, quotas_over = 0;
    for (size_t i = 0; i < c->n; i++) {
        const slot *s = &c->slots[i];
        bool over = s->limited && s->over && !s->shadow;
        if (s->limited && (s->quota || c->o->quota_mode)) {
            quotas++;
            quotas_over += over;
        } else if (over) {
            return true;
        }
    }
    return quotas > 0 && quotas == quotas_over;
}

static void fill_status(const slot *s, status *st, rate_limit *rl,
                        Google__Protobuf__Duration *reset)
{
    *st = (status)
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__DESCRIPTOR_STATUS__INIT;
    st->code = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OK;
    if (s->unlimited)
        st->limit_remaining = UINT32_ALL;
    if (!s->limited)
        return;
    if (s->over && !s->shadow)
        st->code =
            ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT;
    *rl = (rate_limit)
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__RATE_LIMIT__INIT;
    rl->name = s->name != NULL ? s->name : "";
    rl->requests_per_unit = s->rpu;
    rl->unit = (Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit__Unit)
                   s->unit;
    *reset = (Google__Protobuf__Duration)GOOGLE__PROTOBUF__DURATION__INIT;
    reset->seconds = s->reset_s;
    st->current_limit = rl;
    st->limit_remaining = s->over ? 0 : s->remaining;
    st->duration_until_reset = reset;
}

static void answer(rls_call *c)
{
    size_t n = c->n;
    rls_arena arena;
    rls_arena_init(&arena);
    status *st = rls_arena_alloc(&arena, n * sizeof *st);
    status **sp = rls_arena_alloc(&arena, n * sizeof *sp);
    rate_limit *rl = rls_arena_alloc(&arena, n * sizeof *rl);
    Google__Protobuf__Duration *reset = rls_arena_alloc(&arena,
                                                        n * sizeof *reset);
    if (st == NULL || sp == NULL || rl == NULL || reset == NULL) {
        c->fn(c->arg, RLS_GRPC_INTERNAL, NULL, 0, "out of memory");
    } else {
        response r = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__INIT;
        for (size_t i = 0; i < n; i++) {
            fill_status(&c->slots[i], &st[i], &rl[i], &reset[i]);
            sp[i] = &st[i];
        }
        bool over = overall_over(c);
        if (over && c->o->shadow_mode)
            rls_metrics_event(c->o->metrics, RLS_EV_GLOBAL_SHADOW_MODE);
        r.overall_code =
            over && !c->o->shadow_mode
                ? ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT
                : ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OK;
        r.n_statuses = n;
        r.statuses = sp;
        header h[3], *hp[3] = {&h[0], &h[1], &h[2]};
        char values[3][24];
        const slot *head = c->o->headers ? headed_by(c) : NULL;
        if (head != NULL) {
            header_value(&h[0], c->o->limit_header, values[0], 24, head->rpu);
            header_value(&h[1], c->o->remaining_header, values[1], 24,
                         head->over ? 0 : head->remaining);
            header_value(&h[2], c->o->reset_header, values[2], 24,
                         (unsigned long long)seconds_to_reset(head->unit));
            r.n_response_headers_to_add = 3;
            r.response_headers_to_add = hp;
        }
        header degraded = ENVOY__CONFIG__CORE__V3__HEADER_VALUE__INIT,
               *dp = &degraded;
        if (c->degraded) {
            rls_metrics_event(c->o->metrics, c->expired
                                                 ? RLS_EV_DEGRADED_DEADLINE
                                                 : RLS_EV_DEGRADED_STORE);
            /* To the upstream request, not the client's response: the
             * service, not the client, needs to know. */
            degraded.key = RLS_DEGRADED_HEADER;
            degraded.value = "true";
            r.n_request_headers_to_add = 1;
            r.request_headers_to_add = &dp;
        }
        size_t len = envoy__service__ratelimit__v3__rate_limit_response__get_packed_size(&r);
        uint8_t *buf = rls_arena_alloc(&arena, len);
        if (buf == NULL) {
            c->fn(c->arg, RLS_GRPC_INTERNAL, NULL, 0, "out of memory");
        } else {
            envoy__service__ratelimit__v3__rate_limit_response__pack(&r, buf);
            c->fn(c->arg, RLS_GRPC_OK, buf, len, NULL);
        }
    }
    rls_arena_free(&arena);
}

static void free_call(rls_call *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->slots[i].name);
        /* A hold whose check never went holds nothing. */
        if (c->slots[i].entry != NULL)
            rls_holds_decided(c->o->holds, c->slots[i].entry, NULL);
    }
    rls_pool_free(c->pool, c);
}

static bool count_after_read(rls_call *c);

static void one_less(rls_call *c)
{
    if (--c->pending > 0)
        return;
    if (c->reading && !c->cancelled) {
        c->reading = false;
        c->pending = 1;
        if (count_after_read(c))
            return;
    }
    if (!c->cancelled)
        answer(c);
    free_call(c);
}

/* --- Counting (USE_PROMETHEUS) ---------------------------------------- */

/* Hits within the limit that are near it, by upstream's arithmetic
 * (checkNearLimitThreshold): the count after them over ratio x the limit
 * (float32, rounded down), and of them, those past it. The count is the
 * limit less what remains (a token bucket's: its size less its tokens). */
static uint64_t near_hits(const slot *s, float ratio)
{
    uint64_t size = s->burst > 0 ? s->burst : s->rpu;
    uint64_t after = s->remaining < size ? size - s->remaining : 0;
    uint64_t before = after > s->hits ? after - s->hits : 0;
    uint64_t near = (uint64_t)floor((double)((float)size * ratio));
    if (after <= near)
        return 0;
    return before >= near ? s->hits : after - near;
}

/* A descriptor's hits into its limit's counters, once decided. A hit over
 * the limit counts all its hits over: the decision does not carry the
 * count that would split a hits_addend across the limit as upstream does.
 * One decided by on_error is never near: nothing is known of the count. */
static void count(const rls_call *c, const slot *s, bool by_on_error)
{
    if (s->series == NULL)
        return;
    rls_hits h = {.total = s->hits};
    if (s->over) {
        h.over = s->hits;
        h.shadow = s->shadow ? s->hits : 0;
    } else {
        h.within = s->hits;
        h.near = by_on_error ? 0 : near_hits(s, c->o->near_limit_ratio);
    }
    rls_series_count(s->series, &h);
}

static void on_checked(const rl_decision *d, void *arg)
{
    slot *s = arg;
    /* Decided already when the call's deadline came first. */
    if (s->waiting) {
        s->waiting = false;
        s->call->degraded |= d->degraded;
        s->over = !d->allowed;
        s->remaining = d->remaining < UINT32_ALL ? (uint32_t)d->remaining
                                                 : UINT32_ALL;
        uint64_t ms = d->allowed || d->retry_after_ms <= 0
                          ? d->reset_ms
                          : (uint64_t)d->retry_after_ms;
        s->reset_s = (int64_t)((ms + 999) / 1000);
        if (s->reset_s == 0)
            s->reset_s = seconds_to_reset(s->unit);
        count(s->call, s, d->degraded);
    }
    one_less(s->call);
}

static void on_held(const rl_decision *d, rl_hold *hold, void *arg)
{
    slot *s = arg;
    rls_holds_decided(s->call->o->holds, s->entry, hold);
    s->entry = NULL;
    on_checked(d, arg);
}

/* --- The call ---------------------------------------------------------- */

static rls_call *fail(rls_reply_fn fn, void *arg, rls_arena *arena,
                      rls_grpc_status st, const char *message)
{
    fn(arg, st, NULL, 0, message);
    rls_arena_free(arena);
    return NULL;
}

/* Why a request cannot be served at all, in upstream's words; NULL if it
 * can. */
static const char *refusal(const request *r, const rls_config *cfg,
                           char *buf, size_t cap)
{
    if (r->domain[0] == '\0')
        return "rate limit domain must not be empty";
    if (r->n_descriptors == 0)
        return "rate limit descriptor list must not be empty";
    if (cfg == NULL)
        return "no rate limit configuration loaded";
    if (r->n_descriptors > RLS_DESCRIPTORS_MAX) {
        snprintf(buf, cap, "%zu descriptors, more than %d in one request",
                 r->n_descriptors, RLS_DESCRIPTORS_MAX);
        return buf;
    }
    for (size_t i = 0; i < r->n_descriptors; i++) {
        uint64_t hits = hits_of(r, r->descriptors[i]);
        if (hits > UINT32_ALL) {
            snprintf(buf, cap, "descriptor %zu: hits_addend %llu is more "
                     "than %u", i, (unsigned long long)hits, UINT32_ALL);
            return buf;
        }
    }
    return NULL;
}

/* Sends descriptor i's check of cost hits; false when it could not go
 * (the reason in *rc). A limit of 0 is over for any hit, with no check. */
static bool send_check(rls_call *c, size_t i, uint32_t cost, int *rc)
{
    slot *s = &c->slots[i];
    if (s->rpu == 0) {
        s->over = s->hits > 0;
        s->reset_s = seconds_to_reset(s->unit);
        count(c, s, false);
        return true;
    }
    rl_rate rate = {s->rpu, rls_unit_seconds(s->unit) * 1000, s->burst};
    c->pending++;
    s->waiting = true;
    /* A hold's check counts (a read of the two steps holds nothing). */
    if (s->entry != NULL && !c->reading)
        *rc = rl_check_rule_hold(c->agent, s->rule, c->values[i],
                                 c->lens[i], &rate, cost, on_held, s);
    else
        *rc = rl_check_rule_async(c->agent, s->rule, c->values[i],
                                  c->lens[i], &rate, cost, on_checked, s);
    if (*rc == RL_OK)
        return true;
    s->waiting = false;
    c->pending--;
    return false;
}

/* What the read found: the request's hits would take the limit over
 * (upstream: count + hits > requests_per_unit). A limit of 0 was not
 * read: over for any hit. */
static bool would_go_over(const slot *s)
{
    return s->limited && (s->over || s->remaining < s->hits);
}

/* The second of the two steps (one_less, once the reads are in): each
 * limit counted by upstream's rule (its getHitsAddend). False when
 * nothing was sent: the call is to be answered (an error, if a check
 * could not go) and freed. */
static bool count_after_read(rls_call *c)
{
    bool any_over = false;
    for (size_t i = 0; i < c->n; i++)
        any_over |= would_go_over(&c->slots[i]);
    int rc = RL_OK;
    for (size_t i = 0; i < c->n && rc == RL_OK; i++) {
        slot *s = &c->slots[i];
        if (!s->limited || s->rpu == 0)
            continue;
        uint32_t cost = !any_over || would_go_over(s) ? s->hits : 0;
        send_check(c, i, cost, &rc);
    }
    if (rc != RL_OK) {
        c->cancelled = true;
        c->fn(c->arg, rc == RL_ECLOSED ? RLS_GRPC_UNAVAILABLE
                                       : RLS_GRPC_INTERNAL,
              NULL, 0, rl_strerror(rc));
    }
    return --c->pending > 0;
}

/* A descriptor with a hold, before its check: the first call of its key
 * opens the hold (charged the estimate), the next (Envoy's stream-done
 * call) ends it at its hits and is answered OK, checking nothing. With
 * the table full, the call is counted as one with no hold. The key is the
 * descriptor's value and the request's id. */
static void take_hold(rls_call *c, slot *s, size_t i)
{
    if (s->id == NULL || c->o->holds == NULL)
        return;
    char domain[RLS_VALUE_MAX + 1], key[RLS_VALUE_MAX + 1];
    memcpy(domain, c->values[i], c->lens[i]);
    domain[c->lens[i]] = '\0';
    rls_entry id = {s->id_key, strlen(s->id_key), s->id, s->id_len};
    size_t len = rls_descriptor_value(domain, &id, 1, NULL, key);
    /* A slot is one a request, whatever the calls' hits. */
    uint32_t estimate = s->in_flight       ? 1
                        : s->estimate > 0 ? s->estimate
                                          : s->hits;
    uint32_t actual = s->in_flight ? 1 : s->hits;
    rls_hold_entry *e = NULL;
    switch (rls_holds_take(c->o->holds, key, len, estimate, actual, &e)) {
    case RLS_HOLDS_OPENED:
        s->entry = e;
        s->hits = estimate;
        break;
    case RLS_HOLDS_ENDED:
        s->limited = false;
        break;
    case RLS_HOLDS_FULL:
        break;
    }
}

/* Copies the names the response needs out of the config. */
static bool keep_names(rls_call *c)
{
    for (size_t i = 0; i < c->n; i++) {
        const char *name = c->slots[i].name;
        c->slots[i].name = NULL;
        if (name != NULL && (c->slots[i].name = strdup(name)) == NULL)
            return false;
    }
    return true;
}

rls_call *rls_should_rate_limit(rl_agent *agent, rls_pool *pool,
                                const rls_config *cfg, const rls_options *o,
                                const uint8_t *msg, size_t len,
                                rls_reply_fn fn, void *arg)
{
    rls_arena arena;
    rls_arena_init(&arena);
    request *r = envoy__service__ratelimit__v3__rate_limit_request__unpack(
        &arena.protobuf, len, msg);
    if (r == NULL)
        return fail(fn, arg, &arena, RLS_GRPC_INTERNAL,
                    "grpc: error unmarshalling request");
    char why[160];
    const char *refused = refusal(r, cfg, why, sizeof why);
    if (refused != NULL) {
        rls_metrics_event(o->metrics, RLS_EV_SERVICE_ERROR);
        return fail(fn, arg, &arena, RLS_GRPC_UNKNOWN, refused);
    }
    size_t n = r->n_descriptors;
    const rls_limit **found = rls_arena_alloc(&arena, n * sizeof *found);
    bool *drop = rls_arena_alloc(&arena, n * sizeof *drop);
    char (*labels)[RLS_STAT_LABELS_MAX] =
        o->metrics != NULL ? rls_arena_alloc(&arena, n * sizeof *labels)
                           : NULL;
    size_t *label_lens = rls_arena_alloc(&arena, n * sizeof *label_lens);
    /* The values outlive this function (a second step may check them
     * again): one block with the call and its slots, lens first for their
     * alignment (n is at most RLS_DESCRIPTORS_MAX). */
    rls_call *c = rls_pool_zalloc(pool, sizeof *c + n * sizeof(slot)
                                + n * (sizeof(size_t) + RLS_VALUE_MAX + 1));
    if (c == NULL || found == NULL || drop == NULL || label_lens == NULL
        || (o->metrics != NULL && labels == NULL)) {
        rls_pool_free(pool, c);
        return fail(fn, arg, &arena, RLS_GRPC_INTERNAL, "out of memory");
    }
    size_t *lens = (size_t *)(void *)&c->slots[n];
    char (*values)[RLS_VALUE_MAX + 1] = (void *)&lens[n];
    *c = (rls_call){.fn = fn, .arg = arg, .o = o, .agent = agent,
                    .pool = pool,
                    .reading = o->stop_increment_when_over, .pending = 1,
                    .values = values, .lens = lens, .n = n};
    for (size_t i = 0; i < n; i++) {
        c->slots[i].call = c;
        find_limit(cfg, o, r, i, &c->slots[i], &found[i], values[i],
                   &lens[i], labels != NULL ? labels[i] : NULL,
                   &label_lens[i]);
        c->slots[i].hits = (uint32_t)hits_of(r, r->descriptors[i]);
    }
    /* Every replacing limit is known before any is dropped. */
    for (size_t i = 0; i < n; i++)
        drop[i] = found[i] != NULL && replaced(found, n, found[i]->name);
    for (size_t i = 0; i < n; i++) {
        if (drop[i])
            c->slots[i] = (slot){.call = c, .hits = c->slots[i].hits};
    }
    for (size_t i = 0; i < n; i++) {
        if (c->slots[i].limited && c->slots[i].rpu > 0)
            take_hold(c, &c->slots[i], i);
        c->slots[i].id = NULL; /* the request's bytes, freed below */
    }
    int rc = RL_OK;
    bool names = keep_names(c);
    for (size_t i = 0; names && i < n && rc == RL_OK; i++) {
        if (!c->slots[i].limited)
            continue;
        if (labels != NULL)
            c->slots[i].series = rls_metrics_series(o->metrics, labels[i],
                                                    label_lens[i]);
        send_check(c, i, c->reading ? 0 : c->slots[i].hits, &rc);
    }
    rls_arena_free(&arena);
    if (!names || rc != RL_OK) {
        /* Checks already out answer into a cancelled call. */
        c->cancelled = true;
        fn(arg, rc == RL_ECLOSED ? RLS_GRPC_UNAVAILABLE : RLS_GRPC_INTERNAL,
           NULL, 0, !names ? "out of memory" : rl_strerror(rc));
    }
    if (c->pending == 1) {
        one_less(c);
        return NULL;
    }
    c->pending--;
    /* A call that already answered frees itself when its checks are in. */
    return c->cancelled ? NULL : c;
}

void rls_call_cancel(rls_call *c)
{
    c->cancelled = true;
}

void rls_call_expire(rls_call *c)
{
    if (c->cancelled)
        return;
    for (size_t i = 0; i < c->n; i++) {
        slot *s = &c->slots[i];
        if (!s->waiting)
            continue;
        /* Its on_error decides, with nothing known of the count. */
        s->waiting = false;
        s->over = s->deny;
        s->remaining = s->rpu;
        s->reset_s = seconds_to_reset(s->unit);
        c->degraded = true;
        c->expired = true;
        count(c, s, true);
    }
    answer(c);
    c->cancelled = true;
}
