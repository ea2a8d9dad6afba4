/*
 * Redis over TLS (rediss://, store.tls), against a redis-server of the
 * test's own with a TLS port beside its plain one. Checks are exact over
 * TLS, and a reconnect resumes the session; leased rules and synced rules
 * (their aggregator's store over TLS too) count over TLS. A server whose
 * certificate another CA signed, that names another host than
 * server_name, or whose certificate has expired is refused, with the
 * reason logged once however often the agent reconnects; verify: ca takes
 * the second. With tls-auth-clients yes an agent without a certificate is
 * refused (TLS 1.3 says so on the first read, not at the handshake) and
 * one with its certificate gets through. A cluster with tls-cluster yes is
 * served over TLS on every shard, and a sentinel asked over TLS names the
 * primary's TLS port. rlctl reads a bucket over TLS and prints a refusal's
 * reason. A key file that cannot be read fails rl_agent_open, naming the
 * field and the file.
 */
#include "rl.h"
#include "redis_cluster.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_certs.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIMIT 5

static char dir[600];

static void make_certs(void)
{
    test_certs_dir(dir, sizeof dir, "redis-tls");
    test_certs_ca(dir, "ca");
    test_certs_ca(dir, "other");
    test_certs_cert(dir, "ca", "server");
    test_certs_cert(dir, "ca", "client");
}

/* A redis-server with a TLS port (returned) showing cert (which ca
 * signed); with auth_clients it asks for a client certificate. */
