/*
 * The synced path over TLS (tls+tcp://) with certificates made here with
 * openssl. An agent with a certificate the CA signed gets its counts into
 * Redis through the aggregator; with client_auth: required, an agent whose
 * certificate another CA signed is turned away (and logs why), and the
 * rest keep working. Agents in turn refuse an aggregator whose certificate
 * their CA did not sign, or whose name is not their server_name: nothing
 * of theirs reaches Redis, no totals reach them, and they log why. Each
 * refusal is shown next to an agent that differs in that one setting and
 * gets through.
 */
#include "rl.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_certs.h"
#include "test_env.h"
#include "test_process.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIMIT 20
/* make tsan's accepted agents went stale (600 ms without totals) while
 * the instrumented aggregator fell behind: the sanitizer builds wait
 * longer; what is tested is who gets through. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define STALE_AFTER "  stale_after_ms: 3000\n"
#else
#define STALE_AFTER ""
#endif

static char dir[600];

/* Two CAs: "ca" signs server and agent, "other" signs stranger (an agent)
 * and rogue (an aggregator's, for the same names as server). */
static void make_certs(void)
{
    test_certs_dir(dir, sizeof dir, "tls");
    test_certs_ca(dir, "ca");
    test_certs_ca(dir, "other");
    test_certs_cert(dir, "ca", "server");
    test_certs_cert(dir, "ca", "agent");
    test_certs_cert(dir, "other", "stranger");
    test_certs_cert(dir, "other", "rogue");
}

typedef struct aggregator {
    pid_t pid;
    char reports[64], totals[64], log[700];
} aggregator;

/* A config: the CA this side trusts, its own certificate, more tls
 * fields (", client_auth: required"). */
static const char *write_config(const char *name, const aggregator *agg,
                                const char *ca, const char *cert,
                                const char *extra)
{
    static char path[4][700];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 700, "%s/%s.yaml", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fprintf(f, "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
            "aggregator:\n"
            "  reports: \"%s\"\n  totals: \"%s\"\n  sync_interval_ms: 200\n"
            "%s"
            "  tls: {ca: %s/%s.pem, cert: %s/%s.pem, key: %s/%s.key%s}\n"
            "rules:\n  - {name: per-tenant, match: tenant, limit: %d, "
            "period: 1m, mode: synced}\n", test_env("RL_TEST_REDIS"),
            agg->reports, agg->totals, STALE_AFTER, dir, ca, dir, cert, dir,
            cert, extra, LIMIT);
    fclose(f);
    return p;
}

/* An rl-aggregator on fresh tls+tcp:// ports with its CA and certificate;
 * it takes only agents with a certificate that CA signed. */
static void aggregator_start(aggregator *agg, const char *ca,
                             const char *cert)
{
    snprintf(agg->reports, sizeof agg->reports, "tls+tcp://127.0.0.1:%u",
             test_free_port());
    snprintf(agg->totals, sizeof agg->totals, "tls+tcp://127.0.0.1:%u",
             test_free_port());
    test_log_path(agg->log, sizeof agg->log, "aggregator");
    const char *cfg = write_config("aggregator", agg, ca, cert,
                                   ", client_auth: required");
    char *argv[] = {(char *)test_env("RL_TEST_AGGREGATOR"), "--config",
                    (char *)cfg, NULL};
    agg->pid = test_spawn(argv, agg->log);
    test_wait_for_log(&agg->pid, agg->log, "event=listening", 30000);
}

static long long total(const char *value)
{
    char prefix_value[300];
    snprintf(prefix_value, sizeof prefix_value, "rl:tenant:%s", value);
    return test_window_total(NULL, prefix_value);
}

/* Polls Redis for up to 10 s until value's count is want. */
static long long total_reaches(const char *value, long long want)
{
    long long got = 0;
    for (int i = 0; i < 100 && (got = total(value)) != want; i++)
        usleep(100 * 1000);
    return got;
}

