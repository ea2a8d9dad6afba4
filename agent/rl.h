/*
 * rl.h: the public interface of librl, fleet-wide rate limiting for API
 * gateways. This is the only header a gateway includes; every type not
 * defined here is private and may change.
 *
 * Conventions, for every function below:
 *   - Functions return RL_OK (0) or a negative RL_E* code; rl_strerror()
 *     turns a code into words. Results come back through out-parameters.
 *   - Where a user needs detail (a bad config line, say), the function takes
 *     an rl_error and fills in its message; an rl_error pointer may be NULL.
 *   - The library never aborts, exits or prints in its host process.
 *   - Its sockets are written through libuv, which leaves SIGPIPE to the
 *     program: a host should ignore it, as network servers do (nginx
 *     does, and so do rl-gateway, rl-aggregator and rlctl); otherwise a
 *     peer that goes away mid-write can end the process.
 */
#ifndef RL_H
#define RL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define RL_API __attribute__((visibility("default")))
#else
#define RL_API
#endif

/* Status codes. Their numbers are stable across releases. */
#define RL_OK        0
#define RL_EINVAL   -1 /* an argument is invalid (NULL, out of range) */
#define RL_ENOMEM   -2 /* out of memory */
#define RL_ECONFIG  -3 /* the config is invalid; rl_error says where */
#define RL_EIO      -4 /* a file could not be read */
#define RL_ETOOLONG -5 /* a value is longer than its limit */
#define RL_ECLOSED  -6 /* the agent is shutting down or closed */
#define RL_EFORKED  -7 /* the agent was opened in another process (fork) */
#define RL_ENOTSUP  -8 /* the config asks for something this build lacks */
#define RL_ESYS     -9 /* the system refused a thread, socket or timer */
#define RL_EAGAIN  -10 /* rl_check_nowait: deciding would wait for the store */

/* The longest message an rl_error carries, including its terminating NUL.
 * A longer message is cut and ends in "..." so a cut is never silent. */
#define RL_ERROR_MAX 1024

/* Detail for a failed call: the same code the call returned, and a message
 * that names what to fix (for a config: file, line, field). Caller-owned;
 * functions that take one clear it on success. */
typedef struct rl_error {
    int code;
    char message[RL_ERROR_MAX];
} rl_error;

/* rl_strerror returns a short static description of a status code, or
 * "unknown error" for a code it does not know. Thread-safe. */
RL_API const char *rl_strerror(int code);

/* rl_version returns librl's version as "MAJOR.MINOR.PATCH". Thread-safe. */
RL_API const char *rl_version(void);

/* A parsed, validated rules config (store, aggregator, rules). Opaque;
 * immutable once loaded, so one config may be read by any number of threads
 * at once. */
typedef struct rl_config rl_config;

/* rl_config_load reads and validates the YAML config at path. On success
 * *out owns a new config, to be released with rl_config_free(). On failure
 * *out is NULL and the return is RL_EIO (unreadable file), RL_ECONFIG
 * (invalid content: err->message names the file, line and field), RL_EINVAL
 * (NULL argument) or RL_ENOMEM. Files over 4 MiB are refused. Thread-safe. */
RL_API int rl_config_load(const char *path, rl_config **out, rl_error *err);

/* rl_config_parse is rl_config_load for a config held in memory: yaml points
 * to len bytes (no terminating NUL needed) and name is what error messages
 * call the document (a file name, or something like "<inline>"). */
RL_API int rl_config_parse(const char *yaml, size_t len, const char *name,
                           rl_config **out, rl_error *err);

/* rl_config_free releases a config. rl_config_free(NULL) does nothing. The
 * caller must make sure no other thread still uses the config. */
RL_API void rl_config_free(rl_config *config);