static uint16_t tls_redis_with(test_redis *srv, const char *cert,
                               bool auth_clients)
{
    uint16_t port = test_free_port();
    char extra[4096], err[512];
    snprintf(extra, sizeof extra,
             "tls-port %u\ntls-cert-file %s/%s.pem\n"
             "tls-key-file %s/%s.key\ntls-ca-cert-file %s/ca.pem\n"
             "tls-auth-clients %s\n", port, dir, cert, dir, cert, dir,
             auth_clients ? "yes" : "no");
    test_redis_options o = {.extra_conf = extra};
    cr_assert_eq(test_redis_start(srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    return port;
}

static uint16_t tls_redis(test_redis *srv, bool auth_clients)
{
    return tls_redis_with(srv, "server", auth_clients);
}

/* A config file: store lines (under store:) and one exact rule of LIMIT
 * an hour per api_key. */
static const char *write_config(const char *name, const char *store_fmt,
                                ...) __attribute__((format(printf, 2, 3)));

static const char *write_config(const char *name, const char *store_fmt, ...)
{
    static char path[4][700];
    static int next;
    char *p = path[next++ % 4], store[2048];
    va_list ap;
    va_start(ap, store_fmt);
    vsnprintf(store, sizeof store, store_fmt, ap);
    va_end(ap);
    snprintf(p, 700, "%s/%s.yaml", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fprintf(f, "store:\n%s  timeout_ms: 500\nrules:\n  - {name: per-key, "
            "match: api_key, limit: %d, period: 1h}\n", store, LIMIT);
    fclose(f);
    return p;
}

static rl_decision check(rl_agent *a, const char *key)
{
    rl_attr attr = {"api_key", key, strlen(key)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    return d;
}

static void unique(char *out, size_t cap, const char *stem)
{
    static int n;
    snprintf(out, cap, "%s_%d_%d", stem, (int)getpid(), n++);
}

/* LIMIT + 5 checks of a fresh key: how many were admitted, none of them
 * degraded. */
static int spend(rl_agent *a)
{
    char key[64];
    unique(key, sizeof key, "tls");
    int admitted = 0;
    for (int i = 0; i < LIMIT + 5; i++) {
        rl_decision d = check(a, key);
        cr_assert(!d.degraded, "check %d over TLS was degraded", i);
        admitted += d.allowed;
    }
    return admitted;
}

/* Lines of the store's events (event=store_...) that hold what, in the
 * log so far (read under its lock: the agent's thread writes it). */
static int store_lines(test_log *log, const char *what)
{
    static char text[sizeof log->text];
    pthread_mutex_lock(&log->lock);
    memcpy(text, log->text, sizeof text);
    pthread_mutex_unlock(&log->lock);
    int n = 0;
    for (const char *p = text; *p != '\0';) {
        const char *end = strchr(p, '\n');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        char line[2048];
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        n += strncmp(line, "event=store_", 12) == 0
             && strstr(line, what) != NULL;
        p += len + (end != NULL);
    }
    return n;
}

/* An agent on config that must refuse the server: its checks are
 * degraded, and the reason (holding why) is logged once over the
 * reconnects of 1.5 s (backoff 25 ms doubling to 500). */
static void refused(const char *config, const char *why)
{
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(config, &cfg, &log);
    char key[64];
    unique(key, sizeof key, "refused");
    cr_assert(check(a, key).degraded, "a refused server answered a check");
    usleep(1500 * 1000);
    cr_assert(check(a, key).degraded);
    cr_assert(test_log_wait(&log, why, NULL, 1000), "no \"%s\" logged:\n%s",
              why, log.text);
    cr_assert_eq(store_lines(&log, why), 1, "\"%s\" not logged once:\n%s",
                 why, log.text);
    test_log_lacks(&log, "event=store_ready", "the refusing agent's log");
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* The server drops every connection but the test's, times times: each
 * time the agent's next connection resumes the session it was given. */
static void reconnects_resume(const test_redis *srv, rl_agent *a,
                              test_log *log, int times)
{
    for (int n = 1; n <= times; n++) {
        char out[512], cmd[128];
        snprintf(cmd, sizeof cmd, "redis-cli -p %u CLIENT KILL TYPE normal",
                 srv->port);
        cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
        char key[64];
        unique(key, sizeof key, "after");
        for (int i = 0; i < 50 && store_lines(log, "tls=resumed") < n;
             i++) {
            check(a, key);
            usleep(20 * 1000);
        }
        cr_assert_eq(store_lines(log, "tls=resumed"), n,
                     "reconnect %d made a full handshake:\n%s", n,
                     log->text);
        cr_assert_eq(spend(a), LIMIT);
    }
}

/* protocols: the server's tls-protocols. */
static void exact_and_resumed(const char *protocols)
{
    make_certs();
    test_redis srv;
    char err[512], extra[4096];
    uint16_t port = test_free_port();
    snprintf(extra, sizeof extra,
             "tls-port %u\ntls-cert-file %s/server.pem\n"
             "tls-key-file %s/server.key\ntls-ca-cert-file %s/ca.pem\n"
             "tls-auth-clients no\ntls-protocols \"%s\"\n", port, dir, dir,
             dir, protocols);
    test_redis_options o = {.extra_conf = extra};
    cr_assert_eq(test_redis_start(&srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(
        write_config("ok", "  url: rediss://127.0.0.1:%u\n  tls: {ca: "
                     "%s/ca.pem}\n", port, dir), &cfg, &log);
    cr_assert_eq(spend(a), LIMIT, "over TLS, the bucket of %d", LIMIT);
    cr_assert(test_log_wait(&log, "event=store_ready", "tls=full", 1000),
              "%s", log.text);
    reconnects_resume(&srv, a, &log, 2);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_redis_stop(&srv);
}

Test(redis_tls, exact_checks_run_over_tls_and_reconnects_resume)
{
    exact_and_resumed("TLSv1.2 TLSv1.3");
}

/* TLS 1.2 gives no new session on a resumed connection: the one kept must
 * serve the reconnect after too. */
Test(redis_tls, a_tls_1_2_server_resumes_every_reconnect)
{
    exact_and_resumed("TLSv1.2");
}

Test(redis_tls, a_server_another_ca_signed_is_refused_and_said_once)
{
    make_certs();
    test_redis srv;
    uint16_t port = tls_redis(&srv, false);
    refused(write_config("other-ca", "  url: rediss://127.0.0.1:%u\n  tls: "
                         "{ca: %s/other.pem}\n", port, dir),
            "the server's certificate was refused");
    test_redis_stop(&srv);
}

Test(redis_tls, a_server_whose_certificate_expired_is_refused)
{
    make_certs();
    test_certs_expired_cert(dir, "ca", "expired");
    test_redis srv;
    uint16_t port = tls_redis_with(&srv, "expired", false);
    refused(write_config("expired", "  url: rediss://127.0.0.1:%u\n  tls: "
                         "{ca: %s/ca.pem}\n", port, dir),
            "certificate has expired");
    test_redis_stop(&srv);
}

Test(redis_tls, a_server_named_otherwise_is_refused_unless_verify_is_ca)
{
    make_certs();
    test_redis srv;
    uint16_t port = tls_redis(&srv, false);
    refused(write_config("other-name", "  url: rediss://127.0.0.1:%u\n  tls: "
                         "{ca: %s/ca.pem, server_name: rl.example.net}\n",
                         port, dir),
            "hostname mismatch");
    rl_config *cfg;
    rl_agent *a = test_agent_on(
        write_config("chain-only", "  url: rediss://127.0.0.1:%u\n  tls: "
                     "{ca: %s/ca.pem, server_name: rl.example.net, "
                     "verify: ca}\n", port, dir), &cfg, NULL);
    cr_assert_eq(spend(a), LIMIT);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_redis_stop(&srv);
}

Test(redis_tls, the_server_refuses_an_agent_without_a_client_certificate)
{
    make_certs();
    test_redis srv;
    uint16_t port = tls_redis(&srv, true);
    refused(write_config("no-cert", "  url: rediss://127.0.0.1:%u\n  tls: "
                         "{ca: %s/ca.pem}\n", port, dir),
            "the server refused the session");
    rl_config *cfg;
    rl_agent *a = test_agent_on(
        write_config("cert", "  url: rediss://127.0.0.1:%u\n  tls: {ca: "
                     "%s/ca.pem, cert: %s/client.pem, key: %s/client.key}\n",
                     port, dir, dir, dir), &cfg, NULL);
    cr_assert_eq(spend(a), LIMIT);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_redis_stop(&srv);
}

Test(redis_tls, rlctl_reads_a_bucket_over_tls_and_prints_a_refusal)
{
    make_certs();
    test_redis srv;
    uint16_t port = tls_redis(&srv, false);
    const char *good = write_config("rlctl", "  url: rediss://127.0.0.1:%u\n"
                                    "  tls: {ca: %s/ca.pem}\n", port, dir);
    char out[8192], key[64];
    unique(key, sizeof key, "rlctl");
    cr_assert_eq(test_rlctl(out, sizeof out, good, "check --attr api_key=%s",
                            key), 0, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, good, "bucket per-key %s", key),
                 0, "%s", out);
    cr_assert(strstr(out, "tokens:      4 of 5") != NULL, "%s", out);
    const char *bad = write_config("rlctl-bad", "  url: rediss://127.0.0.1:%u"
                                   "\n  tls: {ca: %s/other.pem}\n", port, dir);
    cr_assert_eq(test_rlctl(out, sizeof out, bad, "bucket per-key %s", key),
                 2, "%s", out);
    cr_assert(strstr(out, "the server's certificate was refused") != NULL,
              "%s", out);
    /* An address the kernel refuses at once is said as such, not as a
     * deadline passed. */
    const char *nowhere = write_config("rlctl-nowhere", "  url: rediss://"
                                       "255.255.255.255:6380\n  tls: {ca: "
                                       "%s/ca.pem}\n", dir);
    cr_assert_eq(test_rlctl(out, sizeof out, nowhere, "bucket per-key %s",
                            key), 2, "%s", out);
    cr_assert(strstr(out, "network is unreachable") != NULL, "%s", out);
    test_redis_stop(&srv);
}

Test(redis_tls, a_key_that_cannot_be_read_fails_the_agent_naming_it)
{
    make_certs();
    char key[700];
    snprintf(key, sizeof key, "%s/missing.key", dir);
    rl_config *cfg;
    rl_error err;
    const char *path = write_config("unreadable", "  url: rediss://127.0.0."
                                    "1:1\n  tls: {cert: %s/client.pem, key: "
                                    "%s}\n", dir, key);
    cr_assert_eq(rl_config_load(path, &cfg, &err), RL_OK, "%s", err.message);
    rl_agent *a = NULL;
    rl_options o = {.config = cfg};
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_EIO, "%s", err.message);
    cr_assert_null(a);
    cr_assert(strstr(err.message, "store.tls.key: cannot read") != NULL
                  && strstr(err.message, key) != NULL,
              "%s", err.message);
    /* rl_config_check says the same before a host forks its workers. */
    cr_assert_eq(rl_config_check(cfg, &err), RL_EIO, "%s", err.message);
    cr_assert(strstr(err.message, "store.tls.key: cannot read") != NULL,
              "%s", err.message);
    rl_config_free(cfg);
    /* Another certificate's key is read, and refused. */
    path = write_config("mismatched", "  url: rediss://127.0.0.1:1\n  tls: "
                        "{cert: %s/client.pem, key: %s/server.key}\n", dir,
                        dir);
    cr_assert_eq(rl_config_load(path, &cfg, &err), RL_OK, "%s", err.message);
    o.config = cfg;
    cr_assert_eq(rl_config_check(cfg, &err), RL_ECONFIG, "%s", err.message);
    cr_assert(strstr(err.message, "is not the key of store.tls.cert")
                  != NULL, "%s", err.message);
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_ECONFIG, "%s", err.message);
    rl_config_free(cfg);
}

/* A Redis Cluster with tls-cluster yes: the slot map read over TLS names
 * the TLS ports, and every primary is reached over TLS with store.tls. */
Test(redis_tls, a_cluster_over_tls_serves_every_shard)
{
    make_certs();
    test_cluster cl;
    char err[512];
    cr_assert_eq(test_cluster_start_tls(&cl, test_env("RL_TEST_TMPDIR"), dir,
                                        err, sizeof err), 0, "%s", err);
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(
        write_config("cluster", "  cluster: [\"127.0.0.1:%u\"]\n  tls: {ca: "
                     "%s/ca.pem}\n", cl.tls_ports[0], dir), &cfg, &log);
    for (int i = 0; i < 12; i++)
        cr_assert_eq(spend(a), LIMIT, "key %d", i);
    for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
        char line[128];
        snprintf(line, sizeof line, "addr=127.0.0.1:%u ", cl.nodes[i].port);
        cr_assert_eq(store_lines(&log, line), 0, "a plain port was used:\n"
                     "%s", log.text);
    }
    cr_assert_eq(store_lines(&log, "tls=full"), TEST_CLUSTER_PRIMARIES,
                 "%s", log.text);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_cluster_stop(&cl);
}

/* store.sentinel over TLS: the sentinel is asked on its TLS port, names
 * the primary's TLS port (it watches it over TLS, tls-replication yes),
 * and the checks go there over TLS. The first sentinel listed cannot be
 * dialled at all (the kernel refuses a broadcast address at once, inside
 * the connect call): it is passed over for the next. */
Test(redis_tls, a_sentinel_over_tls_names_the_primary)
{
    make_certs();
    test_redis primary, sentinel;
    uint16_t port = tls_redis(&primary, false);
    uint16_t sentinel_port = test_free_port();
    char conf[4096], err[512];
    snprintf(conf, sizeof conf,
             "sentinel monitor rlm 127.0.0.1 %u 1\n"
             "tls-port %u\ntls-cert-file %s/server.pem\n"
             "tls-key-file %s/server.key\ntls-ca-cert-file %s/ca.pem\n"
             "tls-auth-clients no\ntls-replication yes\n", port,
             sentinel_port, dir, dir, dir);
    test_redis_options so = {.sentinel = true, .extra_conf = conf};
    cr_assert_eq(test_redis_start(&sentinel, test_env("RL_TEST_TMPDIR"), &so,
                                  err, sizeof err), 0, "%s", err);
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(
        write_config("sentinel", "  sentinel: {master: rlm, addresses: "
                     "[\"255.255.255.255:26379\", \"127.0.0.1:%u\"]}\n"
                     "  tls: {ca: %s/ca.pem}\n", sentinel_port, dir), &cfg,
        &log);
    cr_assert_eq(spend(a), LIMIT);
    char ready[96];
    snprintf(ready, sizeof ready, "addr=127.0.0.1:%u scripts=", port);
    cr_assert(test_log_wait(&log, ready, "tls=full", 1000), "%s", log.text);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_redis_stop(&sentinel);
    test_redis_stop(&primary);
}

/* A leased rule and a synced one over TLS: the leases come from the bucket
 * in Redis, and the synced counts reach Redis through an aggregator whose
 * own store is the same rediss:// server. */
Test(redis_tls, leased_and_synced_rules_count_over_tls)
{
    make_certs();
    test_redis srv;
    uint16_t port = tls_redis(&srv, false);
    char store[1024], rules[512], plain[32], org[64], tenant[64];
    snprintf(store, sizeof store, "{url: \"rediss://127.0.0.1:%u\", "
             "timeout_ms: 500, tls: {ca: \"%s/ca.pem\"}}", port, dir);
    snprintf(rules, sizeof rules,
             "  - {name: leased, match: org, limit: 20, period: 1h, "
             "mode: leased}\n"
             "  - {name: synced, match: tenant, limit: 20, period: 1h, "
             "mode: synced}\n");
    snprintf(plain, sizeof plain, "127.0.0.1:%u", srv.port);
    test_aggregator agg = TEST_AGGREGATOR_EXTRA("");
    test_aggregator_start(&agg, store, rules, 100, NULL);
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&agg, &cfg);
    unique(org, sizeof org, "org");
    unique(tenant, sizeof tenant, "tenant");
    int leased = 0, synced = 0;
    for (int i = 0; i < 30; i++) {
        rl_decision d;
        rl_attr o = {"org", org, strlen(org)};
        cr_assert_eq(rl_check(a, &o, 1, 1, &d), RL_OK);
        cr_assert(!d.degraded, "leased check %d degraded", i);
        leased += d.allowed;
        rl_attr t = {"tenant", tenant, strlen(tenant)};
        cr_assert_eq(rl_check(a, &t, 1, 1, &d), RL_OK);
        synced += d.allowed;
    }
    cr_assert_eq(leased, 20, "leased over TLS: %d of 20", leased);
    char prefix[128];
    snprintf(prefix, sizeof prefix, "rl:tenant:%s", tenant);
    long long held = 0;
    for (int i = 0; i < 100 && held != synced; i++) {
        usleep(50 * 1000);
        held = test_window_total(plain, prefix);
    }
    cr_assert_eq(held, synced, "the aggregator wrote %lld over TLS of the "
                 "%d counted", held, synced);
    cr_assert_geq(synced, 20);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
    test_redis_stop(&srv);
}
