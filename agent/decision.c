/*
 * decision.c: from the rules' answers to one decision, and from a decision
 * to HTTP headers. The seed's rule: reject if any rule rejects, and wait for
 * the longest retry; the headers describe the tightest rule.
 *
 * A rule the store did not answer is decided by its on_error policy and
 * marks the decision degraded. It reports what is known: nothing about its
 * bucket, so "allow" shows a full bucket (remaining = burst) and "deny" an
 * empty one with a retry of one second, a pause a client can live with
 * while the store is away. "local" reports its fallback bucket's answer
 * (this agent's share: remaining, reset and retry of that bucket) against
 * the rule's own limit and period; a rule whose fallback bucket could not
 * be had allows, as "allow" does.
 *
 * A shadow rule is charged like any other but takes no part in the
 * decision: its would-be rejections (on_error deny included) are counted
 * and named, nothing more. The deciding rule reports the rate that applied
 * to it, an override's or its own, and names the override.
 */
#include "agent_impl.h"

#include "error.h"
#include "json.h"
#include "rules.h"

#include <stdio.h>
#include <string.h>

#define DEGRADED_RETRY_MS 1000

typedef struct verdict {
    bool counts;      /* false for a rule that was not checked */
    bool allowed;
    bool degraded;
    bool fallback;    /* answered by on_error: local's bucket */
    uint64_t remaining;
    uint64_t reset_ms;
    int64_t retry_ms;
} verdict;

static const rl_limit *rate_of(const rl_rule_state *rs)
{
    return rs->rate != NULL ? rs->rate : &rs->rule->own;
}

bool rl_unanswered_allows(const rl_rule_state *rs)
{
    return rs->fallback ? rs->reply.allowed
                        : rs->rule->on_error != RL_ON_ERROR_DENY;
}

static void from_reply(verdict *v, const rl_bucket_reply *reply)
{
    v->allowed = reply->allowed;
    v->remaining = reply->remaining;
    v->reset_ms = reply->reset_ms;
    v->retry_ms = reply->allowed ? 0 : reply->retry_ms;
}

/* With unanswered, every store rule counts as unanswered and its fallback
 * answer, if any, comes from fallback(arg): its state is not ours to
 * read. */
static verdict verdict_of(const rl_rule_state *rs, bool unanswered,
                          rl_fallback_fn fallback, void *arg)
{
    /* Synced and local rules (and leased ones the hand decided) were
     * decided before the request left the caller, and their states are
     * never written again: they stand even when the store's answers are
     * given up on. A leased rule sent to the I/O thread is a store rule. */
    bool store_rule = rl_mode_stored(rs->rule->mode) || rs->via_io;
    bool given_up = unanswered && store_rule;
    rl_outcome outcome = given_up ? RL_OUTCOME_FAILED : rs->outcome;
    verdict v = {.counts = outcome != RL_OUTCOME_SKIPPED};
    rl_bucket_reply reply;
    if (outcome == RL_OUTCOME_ANSWERED) {
        from_reply(&v, &rs->reply);
        v.degraded = rs->cut;
    } else if (outcome != RL_OUTCOME_SKIPPED) {
        /* on_error: local's bucket answers like the store's, for this
         * agent's share; the decision is degraded all the same. */
        v.degraded = true;
        if (given_up ? fallback != NULL && fallback(arg, rs, &reply)
                     : rs->fallback) {
            from_reply(&v, given_up ? &reply : &rs->reply);
            v.fallback = true;
            return v;
        }
        v.allowed = rs->rule->on_error != RL_ON_ERROR_DENY;
        v.remaining = v.allowed ? rate_of(rs)->burst : 0;
        v.retry_ms = v.allowed ? 0 : DEGRADED_RETRY_MS;
    }
    return v;
}

/* Writes v in decimal at buf, two digits at a time, and returns how many
 * it wrote (1 to 10). */
static size_t put_decimal(char *buf, uint32_t v)
{
    static const char pairs[] =
        "00010203040506070809101112131415161718192021222324252627282930313233"
        "34353637383940414243444546474849505152535455565758596061626364656667"
        "6869707172737475767778798081828384858687888990919293949596979899";
    size_t n = v < 10 ? 1 : v < 100 ? 2 : v < 1000 ? 3 : v < 10000 ? 4
             : v < 100000 ? 5 : v < 1000000 ? 6 : v < 10000000 ? 7
             : v < 100000000 ? 8 : v < 1000000000 ? 9 : 10;
    char *end = buf + n;
    while (v >= 100) {
        end -= 2;
        memcpy(end, pairs + 2 * (v % 100), 2);
        v /= 100;
    }
    if (v >= 10)
        memcpy(end - 2, pairs + 2 * v, 2);
    else
        end[-1] = (char)('0' + v);
    return n;
}