/* rl_config_check opens, with the calling process's rights, every file an
 * agent opened with config would read that rl_config_load did not (it has
 * read the rules file, overrides_files and store.password_file): today
 * store.tls's CA, certificate and key for a rediss:// store, and the
 * aggregator.tls CA, certificate and key when an aggregator URL is
 * tls+tcp://, parsed as the agent parses them. A host whose workers
 * open their agents as another user (nginx's `user`) runs it with the
 * workers' rights, so that a config they could not open with is refused
 * before they start. Returns RL_OK; RL_EIO when a file cannot be read
 * (err->message names the field, the file and the system's reason, e.g.
 * "store.tls.key: cannot read '/etc/rl/k.key': Permission denied");
 * RL_ECONFIG when its contents are refused (not PEM, a key that is not the
 * certificate's); RL_EINVAL for a NULL config. Reads nothing else and
 * connects nowhere. Thread-safe. Parsing the TLS files starts nng's
 * threads in the calling process: a process that forks workers which open
 * agents must not call it before forking (call it in a short-lived child,
 * as ngx_http_rl_module's master does). */
RL_API int rl_config_check(const rl_config *config, rl_error *err);

/* ------------------------------------------------------------------------
 * The agent: checks requests against the rules.
 * ------------------------------------------------------------------------ */

/* An agent owns one I/O thread and its connection to the store. Opaque. */
typedef struct rl_agent rl_agent;

/* What a log line is about. */
typedef enum rl_log_level {
    RL_LOG_DEBUG,
    RL_LOG_INFO,
    RL_LOG_WARN,
    RL_LOG_ERROR,
} rl_log_level;

/* A logger the host may set. It is called from the agent's I/O thread with
 * one line of key=value text (valid only during the call); it must not call
 * back into the agent. */
typedef void (*rl_log_fn)(rl_log_level level, const char *line, void *arg);

/* Options for rl_agent_open. Zero-initialise, then set what you need. */
typedef struct rl_options {
    /* The rules: either a path to a YAML config, or a config already
     * loaded with rl_config_load (borrowed: it must outlive the agent). */
    const char *config_path;
    const rl_config *config;
    /* Overrides of the config; 0 keeps the config's value. */
    uint32_t timeout_ms;   /* deadline of one check, 1 to 60000 */
    rl_log_fn log;         /* NULL: the agent logs nothing */
    void *log_arg;
    rl_log_level log_level; /* lines below this level are not produced */
    /* 1: the agent starts no I/O thread; the thread that opens it drives
     * its event loop from the host's own (see rl_agent_run). 0: its own
     * thread does. */
    int host_loop;
} rl_options;

/* rl_agent_open loads the rules, starts the agent's I/O thread and begins
 * connecting to the store. It returns without waiting for the connection:
 * checks made before the store answers wait for it up to their deadline.
 * On success *out owns a new agent, released with rl_agent_close(). On
 * failure *out is NULL and err says why: RL_EIO / RL_ECONFIG for the config
 * (and for store.tls's files, read here: "store.tls.key: cannot read ..."),
 * RL_ENOTSUP for a rule mode this build cannot serve, RL_ESYS if no thread
 * could be started, RL_EINVAL, RL_ENOMEM. Thread-safe.
 *
 * After fork(), an agent opened in the parent cannot be used in the child:
 * its I/O thread lives only in the parent. Calls from the child return
 * RL_EFORKED. Open the agent in each worker, after forking. */
RL_API int rl_agent_open(rl_agent **out, const rl_options *options,
                         rl_error *err);

/* rl_agent_shutdown stops the agent without freeing it. Checks waiting for
 * the store are decided at once by their rules' on_error policy (marked
 * degraded); checks started after it return RL_ECLOSED. Safe to call from
 * any thread while others are checking; calling it again does nothing. */
RL_API void rl_agent_shutdown(rl_agent *agent);

