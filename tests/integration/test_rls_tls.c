/*
 * rl-rls's gRPC over TLS, black box: upstream's GRPC_SERVER_USE_TLS,
 * GRPC_SERVER_TLS_CERT/KEY, GRPC_CLIENT_TLS_CACERT and GRPC_CLIENT_TLS_SAN,
 * with certificates made by openssl and calls made by grpcio (and
 * Python's ssl for bare handshakes). A refused client gets nothing and is
 * logged once; the others are served on.
 */
#include "test_certs.h"
#include "test_env.h"
#include "test_process.h"
#include "test_rls.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char limits[] =
    "domain: edge\n"
    "descriptors:\n"
    "  - key: tenant\n"
    "    rate_limit: {unit: hour, requests_per_unit: 100}\n"
    "  - key: user\n"
    "    rate_limit: {unit: hour, requests_per_unit: 2}\n";

/* The files: a CA and what it signed for the server and a client, and
 * another CA's client (all for localhost and 127.0.0.1). */
typedef struct certs {
    char dir[256];
    char ca[300], server[300], server_key[300];
    char client[300], client_key[300], stranger[300], stranger_key[300];
} certs;

static void make_certs(certs *c)
{
    test_certs_dir(c->dir, sizeof c->dir, "rls-tls");
    test_certs_ca(c->dir, "ca");
    test_certs_cert(c->dir, "ca", "server");
    test_certs_cert(c->dir, "ca", "client");
    test_certs_ca(c->dir, "other");
    test_certs_cert(c->dir, "other", "stranger");
    snprintf(c->ca, sizeof c->ca, "%s/ca.pem", c->dir);
    snprintf(c->server, sizeof c->server, "%s/server.pem", c->dir);
    snprintf(c->server_key, sizeof c->server_key, "%s/server.key", c->dir);
    snprintf(c->client, sizeof c->client, "%s/client.pem", c->dir);
    snprintf(c->client_key, sizeof c->client_key, "%s/client.key", c->dir);
    snprintf(c->stranger, sizeof c->stranger, "%s/stranger.pem", c->dir);
    snprintf(c->stranger_key, sizeof c->stranger_key, "%s/stranger.key",
             c->dir);
}

/* rl-rls over TLS with the server's pair, a client CA and a SAN if not
 * NULL. The variables' text is static: putenv keeps it. */
static void start_tls(test_rls *r, const certs *c, const char *client_ca,
                      const char *san)
{
    static char vars[4][400];
    const char *env[6] = {"GRPC_SERVER_USE_TLS=true", vars[0], vars[1]};
    snprintf(vars[0], sizeof vars[0], "GRPC_SERVER_TLS_CERT=%s", c->server);
    snprintf(vars[1], sizeof vars[1], "GRPC_SERVER_TLS_KEY=%s",
             c->server_key);
    int n = 3;
    if (client_ca != NULL) {
        snprintf(vars[2], sizeof vars[2], "GRPC_CLIENT_TLS_CACERT=%s",
                 client_ca);
        env[n++] = vars[2];
    }
    if (san != NULL) {
        snprintf(vars[3], sizeof vars[3], "GRPC_CLIENT_TLS_SAN=%s", san);
        env[n++] = vars[3];
    }
    test_rls_start(r, limits, NULL, env);
}

/* Options for rls_call.py: the CA, and a client's pair if pem. */
typedef struct tls_opts {
    const char *argv[9];
} tls_opts;

static const char *const *opts(tls_opts *o, const certs *c, const char *pem,
                               const char *key)
{
    *o = (tls_opts){{"--ca", c->ca, "--name", "localhost"}};
    if (pem != NULL) {
        o->argv[4] = "--cert";
        o->argv[5] = pem;
        o->argv[6] = "--key";
        o->argv[7] = key;
    }
    return o->argv;
}

/* A call to a descriptor of this test's own. */
static const char *user_call(char *buf, size_t cap, int repeat)
{
    snprintf(buf, cap, "{\"domain\": \"edge\", \"repeat\": %d, "
             "\"descriptors\": [{\"entries\": [[\"user\", \"tls-%d\"]]}]}",
             repeat, (int)getpid());
    return buf;
}

static int count_lines_with(const char *out, const char *what)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, what)) != NULL; p++)
        n++;
    return n;
}

static void assert_served(test_rls *r, const char *const *o)
{
    static char out[1024];
    test_rls_call_with(r, o, out, sizeof out, "{\"health\": true}", NULL);
    cr_assert_str_eq(out, "HEALTH SERVING\n", "not served: %s", out);
}

