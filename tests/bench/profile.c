/*
 * profile.c: the loads `make profile` (scripts/profile.sh) runs under
 * callgrind, to count instructions rather than time them: instruction
 * counts do not move with the machine's other tenants.
 *
 *   profile synced N  N synced checks over 1,000 keys on one thread, after
 *                     a first round that makes the keys. callgrind collects
 *                     inside rl_check only (--toggle-collect=rl_check) and
 *                     dumps on entry to measured_checks, so the last dump
 *                     holds the N checks alone.
 *   profile exact N   against a redis-server run under callgrind that
 *                     collects inside FCALL and EVALSHA and dumps before
 *                     each ECHO: for rl's function (a whole-ms and a
 *                     fractional interval) and the seed's script, N calls
 *                     on new keys, ECHO, the same N keys again, ECHO. Each
 *                     dump is read back here (RL_PROFILE_DIR) and printed
 *                     as instructions per call.
 */
#include "bench_pipeline.h"
#include "bench_redis.h"
#include "rl.h"
#include "scripts.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEYS 1000

static char values[KEYS][16];
static size_t value_lens[KEYS];

static void check_round(rl_agent *agent, long n)
{
    for (long i = 0; i < n; i++) {
        rl_attr a = {"tenant", values[i % KEYS], value_lens[i % KEYS]};
        rl_decision d;
        if (rl_check(agent, &a, 1, 1, &d) != RL_OK || !d.allowed) {
            fprintf(stderr, "profile: a synced check was not allowed\n");
            exit(1);
        }
    }
}

/* Its own function, not inlined, so that callgrind can dump on entry. */
__attribute__((noinline)) static void measured_checks(rl_agent *agent,
                                                      long n)
{
    check_round(agent, n);
}

static int synced(const char *addr, long n)
{
    for (int i = 0; i < KEYS; i++)
        value_lens[i] = (size_t)snprintf(values[i], sizeof values[i],
                                         "org_%d", i);
    char yaml[512];
    int len = snprintf(yaml, sizeof yaml,
                       "store: {url: \"redis://%s\"}\n"
                       "aggregator: {reports: \"tcp://127.0.0.1:1\", "
                       "totals: \"tcp://127.0.0.1:2\"}\n"
                       "rules:\n  - {name: per-tenant, match: tenant, "
                       "limit: 1000000000000, period: 1s, mode: synced}\n",
                       addr);
    rl_config *cfg;
    rl_error err;
    rl_agent *agent;
    rl_options o = {0};
    if (rl_config_parse(yaml, (size_t)len, "profile", &cfg, &err) != RL_OK
        || (o.config = cfg, rl_agent_open(&agent, &o, &err)) != RL_OK) {
        fprintf(stderr, "profile: %s\n", err.message);
        return 1;
    }
    check_round(agent, KEYS); /* first sightings */
    measured_checks(agent, n);
    rl_agent_close(agent);
    rl_config_free(cfg);
    printf("profile: %ld synced checks over %d keys\n", n, KEYS);
    return 0;
}

/* The instructions in the newest dump in dir: the one with the highest
 * part number (callgrind.out.PID.N). */
static double last_dump(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "profile: cannot read %s\n", dir);
        exit(1);
    }
    long best = -1, pid, part;
    char name[256] = "";
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (sscanf(e->d_name, "callgrind.out.%ld.%ld", &pid, &part) == 2
            && part > best) {
            best = part;
            snprintf(name, sizeof name, "%s", e->d_name);
        }
    }
    closedir(d);
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    double total = -1;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "totals:", 7) == 0)
            total = atof(line + 7);
        else if (total < 0 && strncmp(line, "summary:", 8) == 0)
            total = atof(line + 8);
    }
    if (f != NULL)
        fclose(f);
    if (total < 0) {
        fprintf(stderr, "profile: no totals in %s\n", path);
        exit(1);
    }
    return total;
}

/* ECHO makes the server dump what it collected since the last dump. */
static double dump(redisContext *c, const char *dir)
{
    bench_run(c, "ECHO dump");
    return last_dump(dir);
}

static int exact(const char *addr, long n)
{
    const char *dir = getenv("RL_PROFILE_DIR");
    if (dir == NULL) {
        fprintf(stderr, "profile: run through `make profile`\n");
        return 1;
    }
    redisContext *c = bench_connect(addr);
    freeReplyObject(bench_command(c, "FUNCTION LOAD REPLACE %s",
                                  rl_library_source));
    bench_script fn = {.command = "FCALL"}, seed;
    snprintf(fn.name, sizeof fn.name, "%s", RL_FUNCTION_BUCKET);
    bench_seed_script(c, &seed);
    const struct {
        const char *what;
        const bench_script *script;
        long period_ms;
    } cases[] = {
        {"rl's function (FCALL), 100 per day: a whole-ms interval", &fn,
         86400000},
        {"rl's function (FCALL), 100 per 86,400,001 ms: fractional", &fn,
         86400001},
        {"seed's script (EVALSHA), 100 per day", &seed, 86400000},
    };
    dump(c, dir); /* what came before: loading, nothing to count */
    printf("| script | new key | existing key | both |\n|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bench_run(c, "FLUSHALL");
        bench_load load = {.depth = 64, .rules = 1, .requests = n,
                           .period_ms = cases[i].period_ms};
        bench_pipeline(addr, cases[i].script, &load, NULL);
        double fresh = dump(c, dir) / (double)n;
        bench_pipeline(addr, cases[i].script, &load, NULL);
        double again = dump(c, dir) / (double)n;
        printf("| %s | %.0f | %.0f | %.0f |\n", cases[i].what, fresh, again,
               (fresh + again) / 2);
    }
    redisFree(c);
    return 0;
}

int main(int argc, char **argv)
{
    const char *addr = getenv("RL_TEST_REDIS");
    long n = argc > 2 ? atol(argv[2]) : 0;
    if (addr == NULL || n <= 0) {
        fprintf(stderr, "usage (through `make profile`): profile synced|"
                "exact N\n");
        return 1;
    }
    if (strcmp(argv[1], "synced") == 0)
        return synced(addr, n);
    if (strcmp(argv[1], "exact") == 0)
        return exact(addr, n);
    fprintf(stderr, "profile: synced or exact, not %s\n", argv[1]);
    return 1;
}