/* rl_agent_close shuts the agent down (if not already), waits for every call
 * still inside the agent to return, stops its thread and frees it. No call
 * on the agent may start once rl_agent_close has been called: to stop
 * threads that are still checking, call rl_agent_shutdown first, let them
 * see RL_ECLOSED, then close. With synced rules, the counts not yet
 * reported go to the aggregator in a last report before the agent
 * disconnects: a report in flight is given until its ack, and so is the
 * last, two sync intervals each at most (no wait at all without synced
 * rules): a gateway that closes its agent at a stop or a reload loses no
 * count while an aggregator takes reports. Then it says goodbye to the
 * aggregators (one exchange, answered at once; two intervals at most), so
 * that it leaves its rules' agent counts now and the agents left get its
 * share of each limit at once. Meanwhile each totals
 * connection ends at its aggregator's next broadcast (within an interval,
 * two at most), and the agent waits for that: Debian's nng 1.5.2 can hang
 * closing a connection a message is arriving on.
 * Holds still open (rl_check_hold) are ended at their estimates, and the
 * differences of holds already ended are sent and answered first (the
 * store's timeout_ms at most); rl_hold_end after the close only frees.
 * Then the in_flight slots of every hold are given back, in one call per
 * store shard (one deadline at most), so that no other agent waits a
 * lease for them.
 * rl_agent_close(NULL) does nothing. */
RL_API void rl_agent_close(rl_agent *agent);

/* Host-loop mode (rl_options.host_loop = 1), for a host with an event loop
 * of its own (an nginx worker): the agent's loop runs inside the host's, on
 * the thread that opened the agent (the loop thread), with no thread
 * between a check and its store call. The host watches rl_agent_loop_fd
 * for reading (level-triggered) and calls rl_agent_run when it is
 * readable, when rl_agent_loop_timeout ms have passed since it last ran
 * (0: run again at once; -1: nothing is due), and in the same turn of its
 * own loop after it called rl_check_async, so that the turn's checks go
 * out to the store together. rl_agent_run runs what is due and returns
 * without waiting; rl_check_async's callbacks and the log callback run
 * inside it, on the loop thread, and may call rl_check_async again (the
 * new check waits for the next run, which such a callback makes due at
 * once).
 *
 * On the loop thread, rl_check returns RL_EAGAIN instead of waiting (the
 * store call it would wait for runs on that thread): use rl_check_async.
 * Other threads may check as usual (their checks wait for the host's next
 * run). rl_agent_reload does not wait for the loop to take the rules up:
 * checks started after it returns see them. rl_agent_close must be called
 * on the loop thread, outside rl_agent_run: it runs the loop itself until
 * the close is over (the synced counts' last reports, as above).
 *
 * rl_agent_loop_fd returns the descriptor (owned by the agent: never
 * close it), RL_EINVAL for an agent not in host-loop mode or a caller that
 * is not its loop thread, RL_EFORKED in a forked child. rl_agent_run
 * returns RL_OK (nothing at all from inside one of its own callbacks) or
 * those errors; rl_agent_loop_timeout returns -1 on them. */
RL_API int rl_agent_loop_fd(rl_agent *agent);
RL_API int rl_agent_loop_timeout(rl_agent *agent);
RL_API int rl_agent_run(rl_agent *agent);

/* rl_agent_reload swaps the agent's rules for those of the YAML config at
 * config_path; rl_agent_reload_config for a config already loaded, which
 * the agent then owns (on RL_OK only: on failure it stays the caller's).
 * The caller may go on reading a config it handed over until it reloads or
 * closes the agent again.
 *
 * Checks already started finish under the rules they started with; checks
 * started after the call returns see the new ones; no check fails or waits
 * because of a reload. Buckets and counts of a rule whose name, key_prefix
 * and mode are unchanged are kept (a changed limit applies at once to the
 * same bucket); rules no longer in the config stop applying. The store and
 * aggregator settings are not reloaded: they keep the values the agent was
 * opened with (restart to change them).
 *
 * An invalid config is refused with the same messages as at open (RL_EIO,
 * RL_ECONFIG) and the old rules stay, as is one that would put an
 * in_flight rule's slots under a key_prefix a rule of another mode used,
 * or the reverse (RL_ECONFIG: the keys are of two kinds; the default
 * prefixes never meet so); RL_ENOTSUP, RL_ENOMEM, RL_ESYS as
 * for rl_agent_open; RL_ECLOSED after shutdown. Thread-safe: may run while
 * any number of threads check; reloads of one agent are serialised. */
RL_API int rl_agent_reload(rl_agent *agent, const char *config_path,
                           rl_error *err);
RL_API int rl_agent_reload_config(rl_agent *agent, rl_config *config,
                                  rl_error *err);

