/*
 * bench_peer.c: runs rlf_peer.js and reads the one line it prints. The
 * peer's figures are its own measurements, taken the same way as the C
 * clients' (requests finished over the wall time of the run).
 */
#include "bench_peer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool bench_peer_available(void)
{
    return getenv("RL_BENCH_PEER") != NULL;
}

/* Runs the peer with args; its one line of output into buf. */
static void peer(const char *args, char *buf, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "node '%s' %s", getenv("RL_BENCH_PEER"), args);
    FILE *p = popen(cmd, "r");
    if (p == NULL || fgets(buf, (int)cap, p) == NULL) {
        fprintf(stderr, "bench: `%s` printed nothing\n", cmd);
        exit(1);
    }
    if (pclose(p) != 0) {
        fprintf(stderr, "bench: `%s` failed\n", cmd);
        exit(1);
    }
    buf[strcspn(buf, "\n")] = '\0';
}

void bench_peer_version(char *buf, size_t cap)
{
    peer("version", buf, cap);
}

static void host_port(const char *addr, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", addr);
    char *colon = strrchr(buf, ':');
    if (colon != NULL)
        *colon = ' ';
}

bench_result bench_peer_run(const char *addr, int depth, int rules,
                            double seconds)
{
    char hp[80], args[160], line[256];
    host_port(addr, hp, sizeof hp);
    snprintf(args, sizeof args, "%s run %d %d %g", hp, depth, rules,
             seconds);
    peer(args, line, sizeof line);
    bench_result r = {0};
    if (sscanf(line, "%lf %lf %lf %ld", &r.rate, &r.p50_us, &r.p99_us,
               &r.errors) != 4) {
        fprintf(stderr, "bench: the peer printed `%s`\n", line);
        exit(1);
    }
    return r;
}

void bench_peer_fill(const char *addr, long n)
{
    char hp[80], args[160], line[64];
    host_port(addr, hp, sizeof hp);
    snprintf(args, sizeof args, "%s fill %ld", hp, n);
    peer(args, line, sizeof line);
}