/* Refused at the handshake: UNAVAILABLE to the client, one line in the
 * log with the peer and why. */
static void assert_refused(test_rls *r, const char *const *o,
                           const char *reason)
{
    static char out[1024];
    long from = test_log_size(r->log);
    test_rls_call_with(r, o, out, sizeof out,
                       "{\"health\": true, \"timeout\": 3}", NULL);
    cr_assert(strncmp(out, "ERROR 14 ", 9) == 0, "not refused: %s", out);
    test_wait_for_log_from(&r->pid, r->log, from, reason, 5000);
}

Test(rls_tls, a_limit_and_health_over_tls_on_every_worker)
{
    certs c;
    make_certs(&c);
    test_rls r;
    start_tls(&r, &c, NULL, NULL);
    tls_opts o;
    static char out[16384];
    char call[256], tenant[256];
    snprintf(tenant, sizeof tenant, "{\"domain\": \"edge\", \"repeat\": 5, "
             "\"clients\": 4, \"descriptors\": [{\"entries\": [[\"tenant\", "
             "\"tls-%d\"]]}]}", (int)getpid());
    test_rls_call_with(&r, opts(&o, &c, NULL, NULL), out, sizeof out,
                       user_call(call, sizeof call, 3), "{\"health\": true}",
                       tenant, NULL);
    cr_assert(strncmp(out, "OK OK OK:1:2/HOUR::", 19) == 0, "%s", out);
    cr_assert_eq(count_lines_with(out, "OK OK OK:0:2/HOUR::"), 1, "%s", out);
    cr_assert_eq(count_lines_with(out, "OK OVER_LIMIT OVER_LIMIT:0:2/HOUR"),
                 1, "%s", out);
    cr_assert_eq(count_lines_with(out, "HEALTH SERVING"), 1, "%s", out);
    /* Four connections at once, spread over the two workers. */
    cr_assert_eq(count_lines_with(out, ":100/HOUR::"), 20, "%s", out);
    cr_assert_eq(count_lines_with(out, "OK OK OK:80:100/HOUR::"), 1, "%s",
                 out);
    test_rls_stop(&r);
}

Test(rls_tls, a_cleartext_client_is_refused_and_the_service_goes_on)
{
    certs c;
    make_certs(&c);
    test_rls r;
    start_tls(&r, &c, NULL, NULL);
    static char out[1024];
    for (int i = 0; i < 2; i++) {
        long from = test_log_size(r.log);
        test_rls_call(&r, out, sizeof out,
                      "{\"health\": true, \"timeout\": 3}", NULL);
        cr_assert(strncmp(out, "ERROR 14 ", 9) == 0, "h2c answered: %s",
                  out);
        test_wait_for_log_from(&r.pid, r.log, from,
                               "event=tls_handshake_failed peer=127.0.0.1:",
                               5000);
    }
    tls_opts o;
    assert_served(&r, opts(&o, &c, NULL, NULL));
    test_rls_stop(&r);
}

/* ALPN: h2 chosen when offered among others; a client that offers
 * something else, or no ALPN at all, is refused at the handshake. */
Test(rls_tls, only_a_client_offering_h2_gets_through_alpn)
{
    certs c;
    make_certs(&c);
    test_rls r;
    start_tls(&r, &c, NULL, NULL);
    tls_opts o;
    static char out[2048];
    long from = test_log_size(r.log);
    test_rls_call_with(&r, opts(&o, &c, NULL, NULL), out, sizeof out,
                       "{\"handshake\": [\"http/1.1\", \"h2\"]}",
                       "{\"handshake\": [\"http/1.1\"]}",
                       "{\"handshake\": []}", NULL);
    cr_assert(strncmp(out, "TLS h2\nTLS_ERROR ", 17) == 0, "%s", out);
    cr_assert_eq(count_lines_with(out, "TLS_ERROR "), 2, "%s", out);
    cr_assert_eq(count_lines_with(out, "no application protocol"), 2, "%s",
                 out);
    test_wait_for_log_from(&r.pid, r.log, from,
                           "reason=\"the client offered ALPN protocols but "
                           "not h2\"", 5000);
    test_wait_for_log_from(&r.pid, r.log, from,
                           "reason=\"the client offered no ALPN protocol: "
                           "h2 is required\"", 5000);
    assert_served(&r, o.argv);
    test_rls_stop(&r);
}

/* TLS 1.2 at least: a client of TLS 1.1 at most is refused, even one
 * that would take any cipher. */