/* One attribute of a request: a rule applies when its `match` names an
 * attribute present in the request. The value is bytes, not necessarily
 * NUL-terminated: value_len of them are used. Attributes no rule matches
 * are ignored. */
typedef struct rl_attr {
    const char *name;
    const char *value;
    size_t value_len;
} rl_attr;

/* The longest rule name, in bytes (without the terminating NUL). */
#define RL_RULE_NAME_MAX 64
/* The longest override label a decision carries (without the NUL). */
#define RL_OVERRIDE_NAME_MAX 96
/* Shadow rules a decision names at most (it counts them all). */
#define RL_SHADOW_NAMES_MAX 4
/* At most this many attributes per request. */
#define RL_ATTRS_MAX 64

/* The combined answer for one request. */
typedef struct rl_decision {
    bool allowed;
    /* The store did not answer within the deadline (or the agent was shut
     * down) for at least one rule, or a synced rule's key had no totals
     * from its aggregators (aggregator.stale_after_ms), and that rule's
     * on_error decided (with on_error: local, its fallback bucket, or for
     * a synced rule its share over its own counts: this agent's share of
     * the limit). Also when a global rule's (scope: global) region has
     * not heard another region for a while: its share decided, from the
     * room that region last left it (docs/regions.md); fallback is not
     * set then. */
    bool degraded;
    /* The deciding rule: when rejected, the rejecting rule with the longest
     * retry; when allowed, the tightest rule (fewest tokens remaining; the
     * first in config order on a tie). Empty when no rule applied. */
    char rule[RL_RULE_NAME_MAX + 1];
    uint64_t limit;     /* the rule's tokens per period */
    uint64_t period_ms; /* the rule's period */
    /* Whole tokens left in its bucket (exact rules; leased rules: as the
     * last lease saw it, plus the tokens this agent holds), or the fleet's
     * room as this agent estimates it (synced rules). */
    uint64_t remaining;
    /* Until its bucket is full again (exact), or its window ends
     * (synced). */
    uint64_t reset_ms;
    /* 0 when allowed; when rejected, ms until the request could pass, or
     * -1 when it never can (its cost is larger than the bucket). */
    int64_t retry_after_ms;
    /* The override whose rate the deciding rule applied (limit and
     * period_ms above are its): its name, "overrides[I]", or "FILE:LINE"
     * for a line of an overrides_file. Empty when the rule's own rate
     * applied. */
    char override[RL_OVERRIDE_NAME_MAX + 1];
    /* Shadow rules (shadow: true) are charged as if enforced but never
     * reject and never decide: how many of them would have rejected this
     * request, and the names of the first RL_SHADOW_NAMES_MAX, in config
     * order. */
    unsigned shadow_rejected;
    char shadow_rules[RL_SHADOW_NAMES_MAX][RL_RULE_NAME_MAX + 1];
    /* The deciding rule was decided by its on_error: local bucket (the
     * store did not answer), or a synced rule by this agent's own share
     * (no totals); degraded is set too: a rejection is this agent's share
     * of the limit running out, not the store's absence. */
    bool fallback;
} rl_decision;

/* rl_check decides one request: every rule whose attribute is present is
 * checked and charged `cost` tokens (see the config's `charge`), all of them
 * in one round trip to the store. It blocks until the decision, and never
 * past the store's deadline (timeout_ms): if the store has not answered by
 * then, each unanswered rule's on_error decides and out->degraded is set.
 * A request that no rule applies to is allowed at once, without a round
 * trip. Synced rules are decided from local counts with no network call;
 * a request only synced rules apply to never waits (no lock, no
 * allocation, no system call once its keys have been seen). A leased rule
 * spends tokens this agent holds, with no network call; it waits one
 * round trip only for a key's first lease, or when its hand is empty and
 * the bucket not known to be dry. Thread-safe:
 * any number of threads may check at once.
 *
 * Returns RL_OK with *out filled in (allowed or rejected alike), or without
 * touching the store: RL_EINVAL for a NULL argument, cost 0, more than
 * RL_ATTRS_MAX attributes, an attribute named twice, or a value that is
 * empty or holds a NUL byte; RL_ETOOLONG for a value a rule applies to that
 * is over the config's max_value_bytes (256 unless set lower); RL_ECLOSED
 * after shutdown; RL_EFORKED in a forked
 * child; RL_ENOMEM. */
