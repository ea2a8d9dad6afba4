/*
 * rl-aggregator under systemd: the unit file passes systemd-analyze verify
 * (a test dependency: missing, the test fails), and the daemon sends READY
 * (after its sockets are bound and Redis answered), WATCHDOG pings and
 * STOPPING over NOTIFY_SOCKET, as a Type=notify service must.
 */
#include "test_aggregator.h"
#include "test_env.h"
#include "test_gateway.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

Test(service, unit_file_passes_systemd_analyze_verify)
{
    char out[4096];
    /* A dependency of the tests (Debian's systemd package, scripts/deps.sh):
     * without it the unit is not verified, and that is a failure. */
    cr_assert_eq(test_run("command -v systemd-analyze", out, sizeof out), 0,
                 "systemd-analyze is missing: install Debian's systemd "
                 "package (sh scripts/deps.sh systemd)");
    /* verify checks that ExecStart exists: point it at the built binary. */
    char bin[PATH_MAX], unit[600], cmd[PATH_MAX + 2048];
    cr_assert_not_null(realpath(test_env("RL_TEST_AGGREGATOR"), bin));
    snprintf(unit, sizeof unit, "%s/rl-aggregator.service",
             test_env("RL_TEST_TMPDIR"));
    snprintf(cmd, sizeof cmd, "sed 's|^ExecStart=/usr/local/bin/"
             "rl-aggregator|ExecStart=%s|' %s/rl-aggregator.service > %s",
             bin, test_env("RL_TEST_EXAMPLES"), unit);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "systemd-analyze verify %s", unit);
    int rc = test_run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "systemd-analyze verify: %s", out);
    cr_assert_str_empty(out, "systemd-analyze verify warned: %s", out);
}

/* rl-rls's unit (configs/rl-rls.service) verifies too, its ExecStart
 * pointed at the built binary. */
Test(service, rls_unit_file_passes_systemd_analyze_verify)
{
    char out[4096];
    cr_assert_eq(test_run("command -v systemd-analyze", out, sizeof out), 0,
                 "systemd-analyze is missing: install Debian's systemd "
                 "package (sh scripts/deps.sh systemd)");
    char bin[PATH_MAX], unit[600], cmd[PATH_MAX + 2048];
    cr_assert_not_null(realpath(test_env("RL_TEST_RLS"), bin));
    snprintf(unit, sizeof unit, "%s/rl-rls.service",
             test_env("RL_TEST_TMPDIR"));
    snprintf(cmd, sizeof cmd, "sed 's|^ExecStart=/usr/local/bin/"
             "rl-rls$|ExecStart=%s|' %s/rl-rls.service > %s", bin,
             test_env("RL_TEST_EXAMPLES"), unit);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "grep -c '^ExecStart=%s$' %s", bin, unit);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "ExecStart not set");
    snprintf(cmd, sizeof cmd, "systemd-analyze verify %s", unit);
    int rc = test_run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "systemd-analyze verify: %s", out);
    cr_assert_str_empty(out, "systemd-analyze verify warned: %s", out);
}

/* Reads datagrams until one holds want, for up to timeout_ms. */
static bool heard(int fd, const char *want, int timeout_ms)
{
    char msg[512];
    for (int waited = 0; waited < timeout_ms; waited += 50) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) != 1)
            continue;
        ssize_t n = recv(fd, msg, sizeof msg - 1, 0);
        if (n <= 0)
            continue;
        msg[n] = '\0';
        if (strstr(msg, want) != NULL)
            return true;
    }
    return false;
}

Test(service, notifies_ready_watchdog_and_stopping)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/notify-%d",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    setenv("NOTIFY_SOCKET", sa.sun_path, 1);
    setenv("WATCHDOG_USEC", "200000", 1);
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, "  - {name: per-tenant, match: tenant, "
                          "limit: 10, period: 1m, mode: synced}\n", 1000,
                          NULL);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    cr_assert(heard(fd, "READY=1", 10000), "no READY=1");
    cr_assert(heard(fd, "WATCHDOG=1", 2000), "no WATCHDOG=1 with "
              "WATCHDOG_USEC set");
    test_aggregator_stop(&agg);
    cr_assert(heard(fd, "STOPPING=1", 2000), "no STOPPING=1");
    close(fd);
    unlink(sa.sun_path);
}


Test(service, metrics_count_reports_rejections_and_redis_writes)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, "  - {name: per-tenant, match: tenant, "
                          "limit: 1000, period: 1m, mode: synced}\n", 200,
                          NULL);
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&agg, &cfg);
    rl_attr t = {"tenant", "org_metrics", 11};
    rl_decision d;
    for (int i = 0; i < 5; i++)
        cr_assert_eq(rl_check(a, &t, 1, 1, &d), RL_OK);
    /* A peer that sends garbage. */
    nng_socket s;
    cr_assert_eq(nng_req0_open(&s), 0);
    cr_assert_eq(nng_dial(s, agg.reports, NULL, 0), 0);
    cr_assert_eq(nng_send(s, "junk", 4, 0), 0);
    usleep(1500 * 1000); /* reports, and a render at each publish */
    test_http_response r;
    test_http_get(agg.metrics, "/metrics", "", &r);
    nng_close(s);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
    cr_assert_eq(r.status, 200);
    r.body[r.body_len] = '\0';
    char text[sizeof r.body + 2] = "\n";
    strcat(text, r.body);
    cr_assert_geq(test_prom_sample(text, "rl_agg_reports_total{result=\"applied\"}"), 1,
                  "%s", text);
    cr_assert_eq(test_prom_sample(text, "rl_agg_reports_rejected_total{reason="
                        "\"malformed\"}"), 1, "%s", text);
    cr_assert_geq(test_prom_sample(text, "rl_agg_agents_connected"), 1, "%s", text);
    cr_assert_geq(test_prom_sample(text, "rl_agg_entries_applied_total"), 1);
    cr_assert_eq(test_prom_sample(text, "rl_agg_redis_errors_total"), 0);
    /* One Redis write timed per report Redis answered (none RETRY). */
    test_prom_histogram h;
    test_prom_histogram_read(text, "rl_agg_redis_write_seconds", &h);
    cr_assert_eq(h.count, test_prom_sample(text, "rl_agg_reports_total{"
                                           "result=\"applied\"}")
                              + test_prom_sample(text, "rl_agg_reports_total{"
                                                 "result=\"duplicate\"}"),
                 "%s", text);
}