/* The length of the string at s, which lies in an array of at least
 * cap + 8 bytes: a word at a time, inline (strlen's call and its checks
 * for the end of a page cost more than the few words of a file name). cap
 * when there is no NUL in the first cap bytes. */
static size_t name_len(const char *s, size_t cap)
{
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    return strnlen(s, cap);
#endif
    const uint64_t ones = 0x0101010101010101ULL;
    for (size_t i = 0; i < cap; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        uint64_t z = (w - ones) & ~w & (ones << 7);
        if (z != 0) { /* the lowest flag is exactly the first NUL */
            size_t n = i + (size_t)(__builtin_ctzll(z) >> 3);
            return n < cap ? n : cap;
        }
    }
    return cap;
}

/* rl_override_label's words, without snprintf (a third of a synced check's
 * time when the key has an override, then a fifth in a loop of digits):
 * "FILE:LINE" is the file's name copied whole, as a fixed-size block the
 * size of the decision's field, then the line's digits over its tail. No
 * memory per override: the label is made from the rule and the line. */
static void label(const rl_rule *rule, const rl_override *o, char *buf)
{
    enum { cap = RL_OVERRIDE_NAME_MAX + 1 };
    _Static_assert(sizeof rule->overrides_file >= cap + 8,
                   "a block the size of a label can be read from the file's "
                   "name, and its length a word at a time");
    if (o->name != NULL) {
        size_t n = strlen(o->name);
        if (n < cap) {
            memcpy(buf, o->name, n + 1);
            return;
        }
    } else if (o->line != 0) {
        size_t n = name_len(rule->overrides_file, cap);
        if (n + 12 <= cap) { /* ':', ten digits at most, NUL */
            memcpy(buf, rule->overrides_file, cap);
            buf[n++] = ':';
            n += put_decimal(buf + n, o->line);
            buf[n] = '\0';
            return;
        }
    } else {
        memcpy(buf, "overrides[", 10);
        size_t n = 10 + put_decimal(buf + 10, o->order);
        buf[n++] = ']';
        buf[n] = '\0';
        return;
    }
    rl_override_label(rule, o, buf, cap);
}

/* The deciding rule into out, whose allowed is already set. */
static void describe(rl_decision *out, const rl_rule *rule,
                     const rl_override *o, const rl_limit *rate,
                     const verdict *v)
{
    /* The whole array, NUL and the zeros after it: a fixed size copies in a
     * few moves, and this runs on every check. */
    _Static_assert(sizeof out->rule == sizeof rule->name,
                   "a rule's name fits the decision");
    _Static_assert(sizeof out->override == RL_OVERRIDE_NAME_MAX + 1,
                   "label() fills the decision's override");
    memcpy(out->rule, rule->name, sizeof out->rule);
    out->limit = rate->limit;
    out->period_ms = rate->period_ms;
    if (o != NULL)
        label(rule, o, out->override);
    else
        out->override[0] = '\0';
    out->remaining = v->remaining;
    out->reset_ms = v->reset_ms;
    out->retry_after_ms = out->allowed ? 0 : v->retry_ms;
}

/* -1 ("never") is the longest wait of all. */
static bool longer_retry(int64_t a, int64_t b)
{
    if (a < 0)
        return b >= 0;
    return b >= 0 && a > b;
}

static void decide(const rl_rule_state *rules, int n, bool unanswered,
                   rl_fallback_fn fallback, void *arg, rl_decision *out)
{
    memset(out, 0, sizeof *out);
    out->allowed = true;
    int pick = -1;
    verdict chosen = {0};
    for (int i = 0; i < n; i++) {
        verdict v = verdict_of(&rules[i], unanswered, fallback, arg);
        if (!v.counts)
            continue;
        if (rules[i].shadow) {
            if (!v.allowed) {
                if (out->shadow_rejected < RL_SHADOW_NAMES_MAX)
                    memcpy(out->shadow_rules[out->shadow_rejected],
                           rules[i].rule->name, sizeof out->shadow_rules[0]);
                out->shadow_rejected++;
            }
            continue;
        }
        out->degraded |= v.degraded;
        bool better;
        if (!v.allowed) {
            better = out->allowed || longer_retry(v.retry_ms, chosen.retry_ms);
            out->allowed = false;
        } else {
            better = out->allowed && (pick < 0 || v.remaining < chosen.remaining);
        }
        if (better) {
            pick = i;
            chosen = v;
        }
    }
    if (pick >= 0)
        describe(out, rules[pick].rule, rules[pick].override,
                 rate_of(&rules[pick]), &chosen);
    out->fallback = chosen.fallback;
}