RL_API int rl_check(rl_agent *agent, const rl_attr *attrs, size_t n,
                    uint32_t cost, rl_decision *out);

/* rl_check_nowait is rl_check for a caller that must never wait, such as
 * an event loop: it decides the request at once (RL_OK, *out filled in,
 * every rule charged as rl_check would) when that needs no round trip:
 * no rule applies, or only synced and local ones, or a leased rule whose
 * hand can decide. Otherwise it returns RL_EAGAIN having charged nothing,
 * and the caller checks the request with rl_check_async: an exact rule
 * applies, or a leased one that must ask the store (it may also answer
 * RL_EAGAIN for a request of more than 16 rules or of three composite
 * rules). Its other errors are rl_check's. An event-loop gateway that
 * tries it first saves a hop through the agent's I/O thread for every
 * request it decides. Thread-safe. */
RL_API int rl_check_nowait(rl_agent *agent, const rl_attr *attrs, size_t n,
                           uint32_t cost, rl_decision *out);

/* Called once with the decision of an rl_check_async call, from the agent's
 * I/O thread. The decision is valid only during the call. The callback must
 * be quick and must not block: every other check waits for it. */
typedef void (*rl_check_fn)(const rl_decision *decision, void *arg);

/* rl_check_async is rl_check for event-loop gateways: it returns at once and
 * the decision comes to callback(decision, arg), exactly once, from the
 * agent's I/O thread, within the deadline. If the call itself fails (the
 * same errors as rl_check) it returns the error and the callback never
 * runs. attrs are copied: they need not outlive the call. Thread-safe. */
RL_API int rl_check_async(rl_agent *agent, const rl_attr *attrs, size_t n,
                          uint32_t cost, rl_check_fn callback, void *arg);

/* A rate a caller gives one check (rl_check_rule_async): limit tokens per
 * period_ms, a bucket of burst (0: limit). */
typedef struct rl_rate {
    uint64_t limit;
    uint64_t period_ms;
    uint64_t burst;
} rl_rate;

/* rl_check_rule_async checks one rule, the one named rule, for the key
 * value (len bytes: the key is the rule's key_prefix and value, as if its
 * match attribute held value; no `when` and no override is looked at), at
 * rate when it is not NULL (else the rule's own), spending cost, which
 * may be 0 here: the rule's state is read and nothing spent (a fixed
 * window counts 0 hits). For a host that picks the rule and the rate per
 * request itself (rl-rls: a descriptor's limit): one rule looked up by
 * name, not every rule against attributes. A caller's rate applies as an
 * override's would: a leased rule leases from the key's bucket at that
 * rate; a synced rule counts that limit per the rule's own period (its
 * aggregator keeps one window per rule; burst is not used), so a rate of
 * another period_ms is refused for it. The decision comes as
 * rl_check_async's. Returns RL_EINVAL for a NULL argument, a rule not in
 * the agent's rules, an empty value or one holding a NUL, a rate of 0, a
 * bucket (not a synced rule or a fixed window) whose burst x period_ms
 * reaches 2^53, or a synced rule's rate of another period_ms than the
 * rule's; RL_ETOOLONG for a value over max_value_bytes; otherwise
 * rl_check_async's errors. Thread-safe. */
RL_API int rl_check_rule_async(rl_agent *agent, const char *rule,
                               const char *value, size_t len,
                               const rl_rate *rate, uint32_t cost,
                               rl_check_fn callback, void *arg);

/* ------------------------------------------------------------------------
 * Holds: a charge kept open until the request ends (issue 31).
 * ------------------------------------------------------------------------ */

/* A check whose charge stays open: its cost was an estimate, and the
 * request's actual cost (an LLM response's tokens, say) is known when it
 * ends. Opaque; owned by the caller from the callback that hands it over
 * until rl_hold_end, which must be called exactly once. */
