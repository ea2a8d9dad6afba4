/*
 * rl-aggregator under systemd: the unit file passes systemd-analyze verify
 * (where systemd-analyze exists), and the daemon sends READY (after its
 * sockets are bound and Redis answered), WATCHDOG pings and STOPPING over
 * NOTIFY_SOCKET, as a Type=notify service must.
 */
#include "test_aggregator.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <limits.h>
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
    if (test_run("command -v systemd-analyze", out, sizeof out) != 0) {
        fprintf(stderr, "service: no systemd-analyze here, unit not "
                "verified\n");
        return;
    }
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