static rl_decision decide(rl_agent *a, const char *tenant)
{
    rl_attr attr = {"tenant", tenant, strlen(tenant)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    return d;
}

/* A check of an agent that hears its aggregator. */
static rl_decision check(rl_agent *a, const char *tenant)
{
    rl_decision d = decide(a, tenant);
    cr_assert(!d.degraded);
    return d;
}

/* n checks; returns how many were allowed. */
static int count(rl_agent *a, const char *tenant, int n)
{
    int allowed = 0;
    for (int i = 0; i < n; i++)
        allowed += check(a, tenant).allowed;
    return allowed;
}

static void unique(char *out, size_t cap, const char *stem)
{
    snprintf(out, cap, "%s_%d", stem, (int)getpid());
}

Test(tls, the_synced_path_runs_over_mutual_tls)
{
    make_certs();
    aggregator agg;
    aggregator_start(&agg, "ca", "server");
    rl_config *good_cfg, *bad_cfg;
    static test_log log;
    test_log_init(&log);
    const char *good_path = write_config("agent", &agg, "ca", "agent",
                                         ", server_name: localhost");
    const char *bad_path = write_config("stranger", &agg, "ca", "stranger",
                                        "");
    rl_agent *good = test_agent_on(good_path, &good_cfg, NULL);
    rl_agent *bad = test_agent_on(bad_path, &bad_cfg, &log);
    char tenant[64], other[64];
    unique(tenant, sizeof tenant, "org_tls");
    unique(other, sizeof other, "org_stranger");
    count(good, tenant, 15);
    /* Past aggregator.stale_after_ms the stranger's rule is degraded: it
     * hears no totals. */
    for (int i = 0; i < 15; i++)
        decide(bad, other);
    long long got = total_reaches(tenant, 15);
    cr_assert_eq(got, 15, "over TLS, Redis holds %lld of 15", got);
    usleep(1000 * 1000);
    cr_assert_eq(total(other), 0, "an agent the CA did not sign was heard");
    cr_assert(test_log_wait(&log, "event=aggregator_unreachable",
                            "aggregator.tls", 10000),
              "the stranger did not log why it is not heard:\n%s", log.text);
    rl_agent_close(good);
    rl_agent_close(bad);
    rl_config_free(good_cfg);
    rl_config_free(bad_cfg);
    test_stop(agg.pid, agg.log, 30000);
}

/* Two agents on one config that the aggregator accepts, and one on a
 * config that differs in one setting and must make it refuse the
 * aggregator. The accepted ones show that reports and totals flow: one
 * fills a tenant to its limit, the other, which counted one request there,
 * then rejects it, which only the totals can have told it. The refusing
 * agent counted there too: its count never reaches Redis, it still admits
 * (it heard no totals; past aggregator.stale_after_ms its rule is degraded
 * and on_error: local decides from its own share), and it logs why, naming
 * the setting to check. */
static void refused(const aggregator *agg, const char *accepted_config,
                    const char *refusing_config)
{
    static test_log log;
    test_log_init(&log);
    rl_config *cfg[3];
    rl_agent *filler = test_agent_on(accepted_config, &cfg[0], NULL);
    rl_agent *listener = test_agent_on(accepted_config, &cfg[1], NULL);
    rl_agent *refusing = test_agent_on(refusing_config, &cfg[2], &log);
    char tenant[64];
    unique(tenant, sizeof tenant, "org_refused");
    check(listener, tenant);
    cr_assert(decide(refusing, tenant).allowed);
    /* Before any totals (the first report is a tick away): all allowed. */
    cr_assert_eq(count(filler, tenant, LIMIT - 1), LIMIT - 1);
    long long got = total_reaches(tenant, LIMIT);
    cr_assert_eq(got, LIMIT, "the accepted agents' %d requests: Redis holds "
                 "%lld (the refusing agent's one more?)", LIMIT, got);
    /* The listener's checks until the totals arrive are counted too. */
    bool told = false;
    int more = 0;
    for (int i = 0; i < 100 && !told; i++) {
        told = !check(listener, tenant).allowed;
        more += !told;
        usleep(100 * 1000);
    }
    cr_assert(told, "no totals reached an accepted agent in 10 s");
    cr_assert(decide(refusing, tenant).allowed, "totals reached the agent "
              "that should have refused the aggregator");
    total_reaches(tenant, LIMIT + more);
    /* Two more reports' time for the refusing agent's two requests. */
    usleep(1000 * 1000);
    cr_assert_eq(total(tenant), LIMIT + more, "Redis holds %lld, the "
                 "accepted agents counted %d: the refusing agent's requests "
                 "reached Redis", total(tenant), LIMIT + more);
    cr_assert(test_log_wait(&log, "event=aggregator_unreachable",
                            "aggregator.tls", 10000),
              "the refusing agent did not log why:\n%s", log.text);
    bool degraded = false;
    for (int i = 0; i < 100 && !degraded; i++) {
        degraded = decide(refusing, tenant).degraded;
        usleep(50 * 1000);
    }
    cr_assert(degraded, "an agent that refuses its aggregator has no "
              "totals: on_error decides");
    for (int i = 0; i < 3; i++) {
        rl_agent_close(i == 0 ? filler : i == 1 ? listener : refusing);
        rl_config_free(cfg[i]);
    }
    test_stop(agg->pid, agg->log, 30000);
}

Test(tls, agents_refuse_an_aggregator_another_ca_signed)
{
    make_certs();
    /* The aggregator's certificate (rogue) is other's: an agent trusting
     * other gets through, one trusting ca must not. */
    aggregator agg;
    aggregator_start(&agg, "other", "rogue");
    refused(&agg, write_config("trusts-other", &agg, "other", "stranger", ""),
            write_config("trusts-ca", &agg, "ca", "stranger", ""));
}

Test(tls, agents_refuse_an_aggregator_whose_name_is_not_server_name)
{
    make_certs();
    /* server's certificate names localhost and 127.0.0.1. */
    aggregator agg;
    aggregator_start(&agg, "ca", "server");
    refused(&agg, write_config("expects-localhost", &agg, "ca", "agent",
                               ", server_name: localhost"),
            write_config("expects-another", &agg, "ca", "agent",
                         ", server_name: rl-aggregator.example.net"));
}