typedef struct rl_hold rl_hold;

/* Called once with the decision of an rl_check_hold or rl_check_rule_hold
 * call, as rl_check_fn is (the agent's I/O thread, quick, valid only
 * during the call). hold is non-NULL exactly when decision->allowed: the
 * request holds its estimate (and its in_flight slots) until the caller
 * ends it. A rejected request holds nothing: its estimate was charged as
 * rl_check charges a rejected request (see `charge`), and an in_flight
 * slot it took for a rule that allowed was given back. */
typedef void (*rl_hold_fn)(const rl_decision *decision, rl_hold *hold,
                           void *arg);

/* rl_check_hold is rl_check_async, with cost an estimate held open: every
 * rule is checked and charged estimate (which may be 0 here: a check of
 * room, charging nothing until the end), and when the request is allowed
 * the callback gets a hold. rl_hold_end then charges the difference
 * between the actual cost and the estimate, off the request's path. An
 * in_flight rule takes one of its key's slots here and holds it until the
 * end. A hold not ended within the config's hold_timeout_ms is ended at
 * its estimate by the agent (logged as hold_expired): its slots are
 * released and nothing more is charged; the caller must still call
 * rl_hold_end, which then only frees it. Errors as rl_check_async's.
 * Thread-safe. */
RL_API int rl_check_hold(rl_agent *agent, const rl_attr *attrs, size_t n,
                         uint32_t estimate, rl_hold_fn callback, void *arg);

/* in_flight rules (config `in_flight: N`): only a hold takes a slot, and
 * holds it until its end (rl_hold_end, its expiry, the close) or its
 * rejection by another rule, which give it back at once. A plain check
 * (rl_check, rl_check_async, rl_check_nowait, rl_check_rule_async) takes
 * none: it is allowed when a slot is free now, and the next request may
 * find it taken. Such a rule waits for the store as an exact rule does
 * (rl_check_nowait answers RL_EAGAIN for it). Its decision's limit is N,
 * remaining the slots free after the call, period_ms 1000 (nothing
 * refills by time), reset_ms 0, and a rejection's retry_after_ms 1000
 * (a slot frees when a request ends, which no one knows in advance). */

/* rl_check_rule_hold is rl_check_rule_async with its cost an estimate held
 * open, as rl_check_hold holds it. Errors as rl_check_rule_async's.
 * Thread-safe. */
RL_API int rl_check_rule_hold(rl_agent *agent, const char *rule,
                              const char *value, size_t len,
                              const rl_rate *rate, uint32_t estimate,
                              rl_hold_fn callback, void *arg);

/* rl_hold_end ends a hold at the request's actual cost and frees it: each
 * rule that charged the estimate is charged actual - estimate more, or
 * given back estimate - actual. A bucket may go into debt by the excess,
 * which the next requests wait out; a window counts it; so what the
 * fleet charged is the sum of the actual costs. Its in_flight slots are
 * released. Exact rules' differences go to the store in the I/O
 * thread's next batch; leased rules' are settled in the agent's hand for
 * the key, with no call (an excess it cannot pay goes in its next lease;
 * a key whose hand is gone sends it to the bucket in the next batch);
 * local rules' are settled in the agent, synced rules' in the next report
 * (a give-back too, in the sub-window its estimate was counted in, while
 * that is within the rule's period; an aggregator of an older version
 * reads none, and then the fleet keeps counting the estimate: see
 * design.md, Holds). A
 * rule the store did not answer takes no difference. Never blocks and
 * never waits for the store: the caller may call it from any thread, a
 * decision's callback included. After rl_agent_close, or once the hold expired, it
 * only frees the hold (the agent ended it at its estimate). Returns RL_OK,
 * or RL_EINVAL for a NULL hold. */
RL_API int rl_hold_end(rl_hold *hold, uint32_t actual);

/* rl_config_has_in_flight says whether a rule of config is in_flight: a
 * host then checks its requests with rl_check_hold and ends each hold when
 * the request ends, which releases the slot (rl_check_async checks an
 * in_flight rule's room but takes no slot). false for NULL. Thread-safe
 * on a config no one frees meanwhile. */
