/*
 * The Redis password is never shown, however it is given (store.password,
 * password_file or password_env, with an ACL username or without), and
 * whether Redis takes it or refuses it: not in the agent's log lines, not
 * in rl-gateway's or rl-aggregator's logs (at debug level), not in rlctl's
 * output or errors, plain or --json. Each run is checked to have reached
 * AUTH, where a leak would happen: the right password ends in
 * store_ready, a wrong one in a logged store_handshake_failed (WRONGPASS).
 * Over TLS (rediss:// with a client certificate) the same holds, for the
 * password and for the client key's contents, and every program reaches
 * Redis through TLS (the aggregator's own store included).
 */
#include "redis_server.h"
#include "rl.h"
#include "test_agent.h"
#include "test_certs.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_process.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Distinctive, so that finding one anywhere can only be a leak. */
#define SECRET "Sekrit-7f3a9c1e-staple"
#define WRONG "Wr0ng-2b4e6d80-battery"
#define PASSWORD_ENV "RL_TEST_SECRETS_PASSWORD"
#define ACL_USER "rl-secrets"

typedef enum way { INLINE, FROM_FILE, FROM_ENV } way;

/* Over TLS: where the certificates are, and a line of the client key's
 * body (never to be shown either); "" without TLS. */
static char certs[600];
static char key_line[80];

/* Fails the test if text holds either password, or the key. */
static void expect_no_secret(const char *text, const char *where)
{
    cr_assert_null(strstr(text, SECRET), "%s shows the password:\n%s", where,
                   text);
    cr_assert_null(strstr(text, WRONG), "%s shows the wrong password:\n%s",
                   where, text);
    cr_assert(key_line[0] == '\0' || strstr(text, key_line) == NULL,
              "%s shows the client key:\n%s", where, text);
}

/* What a run must have logged: it got past AUTH, or AUTH was refused. */
static const char *outcome(bool right)
{
    return right ? "event=store_ready"
                 : "event=store_handshake_failed.*WRONGPASS";
}

static const char *write_config(const char *store_auth)
{
    static char path[600];
    static int serial;
    snprintf(path, sizeof path, "%s/secrets-%d-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid(), ++serial);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "%s"
            "aggregator:\n"
            "  reports: \"tcp://127.0.0.1:%u\"\n"
            "  totals: \"tcp://127.0.0.1:%u\"\n"
            "  sync_interval_ms: 100\n"
            "log_level: debug\n"
            "rules:\n"
            "  - {name: per-key, match: api_key, limit: 100, period: 1m}\n"
            "  - {name: per-tenant, match: tenant, limit: 100, period: 1m, "
            "mode: synced}\n", store_auth, test_free_port(),
            test_free_port());
    fclose(f);
    return path;
}

/* The store section for a Redis on port, with password given in way w. */
static void store_section(char *out, size_t cap, uint16_t port, way w,
                          const char *user, const char *password)
{
    char user_line[64] = "", pw_line[700];
    if (user != NULL)
        snprintf(user_line, sizeof user_line, "  username: %s\n", user);
    if (w == INLINE) {
        snprintf(pw_line, sizeof pw_line, "  password: \"%s\"\n", password);
    } else if (w == FROM_FILE) {
        char file[600];
        snprintf(file, sizeof file, "%s/password-%d-%s",
                 test_env("RL_TEST_TMPDIR"), (int)getpid(),
                 strcmp(password, SECRET) == 0 ? "right" : "wrong");
        FILE *f = fopen(file, "w");
        cr_assert_not_null(f);
        fprintf(f, "%s\n", password);
        fclose(f);
        snprintf(pw_line, sizeof pw_line, "  password_file: %s\n", file);
    } else {
        /* Spawned programs (and rlctl) inherit it. */
        cr_assert_eq(setenv(PASSWORD_ENV, password, 1), 0);
        snprintf(pw_line, sizeof pw_line, "  password_env: " PASSWORD_ENV
                 "\n");
    }
    char tls[2200] = "";
    if (certs[0] != '\0')
        snprintf(tls, sizeof tls, "  tls: {ca: %s/ca.pem, cert: %s/client.pem"
                 ", key: %s/client.key}\n", certs, certs, certs);
    snprintf(out, cap, "store:\n  url: %s://127.0.0.1:%u\n"
             "  timeout_ms: 500\n%s%s%s", certs[0] != '\0' ? "rediss" : "redis",
             port, user_line, pw_line, tls);
}

/* --- the agent, in this process, with every line it logs captured. ---- */

static void agent_run(const char *config, bool right)
{
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(config, &cfg, &log);
    rl_attr attr = {"api_key", "secrets", 7};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    cr_assert_eq(d.degraded, !right, "the check %s Redis",
                 right ? "did not get through to" : "got through to");
    const char *event = right ? "event=store_ready"
                              : "event=store_handshake_failed";
    const char *then = right ? NULL : "WRONGPASS";
    bool logged = test_log_wait(&log, event, then, 10000);
    rl_agent_close(a);
    rl_config_free(cfg);
    cr_assert(logged, "the agent did not log %s:\n%s", event, log.text);
    test_log_lacks(&log, SECRET, "the agent's log");
    test_log_lacks(&log, WRONG, "the agent's log");
    if (key_line[0] != '\0')
        test_log_lacks(&log, key_line, "the agent's log");
}

/* --- rl-gateway and rl-aggregator, their stderr in a log file. --------- */