Test(rls_tls, a_client_below_tls_1_2_is_refused)
{
    certs c;
    make_certs(&c);
    test_rls r;
    start_tls(&r, &c, NULL, NULL);
    tls_opts o;
    static char out[2048];
    long from = test_log_size(r.log);
    test_rls_call_with(&r, opts(&o, &c, NULL, NULL), out, sizeof out,
                       "{\"handshake\": [\"h2\"], \"tls\": \"1.1\"}",
                       "{\"handshake\": [\"h2\"]}", NULL);
    cr_assert(strncmp(out, "TLS_ERROR ", 10) == 0, "%s", out);
    cr_assert(strstr(out, "\nTLS h2\n") != NULL, "%s", out);
    test_wait_for_log_from(&r.pid, r.log, from,
                           "reason=\"unsupported protocol\"", 5000);
    test_rls_stop(&r);
}

/* GRPC_CLIENT_TLS_CACERT: mutual TLS. No certificate, or one of another
 * CA, is refused; the CA's own client is served. */
Test(rls_tls, a_client_ca_requires_a_certificate_it_signed)
{
    certs c;
    make_certs(&c);
    test_rls r;
    start_tls(&r, &c, c.ca, NULL);
    tls_opts o;
    assert_refused(&r, opts(&o, &c, NULL, NULL),
                   "peer did not return a certificate");
    assert_refused(&r, opts(&o, &c, c.stranger, c.stranger_key),
                   "certificate verify failed: unable to get local issuer "
                   "certificate");
    assert_served(&r, opts(&o, &c, c.client, c.client_key));
    test_rls_stop(&r);
}

/* GRPC_CLIENT_TLS_SAN: the client's certificate (DNS:localhost,
 * IP:127.0.0.1) must name it, as a DNS name or as an address. */
Test(rls_tls, a_client_san_must_be_in_the_clients_certificate)
{
    certs c;
    make_certs(&c);
    const struct {
        const char *san;
        const char *refusal; /* NULL: served */
    } cases[] = {
        {"other.example", "certificate verify failed: hostname mismatch"},
        {"127.0.0.2", "certificate verify failed: IP address mismatch"},
        {"localhost", NULL},
        {"127.0.0.1", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_rls r;
        start_tls(&r, &c, c.ca, cases[i].san);
        tls_opts o;
        const char *const *good = opts(&o, &c, c.client, c.client_key);
        if (cases[i].refusal != NULL)
            assert_refused(&r, good, cases[i].refusal);
        else
            assert_served(&r, good);
        test_rls_stop(&r);
    }
}

/* The files are checked at start: exit 3 naming the variable and the
 * file. */
Test(rls_tls, a_key_or_certificate_it_cannot_use_stops_the_start)
{
    certs c;
    make_certs(&c);
    char other_key[300], cases[5][3][400], want[5][800];
    snprintf(other_key, sizeof other_key, "%s/other.key", c.dir);
    const char *keys[5] = {c.server_key, "/nonexistent/server.key",
                           other_key, c.server_key, c.server_key};
    const char *pems[5] = {"", c.server, c.server, c.server, c.server};
    for (int i = 0; i < 5; i++) {
        snprintf(cases[i][0], sizeof cases[i][0], "GRPC_SERVER_TLS_CERT=%s",
                 pems[i]);
        snprintf(cases[i][1], sizeof cases[i][1], "GRPC_SERVER_TLS_KEY=%s",
                 keys[i]);
        snprintf(cases[i][2], sizeof cases[i][2], "GRPC_CLIENT_TLS_CACERT=%s",
                 i == 3 ? "/nonexistent/ca.pem" : i == 4 ? c.server_key
                                                         : "");
    }
    snprintf(want[0], sizeof want[0], "GRPC_SERVER_USE_TLS=true needs "
             "GRPC_SERVER_TLS_CERT");
    snprintf(want[1], sizeof want[1], "GRPC_SERVER_TLS_KEY=/nonexistent/"
             "server.key: cannot read it: No such file or directory");
    snprintf(want[2], sizeof want[2], "GRPC_SERVER_TLS_KEY=%s is not the "
             "key of GRPC_SERVER_TLS_CERT=%s", other_key, c.server);
    snprintf(want[3], sizeof want[3], "GRPC_CLIENT_TLS_CACERT=/nonexistent/"
             "ca.pem: cannot read it");
    snprintf(want[4], sizeof want[4], "GRPC_CLIENT_TLS_CACERT=%s: no CA "
             "certificate in it", c.server_key);
    for (int i = 0; i < 5; i++) {
        char log[600];
        test_log_path(log, sizeof log, "rls-tls-refused");
        setenv("RUNTIME_ROOT", "/nonexistent", 1);
        setenv("REDIS_SOCKET_TYPE", "tcp", 1);
        setenv("REDIS_URL", test_env("RL_TEST_REDIS"), 1);
        setenv("GRPC_SERVER_USE_TLS", "true", 1);
        for (int j = 0; j < 3; j++)
            putenv(cases[i][j]);
        char *argv[] = {(char *)test_env("RL_TEST_RLS"), NULL};
        pid_t pid = test_spawn(argv, log);
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 3,
                  "case %d: status %d", i, status);
        FILE *f = fopen(log, "r");
        char text[2048] = "";
        size_t n = f != NULL ? fread(text, 1, sizeof text - 1, f) : 0;
        text[n] = '\0';
        if (f != NULL)
            fclose(f);
        cr_assert(strstr(text, want[i]) != NULL, "case %d: %s, not %s", i,
                  text, want[i]);
    }
}