RL_API bool rl_config_has_in_flight(const rl_config *config);

/* rl_config_decide_on_error decides a request from config alone, as a
 * check decides it when neither the store nor an aggregator answers: each
 * rule that applies is decided by its on_error (allow lets it through,
 * deny rejects it with a retry of a second, local allows: its buckets live
 * in an agent, and a rule whose fallback bucket cannot be had allows),
 * shadow rules never reject, and out->degraded is set when a rule applied.
 * Nothing is charged or remembered. For a host that has the rules but not
 * its agent (rl_agent_open failed, and it retries): ngx_http_rl_module's
 * workers serve that way until their agent opens. Returns rl_check's
 * RL_EINVAL and RL_ETOOLONG, or RL_ENOMEM; RL_EINVAL for a NULL config or
 * out. Thread-safe. */
RL_API int rl_config_decide_on_error(const rl_config *config,
                                     const rl_attr *attrs, size_t n,
                                     uint32_t cost, rl_decision *out);

/* One rule's counters since the agent was opened. */
typedef struct rl_rule_counters {
    const char *rule;   /* the rule's name; valid until the agent is
                         * reloaded or closed */
    uint64_t checks;    /* requests the rule applied to */
    uint64_t allowed;   /* ...that it let through (on_error included) */
    uint64_t rejected;  /* ...that it rejected (on_error: deny included) */
    uint64_t degraded;  /* ...that its on_error decided (no answer in time;
                         * for a synced rule, no totals), its fallback
                         * bucket or own share (on_error: local) included,
                         * and a global rule's decided while a region is
                         * cut off */
    /* A shadow rule never rejects: the requests it would have rejected
     * (counted here, not in rejected). */
    uint64_t shadow_rejected;
    /* on_error: local: requests its fallback bucket (the rule's share of
     * the fleet's limit in this agent) let through and rejected while the
     * store did not answer; also counted in allowed/rejected and
     * degraded. */
    uint64_t fallback_allowed, fallback_rejected;
} rl_rule_counters;

/* A latency histogram in Prometheus's shape, so that a fleet's histograms
 * add up (bucket by bucket) where percentiles would not. le_s[i] is bucket
 * i's upper bound in seconds: the same fixed bounds in every histogram,
 * ascending from 10 us to 10 s. buckets[i] counts the observations of at
 * most le_s[i] seconds, the ones of the buckets below included
 * (cumulative); count is all of them (Prometheus's le="+Inf" bucket) and
 * sum_s their sum. A plain value: it holds no pointer. */
#define RL_HISTOGRAM_BOUNDS 19
typedef struct rl_histogram {
    double le_s[RL_HISTOGRAM_BOUNDS];
    uint64_t buckets[RL_HISTOGRAM_BOUNDS];
    uint64_t count;
    double sum_s;
} rl_histogram;

/* The agent's counters since it was opened, for a gateway to export. */
typedef struct rl_agent_counters {
    uint64_t requests;     /* decided requests (rl_check and async) */
    uint64_t allowed, rejected;
    uint64_t degraded;     /* decisions some rule's on_error took part in,
                            * or a global rule's while a region is cut off */
    uint64_t store_errors; /* bucket calls the store did not answer */
    /* Writes to store nodes: one batch per shard per turn of the I/O loop
     * (all of a turn's calls to one node leave in one write), and the turns
     * that wrote at all: batches / turns is the shards per turn. */
    uint64_t store_batches, store_turns;
    /* Requests that waited for the store (some rule of theirs is exact),
     * and how long each took, from the call to its decision: its buckets
     * and count are read together, so the buckets never decrease and the
     * count is never below the last one (sum_s is read apart). */
    rl_histogram exact_check_seconds;
    /* Keys tracked for synced and local rules, and new keys refused for
     * their caps (aggregator.max_keys, local.max_keys). */
    uint64_t synced_keys, synced_keys_refused;
    uint64_t local_keys, local_keys_refused;
    size_t n_rules;        /* rules in the config */
    uint64_t reloads;      /* rl_agent_reload* calls that took effect */
    /* on_error: local's fallback buckets held, and new keys refused a
     * bucket for the cap (local.max_keys; such a key's rule allows). */
    uint64_t fallback_keys, fallback_keys_refused;
    /* Leased rules: keys holding leases and new keys refused for the cap
     * (local.max_keys); lease calls made and the tokens they took; give-
     * back calls (idle keys, reloads, close) and the tokens they returned;
     * tokens dropped from hands because the bucket had refilled them
     * (a hand counts only while its bucket does). Tokens held now are
     * taken less returned less expired less spent. */
    uint64_t leased_keys, leased_keys_refused;
    uint64_t leases_taken, lease_tokens_taken;
    uint64_t leases_returned, lease_tokens_returned;
    uint64_t lease_tokens_expired;
    /* Holds (rl_check_hold): open now; ended by their callers; ended by
     * the agent at their estimates when hold_timeout_ms passed. */
    uint64_t holds_open, holds_ended, holds_expired;
} rl_agent_counters;