static void expect_log_clean(const char *log, const char *program)
{
    char cmd[700], text[1 << 16];
    snprintf(cmd, sizeof cmd, "cat %s", log);
    cr_assert_eq(test_run(cmd, text, sizeof text), 0, "%s", text);
    cr_assert_lt(strlen(text), sizeof text - 1, "%s is too long to read",
                 log);
    expect_no_secret(text, program);
}

static void gateway_run(const char *config, bool right)
{
    test_gateway gw;
    test_gateway_start(&gw, config, NULL);
    test_http_response r;
    test_http_get(gw.port, "/", "X-Api-Key: secrets\r\n", &r);
    cr_assert_neq(r.status, 0);
    test_wait_for_log(&gw.pid, gw.log, outcome(right), 10000);
    test_gateway_stop(&gw);
    expect_log_clean(gw.log, "rl-gateway's log");
}

static void aggregator_run(const char *config, bool right)
{
    char log[700];
    test_log_path(log, sizeof log, "aggregator");
    char *argv[] = {(char *)test_env("RL_TEST_AGGREGATOR"), "--config",
                    (char *)config, NULL};
    pid_t pid = test_spawn(argv, log);
    test_wait_for_log(&pid, log, outcome(right), 10000);
    test_stop(pid, log, 30000);
    expect_log_clean(log, "rl-aggregator's log");
}

/* --- rlctl: the config (which holds no secret to show) and a command that
 * authenticates. --------------------------------------------------------- */

static int rlctl(const char *config, const char *args, char *out, size_t cap)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s --config %s %s < /dev/null",
             test_env("RL_TEST_RLCTL"), config, args);
    int rc = test_run(cmd, out, cap);
    expect_no_secret(out, args);
    return rc;
}

static void rlctl_run(const char *config, bool right)
{
    char out[16384];
    cr_assert_eq(rlctl(config, "config", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, ", with password\n") != NULL, "%s", out);
    cr_assert_eq(rlctl(config, "--json config", out, sizeof out), 0, "%s",
                 out);
    cr_assert(strstr(out, "\"valid\":true") != NULL, "%s", out);
    const char *modes[] = {"bucket per-key secrets",
                           "--json bucket per-key secrets"};
    for (int i = 0; i < 2; i++) {
        int rc = rlctl(config, modes[i], out, sizeof out);
        if (right) {
            cr_assert_eq(rc, 0, "%s: %s", modes[i], out);
        } else {
            cr_assert_eq(rc, 2, "%s: %s", modes[i], out);
            cr_assert(strstr(out, "refused rlctl: WRONGPASS") != NULL,
                      "%s: %s", modes[i], out);
        }
    }
}

/* A line from the middle of the client key's body. */
static void read_key_line(void)
{
    char path[700];
    snprintf(path, sizeof path, "%s/client.key", certs);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    for (int i = 0; i < 3; i++)
        cr_assert_not_null(fgets(key_line, sizeof key_line, f));
    fclose(f);
    key_line[strcspn(key_line, "\n")] = '\0';
    cr_assert_gt(strlen(key_line), 40);
}

/* Every program, with the right password and with a wrong one; over TLS
 * with a client certificate when tls. */
static void never_shown(way w, const char *user, bool tls)
{
    test_redis srv;
    char err[512], extra[4096];
    uint16_t tls_port = 0;
    certs[0] = key_line[0] = '\0';
    extra[0] = '\0';
    if (tls) {
        test_certs_dir(certs, sizeof certs, "secrets");
        test_certs_ca(certs, "ca");
        test_certs_cert(certs, "ca", "server");
        test_certs_cert(certs, "ca", "client");
        read_key_line();
        tls_port = test_free_port();
        snprintf(extra, sizeof extra, "tls-port %u\ntls-cert-file "
                 "%s/server.pem\ntls-key-file %s/server.key\n"
                 "tls-ca-cert-file %s/ca.pem\ntls-auth-clients yes\n",
                 tls_port, certs, certs, certs);
    }
    char conf[5000];
    snprintf(conf, sizeof conf, "%srequirepass " SECRET "\n"
             "user " ACL_USER " on >" SECRET " ~* +@all", extra);
    test_redis_options o = {.extra_conf = conf};
    cr_assert_eq(test_redis_start(&srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    const char *passwords[] = {SECRET, WRONG};
    for (int i = 0; i < 2; i++) {
        bool right = i == 0;
        char store[4096];
        store_section(store, sizeof store, tls ? tls_port : srv.port, w, user,
                      passwords[i]);
        const char *config = write_config(store);
        agent_run(config, right);
        gateway_run(config, right);
        aggregator_run(config, right);
        rlctl_run(config, right);
    }
    test_redis_stop(&srv);
}

Test(secrets, a_password_in_the_config_is_never_shown)
{
    never_shown(INLINE, NULL, false);
}

Test(secrets, a_password_file_is_never_shown)
{
    never_shown(FROM_FILE, NULL, false);
}

Test(secrets, a_password_from_the_environment_is_never_shown)
{
    never_shown(FROM_ENV, NULL, false);
}

Test(secrets, an_acl_users_password_is_never_shown)
{
    never_shown(INLINE, ACL_USER, false);
}

Test(secrets, a_password_and_a_client_key_over_tls_are_never_shown)
{
    never_shown(INLINE, ACL_USER, true);
}