/* The client's variables without what they need (as upstream, of no
 * effect) are named at start, not silently dropped: here the port stays
 * cleartext. */
Test(rls_tls, tls_variables_without_use_tls_are_named_at_start)
{
    certs c;
    make_certs(&c);
    static char ca[400];
    snprintf(ca, sizeof ca, "GRPC_CLIENT_TLS_CACERT=%s", c.ca);
    const char *env[] = {ca, NULL};
    test_rls r;
    test_rls_start(&r, limits, NULL, env);
    test_wait_for_log(&r.pid, r.log, "event=setting_without_effect "
                      "GRPC_SERVER_TLS_CERT, GRPC_CLIENT_TLS_CACERT: gRPC "
                      "is served in cleartext without "
                      "GRPC_SERVER_USE_TLS=true", 5000);
    static char out[1024];
    test_rls_call(&r, out, sizeof out, "{\"health\": true}", NULL);
    cr_assert_str_eq(out, "HEALTH SERVING\n");
    test_rls_stop(&r);
}

/* --- Rotation: the pair read again on SIGHUP and when its files change */

/* dst becomes a copy of src (or of text, with src NULL) at once, by a
 * rename, as a secret volume or cert-manager swaps it. */
static void install(const char *dst, const char *src, const char *text)
{
    static char bytes[65536];
    size_t n = strlen(text != NULL ? text : "");
    if (src != NULL) {
        FILE *in = fopen(src, "r");
        cr_assert_not_null(in, "%s", src);
        n = fread(bytes, 1, sizeof bytes, in);
        fclose(in);
    } else {
        memcpy(bytes, text, n);
    }
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s.new", dst);
    FILE *out = fopen(tmp, "w");
    cr_assert_not_null(out, "%s", tmp);
    cr_assert_eq(fwrite(bytes, 1, n, out), n);
    cr_assert_eq(fclose(out), 0);
    cr_assert_eq(rename(tmp, dst), 0);
}

/* Certificate A (CA "ca") served from files that are then replaced: c's
 * server pair names them. B: a server certificate of another CA, bca. */
typedef struct rotation {
    certs c;
    char a[300], a_key[300], b[300], b_key[300], bca[300];
} rotation;

static void start_rotation(test_rls *r, rotation *rot)
{
    make_certs(&rot->c);
    test_certs_ca(rot->c.dir, "bca");
    test_certs_cert(rot->c.dir, "bca", "serverb");
    const char *dir = rot->c.dir;
    snprintf(rot->a, sizeof rot->a, "%s", rot->c.server);
    snprintf(rot->a_key, sizeof rot->a_key, "%s", rot->c.server_key);
    snprintf(rot->b, sizeof rot->b, "%s/serverb.pem", dir);
    snprintf(rot->b_key, sizeof rot->b_key, "%s/serverb.key", dir);
    snprintf(rot->bca, sizeof rot->bca, "%s/bca.pem", dir);
    snprintf(rot->c.server, sizeof rot->c.server, "%s/live.pem", dir);
    snprintf(rot->c.server_key, sizeof rot->c.server_key, "%s/live.key",
             dir);
    install(rot->c.server, rot->a, NULL);
    install(rot->c.server_key, rot->a_key, NULL);
    start_tls(r, &rot->c, NULL, NULL);
}

/* A new connection that trusts ca only: served, or refused by the
 * client (UNAVAILABLE) as the server's certificate is not of ca. */