/* One store node (a cluster's primary, or the one server). */
typedef struct rl_shard_counters {
    char node[64];      /* host:port */
    uint64_t batches;   /* writes to it: one per I/O loop turn with calls */
    uint64_t calls;     /* bucket calls sent to it */
} rl_shard_counters;

/* rl_agent_shards fills out[0..cap) with the store nodes this agent has
 * used (the first 64; a node keeps its entry after it leaves) and returns
 * how many there are. Thread-safe; 0 for a NULL agent. */
RL_API size_t rl_agent_shards(rl_agent *agent, rl_shard_counters *out,
                              size_t cap);

/* rl_agent_stats fills *out and the first cap elements of rules (one per
 * rule, in config order; rules may be NULL when cap is 0), both the
 * caller's. Reads counters without stopping any check: the figures are
 * each exact but not taken at one instant (the exact checks' histogram is
 * counted on the I/O thread with atomic adds, and read without a lock).
 * Thread-safe. Returns RL_OK, or RL_EINVAL for a NULL agent
 * or out. */
RL_API int rl_agent_stats(rl_agent *agent, rl_agent_counters *out,
                          rl_rule_counters *rules, size_t cap);

/* rl_format_headers writes the HTTP response headers for a decision into
 * buf, one "Name: value\r\n" line each: RateLimit-Limit, RateLimit-Remaining,
 * RateLimit-Reset (seconds, rounded up), Retry-After on rejection (whole
 * seconds rounded up: 0.6 s is 1 s; left out when the request can never
 * pass), and the IETF httpapi draft's structured fields
 * RateLimit-Policy: "rule";q=LIMIT;w=SECONDS and
 * RateLimit: "rule";r=REMAINING;t=SECONDS. Nothing is written for a
 * decision no rule applied to. Returns the length written (buf is
 * NUL-terminated), or RL_ETOOLONG if len is too small (512 bytes always
 * suffice), or RL_EINVAL. Thread-safe. */
RL_API int rl_format_headers(const rl_decision *decision, char *buf,
                             size_t len);

/* rl_format_body writes the JSON body of the response to a decision into
 * buf, the one rl-gateway sends, ending in a newline. Rejected:
 * {"error":E,"rule":R,"limit":L,"period_ms":P,"override":O,
 * "retry_after_s":S}, where E is "rate_limited", or
 * "rate_limiter_unavailable" when the store did not answer and the rule's
 * on_error denied (degraded set, fallback not: rl-gateway answers 503 for
 * it, 429 otherwise); L and P are the rate that applied and O the override
 * that set it ("default": the rule's own); S is whole seconds rounded up,
 * or null when the request can never pass. Allowed:
 * {"allowed":true,"rule":R,"remaining":N}, or {"allowed":true} when no
 * rule applied. Strings are JSON-escaped. Returns the length written (buf
 * is NUL-terminated), RL_ETOOLONG if len is too small (1024 bytes always
 * suffice), or RL_EINVAL. Thread-safe. */
RL_API int rl_format_body(const rl_decision *decision, char *buf,
                          size_t len);

#ifdef __cplusplus
}
#endif

#endif /* RL_H */