void rl_decide_one(const rl_rule *rule, const rl_override *o,
                   const rl_limit *rate, const rl_bucket_reply *reply,
                   rl_decision *out)
{
    /* Every field is written below (the name with its NUL; shadow_rules
     * mean nothing while shadow_rejected is 0): no memset on the synced
     * hot path. */
    out->allowed = reply->allowed;
    out->degraded = false;
    out->fallback = false;
    out->shadow_rejected = 0;
    verdict v = {.counts = true, .allowed = reply->allowed,
                 .remaining = reply->remaining, .reset_ms = reply->reset_ms,
                 .retry_ms = reply->allowed ? 0 : reply->retry_ms};
    describe(out, rule, o, rate, &v);
}

void rl_decide(const rl_rule_state *rules, int n, rl_decision *out)
{
    decide(rules, n, false, NULL, NULL, out);
}

void rl_decide_unanswered(const rl_rule_state *rules, int n,
                          rl_fallback_fn fallback, void *arg,
                          rl_decision *out)
{
    decide(rules, n, true, fallback, arg, out);
}

static uint64_t seconds_up(uint64_t ms)
{
    return (ms + 999) / 1000;
}

int rl_format_headers(const rl_decision *d, char *buf, size_t len)
{
    if (d == NULL || buf == NULL || len == 0)
        return RL_EINVAL;
    buf[0] = '\0';
    if (d->rule[0] == '\0')
        return 0;
    uint64_t reset_s = seconds_up(d->reset_ms);
    uint64_t window_s = seconds_up(d->period_ms);
    char retry[48] = "";
    if (!d->allowed && d->retry_after_ms >= 0) {
        uint64_t s = seconds_up((uint64_t)d->retry_after_ms);
        snprintf(retry, sizeof retry, "Retry-After: %llu\r\n",
                 (unsigned long long)(s > 0 ? s : 1));
    }
    int n = snprintf(buf, len,
                     "RateLimit-Limit: %llu\r\n"
                     "RateLimit-Remaining: %llu\r\n"
                     "RateLimit-Reset: %llu\r\n"
                     "%s"
                     "RateLimit-Policy: \"%s\";q=%llu;w=%llu\r\n"
                     "RateLimit: \"%s\";r=%llu;t=%llu\r\n",
                     (unsigned long long)d->limit,
                     (unsigned long long)d->remaining,
                     (unsigned long long)reset_s, retry, d->rule,
                     (unsigned long long)d->limit,
                     (unsigned long long)window_s, d->rule,
                     (unsigned long long)d->remaining,
                     (unsigned long long)reset_s);
    if (n < 0 || (size_t)n >= len) {
        buf[0] = '\0';
        return RL_ETOOLONG;
    }
    return n;
}

/* The body of the response to a decision, as rl-gateway sends it. A rule
 * name is at most RL_RULE_NAME_MAX bytes and an override label
 * RL_OVERRIDE_NAME_MAX, six bytes each once escaped at worst: with the
 * numbers, 1024 bytes always hold the body. */
int rl_format_body(const rl_decision *d, char *buf, size_t len)
{
    if (d == NULL || buf == NULL || len == 0)
        return RL_EINVAL;
    char rule[6 * RL_RULE_NAME_MAX + 3];
    char override[6 * RL_OVERRIDE_NAME_MAX + 3];
    rl_json_quote(rule, sizeof rule, d->rule);
    int n;
    if (d->allowed) {
        char remaining[32] = "";
        if (d->rule[0] != '\0')
            snprintf(remaining, sizeof remaining, ",\"remaining\":%llu",
                     (unsigned long long)d->remaining);
        n = snprintf(buf, len, "{\"allowed\":true%s%s%s}\n",
                     d->rule[0] != '\0' ? ",\"rule\":" : "",
                     d->rule[0] != '\0' ? rule : "", remaining);
    } else {
        /* A fallback bucket's rejection is a limit reached (this agent's
         * share of it), as the store's would be; without one, the store's
         * absence decided. */
        bool unavailable = d->degraded && !d->fallback;
        char retry[32] = "null";
        if (d->retry_after_ms >= 0)
            snprintf(retry, sizeof retry, "%llu",
                     (unsigned long long)seconds_up(
                         (uint64_t)d->retry_after_ms));
        rl_json_quote(override, sizeof override,
                      d->override[0] != '\0' ? d->override : "default");
        n = snprintf(buf, len,
                     "{\"error\":\"%s\",\"rule\":%s,\"limit\":%llu,"
                     "\"period_ms\":%llu,\"override\":%s,"
                     "\"retry_after_s\":%s}\n",
                     unavailable ? "rate_limiter_unavailable"
                                 : "rate_limited",
                     rule, (unsigned long long)d->limit,
                     (unsigned long long)d->period_ms, override, retry);
    }
    if (n < 0 || (size_t)n >= len) {
        buf[0] = '\0';
        return RL_ETOOLONG;
    }
    return n;
}