static void assert_trusted_by(test_rls *r, const rotation *rot,
                              const char *ca, bool served)
{
    static char out[1024];
    const char *o[] = {"--ca", ca, "--name", "localhost", NULL};
    test_rls_call_with(r, o, out, sizeof out,
                       "{\"health\": true, \"timeout\": 3}", NULL);
    (void)rot;
    if (served)
        cr_assert_str_eq(out, "HEALTH SERVING\n", "%s: not served: %s", ca,
                         out);
    else
        cr_assert(strncmp(out, "ERROR 14 ", 9) == 0, "%s: served: %s", ca,
                  out);
}

Test(rls_tls, sighup_reloads_the_pair_and_a_broken_one_keeps_the_old)
{
    rotation rot;
    test_rls r;
    start_rotation(&r, &rot);
    assert_trusted_by(&r, &rot, rot.c.ca, true);
    assert_trusted_by(&r, &rot, rot.bca, false);
    long from = test_log_size(r.log);
    install(rot.c.server, rot.b, NULL);
    install(rot.c.server_key, rot.b_key, NULL);
    kill(r.pid, SIGHUP);
    test_wait_for_log_from(&r.pid, r.log, from,
                           "event=tls_reloaded why=sighup", 5000);
    assert_trusted_by(&r, &rot, rot.bca, true);
    assert_trusted_by(&r, &rot, rot.c.ca, false);
    /* Broken files: refused with OpenSSL's reason, B kept. */
    from = test_log_size(r.log);
    install(rot.c.server, NULL, "not a certificate\n");
    kill(r.pid, SIGHUP);
    char want[600];
    snprintf(want, sizeof want, "event=tls_refused why=sighup "
             "reason=\"GRPC_SERVER_TLS_CERT=%s: no certificate chain in it: "
             "PEM lib\" kept=previous", rot.c.server);
    test_wait_for_log_from(&r.pid, r.log, from, want, 5000);
    assert_trusted_by(&r, &rot, rot.bca, true);
    /* A key that is not the certificate's: refused too. */
    from = test_log_size(r.log);
    install(rot.c.server, rot.a, NULL);
    kill(r.pid, SIGHUP);
    test_wait_for_log_from(&r.pid, r.log, from, "is not the key of "
                           "GRPC_SERVER_TLS_CERT", 5000);
    assert_trusted_by(&r, &rot, rot.bca, true);
    test_rls_stop(&r);
}

/* Without a signal: the files looked at every second. */
Test(rls_tls, a_changed_pair_is_reloaded_within_seconds)
{
    rotation rot;
    test_rls r;
    start_rotation(&r, &rot);
    assert_trusted_by(&r, &rot, rot.c.ca, true);
    long from = test_log_size(r.log);
    /* The key first: the pair is refused until the certificate follows. */
    install(rot.c.server_key, rot.b_key, NULL);
    test_wait_for_log_from(&r.pid, r.log, from,
                           "event=tls_refused why=change", 5000);
    assert_trusted_by(&r, &rot, rot.c.ca, true);
    install(rot.c.server, rot.b, NULL);
    test_wait_for_log_from(&r.pid, r.log, from,
                           "event=tls_reloaded why=change", 5000);
    assert_trusted_by(&r, &rot, rot.bca, true);
    test_rls_stop(&r);
}

/* The client CA is read again too: after SIGHUP, the new CA's clients
 * are served and the old one's refused. */
Test(rls_tls, sighup_reloads_the_client_ca)
{
    certs c;
    make_certs(&c);
    char live_ca[300];
    snprintf(live_ca, sizeof live_ca, "%s/live-ca.pem", c.dir);
    install(live_ca, c.ca, NULL);
    test_rls r;
    start_tls(&r, &c, live_ca, NULL);
    tls_opts o;
    assert_served(&r, opts(&o, &c, c.client, c.client_key));
    long from = test_log_size(r.log);
    char other_ca[300];
    snprintf(other_ca, sizeof other_ca, "%s/other.pem", c.dir);
    install(live_ca, other_ca, NULL);
    kill(r.pid, SIGHUP);
    test_wait_for_log_from(&r.pid, r.log, from,
                           "event=tls_reloaded why=sighup", 5000);
    assert_served(&r, opts(&o, &c, c.stranger, c.stranger_key));
    assert_refused(&r, opts(&o, &c, c.client, c.client_key),
                   "reason=\"certificate verify failed: ");
    test_rls_stop(&r);
}
