/*
 * bench_accuracy.c: how close a synced rule keeps a fleet to its limit, over
 * any span of one period. Ten agents in this process (rl_agent each, as ten
 * gateways would link it), one rl-aggregator (started here), the Redis of
 * `make bench`; the rule: 300 per 10 s, synced every second;
 * requests spread round-robin over the agents at 1.2, 2 and 10 times the
 * limit from a cold key (the agents have counted another key of the rule
 * first, so they know how many they are), the 10x run carried on as the
 * steady state, and a step from 0.5x to 5x. For each load: the most
 * admitted in any span of one period against the limit, and the average
 * admitted per period; per second, admitted and the trailing period's
 * count, as a table (accuracy-<load>.tsv) and a plot (accuracy-<load>.svg)
 * in $RL_BENCH_OUT. Run by `make bench` under with-redis.
 */
#include "bench_report.h"
#include "rl.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AGENTS 10
#define LIMIT 300
#define PERIOD_S 10
#define INTERVAL_MS 1000

static rl_agent *agents[AGENTS];
static rl_config *configs[AGENTS];

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void sleep_until_us(uint64_t at)
{
    struct timespec ts = {(time_t)(at / 1000000),
                          (long)(at % 1000000) * 1000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)
           == EINTR)
        ;
}

static bool allowed(rl_agent *a, const char *tenant)
{
    rl_attr attr = {"tenant", tenant, strlen(tenant)};
    rl_decision d;
    if (rl_check(a, &attr, 1, 1, &d) != RL_OK) {
        fprintf(stderr, "bench: rl_check failed\n");
        exit(1);
    }
    return d.allowed;
}

typedef struct load {
    const char *name;       /* file names and the table */
    const char *what;
    double before, after;   /* times the limit, before and after step_s */
    int step_s, seconds;
    int steady_from_s;      /* the average per period is taken from here */
} load;

typedef struct run {
    uint64_t *at_us;        /* admissions, from the run's start */
    size_t n, cap;
    long offered;
    long per_second[128], offered_per_second[128];
} run;

static void offer(const load *l, const char *tenant, run *r)
{
    uint64_t start = now_us(), end = start + (uint64_t)l->seconds * 1000000;
    double due = (double)start;
    for (long i = 0;; i++) {
        if ((uint64_t)due >= end)
            break;
        sleep_until_us((uint64_t)due);
        uint64_t t = now_us() - start;
        double times = t < (uint64_t)l->step_s * 1000000 ? l->before
                                                         : l->after;
        due += 1e6 * PERIOD_S / (times * LIMIT);
        size_t sec = (size_t)(t / 1000000);
        r->offered++;
        if (sec < 128)
            r->offered_per_second[sec]++;
        if (!allowed(agents[i % AGENTS], tenant))
            continue;
        if (r->n == r->cap) {
            r->cap = r->cap ? 2 * r->cap : 4096;
            r->at_us = realloc(r->at_us, r->cap * sizeof *r->at_us);
            if (r->at_us == NULL)
                exit(1);
        }
        r->at_us[r->n++] = t;
        if (sec < 128)
            r->per_second[sec]++;
    }
}

/* The most admitted in any span of one period. */
static long worst_span(const run *r)
{
    long worst = 0;
    for (size_t i = 0, j = 0; j < r->n; j++) {
        while (r->at_us[j] - r->at_us[i] >= PERIOD_S * 1000000ULL)
            i++;
        if ((long)(j - i + 1) > worst)
            worst = (long)(j - i + 1);
    }
    return worst;
}

/* Admitted in the period that ends at second s (s excluded). */
static long trailing(const run *r, int s)
{
    long n = 0;
    for (int k = s - PERIOD_S; k < s; k++)
        n += k >= 0 ? r->per_second[k] : 0;
    return n;
}

static void write_series(const load *l, const run *r)
{
    const char *dir = getenv("RL_BENCH_OUT");
    char path[512];
    if (dir == NULL)
        return;
    snprintf(path, sizeof path, "%s/accuracy-%s.tsv", dir, l->name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return;
    fprintf(f, "second\toffered\tadmitted\tadmitted_last_period\tlimit\n");
    for (int s = 0; s < l->seconds; s++)
        fprintf(f, "%d\t%ld\t%ld\t%ld\t%d\n", s, r->offered_per_second[s],
                r->per_second[s], trailing(r, s + 1), LIMIT);
    fclose(f);
}

/* Two charts, one above the other: admitted per second against the
 * limit's even rate, and admitted over the trailing period against the
 * limit and the 5 % bound. */
static void write_svg(const load *l, const run *r)
{
    const char *dir = getenv("RL_BENCH_OUT");
    char path[512];
    if (dir == NULL)
        return;
    snprintf(path, sizeof path, "%s/accuracy-%s.svg", dir, l->name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return;
    const int w = 720, h = 200, left = 60, top = 40, gap = 60;
    double xs = (double)(w - left - 20) / l->seconds;
    long peak = LIMIT / PERIOD_S * 2;
    for (int s = 0; s < l->seconds; s++)
        peak = r->per_second[s] > peak ? r->per_second[s] : peak;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
            "height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"20\" font-size=\"14\">synced, %d agents, "
            "limit %d per %d s, sync every %d ms: %s</text>\n", w,
            2 * h + top + gap + 30, left, AGENTS, LIMIT, PERIOD_S,
            INTERVAL_MS, l->what);
    for (int chart = 0; chart < 2; chart++) {
        int y0 = top + chart * (h + gap);
        double ymax = chart == 0 ? (double)peak * 1.1 : LIMIT * 1.3;
        double ys = h / ymax;
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", left, y0 - 6,
                chart == 0 ? "admitted per second (blue), offered (grey), "
                             "limit / period (red)"
                           : "admitted in the trailing period (blue), limit "
                             "(red), 1.05 x limit (orange)");
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                "fill=\"none\" stroke=\"black\"/>\n", left, y0,
                w - left - 20, h);
        for (int tick = 0; tick <= 4; tick++) {
            double v = ymax * tick / 4;
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.0f"
                    "</text>\n", left - 4, y0 + h - v * ys + 4, v);
        }
        for (int s = 0; s <= l->seconds; s += PERIOD_S)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">"
                    "%d s</text>\n", left + s * xs, y0 + h + 14, s);
        const char *colors[] = {"grey", "blue"};
        for (int series = chart == 0 ? 0 : 1; series < 2; series++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" "
                    "stroke-width=\"1.5\" points=\"", colors[series]);
            for (int s = 0; s < l->seconds; s++) {
                long v = chart == 1 ? trailing(r, s + 1)
                         : series == 0 ? r->offered_per_second[s]
                                       : r->per_second[s];
                double y = y0 + h - (v > ymax ? ymax : (double)v) * ys;
                fprintf(f, "%.1f,%.1f %.1f,%.1f ", left + s * xs, y,
                        left + (s + 1) * xs, y);
            }
            fprintf(f, "\"/>\n");
        }
        double lines[2] = {chart == 0 ? (double)LIMIT / PERIOD_S : LIMIT,
                           LIMIT * 1.05};
        const char *lc[2] = {"red", "orange"};
        for (int k = 0; k < (chart == 0 ? 1 : 2); k++)
            fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" "
                    "stroke=\"%s\" stroke-dasharray=\"6 4\"/>\n", left,
                    w - 20, y0 + h - lines[k] * ys, y0 + h - lines[k] * ys,
                    lc[k]);
    }
    fprintf(f, "</svg>\n");
    fclose(f);
}

static pid_t start_aggregator(const char *bin, const char *config)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl(bin, bin, "--config", config, "--log-level", "error",
              (char *)NULL);
        _exit(127);
    }
    usleep(500 * 1000);
    return pid;
}

int main(int argc, char **argv)
{
    const char *addr = getenv("RL_TEST_REDIS");
    const char *tmp = getenv("RL_TEST_TMPDIR");
    if (addr == NULL || tmp == NULL || argc < 2) {
        fprintf(stderr, "bench: run through `make bench`\n");
        return 1;
    }
    bool quick = getenv("RL_BENCH_QUICK") != NULL
                 && strcmp(getenv("RL_BENCH_QUICK"), "0") != 0;
    char config[512];
    snprintf(config, sizeof config, "%s/bench-accuracy.yaml", tmp);
    FILE *f = fopen(config, "w");
    int port = 10000 + getpid() % 10000;
    fprintf(f, "store: {url: \"redis://%s\"}\n"
               "aggregator: {reports: \"tcp://127.0.0.1:%d\", "
               "totals: \"tcp://127.0.0.1:%d\", sync_interval_ms: %d}\n"
               "rules:\n  - {name: accuracy, match: tenant, "
               "limit: %d, period: %ds, mode: synced}\n",
            addr, port, port + 1, INTERVAL_MS, LIMIT, PERIOD_S);
    fclose(f);
    pid_t agg = start_aggregator(argv[1], config);
    for (int i = 0; i < AGENTS; i++) {
        rl_error err;
        rl_options o = {0};
        if (rl_config_load(config, &configs[i], &err) != RL_OK
            || (o.config = configs[i],
                rl_agent_open(&agents[i], &o, &err)) != RL_OK) {
            fprintf(stderr, "bench: %s\n", err.message);
            return 1;
        }
    }
    /* Each agent counts a warm key, and hears the totals that say how
     * many they are. */
    for (int i = 0; i < AGENTS; i++)
        allowed(agents[i], "warm");
    usleep(3 * INTERVAL_MS * 1000);

    int scale = quick ? 1 : 3; /* periods per load */
    load loads[] = {
        {"1.2x", "1.2 x the limit, cold key", 1.2, 1.2, 0,
         scale * PERIOD_S, 0},
        {"2x", "2 x the limit, cold key", 2, 2, 0, scale * PERIOD_S, 0},
        {"10x", "10 x the limit, cold key, then steady", 10, 10, 0,
         (scale + 1) * PERIOD_S, PERIOD_S},
        {"step", "0.5 x then 5 x the limit", 0.5, 5, PERIOD_S,
         (scale + 1) * PERIOD_S, 2 * PERIOD_S},
    };
    printf("## Synced accuracy over any span of one period\n\n"
           "%d agents in one process (one rl_agent each), one "
           "rl-aggregator, one Redis; a synced rule of %d per %d s, "
           "sync_interval_ms %d; requests round-robin over the agents. Cold: "
           "a key no agent has counted (the agents have counted another key "
           "of the rule, so they know how many they are). \"Worst span\" is "
           "the most admitted in any %d s, wherever it starts; the average "
           "is per %d s over the whole run (10x: from its second period on, "
           "the steady state; step: from the period after the step). Plots: "
           "accuracy-<load>.svg.\n\n"
           "| load | offered | admitted | worst span | worst span / limit | "
           "average per period | average / limit |\n"
           "|---|---|---|---|---|---|---|\n", AGENTS, LIMIT, PERIOD_S,
           INTERVAL_MS, PERIOD_S, PERIOD_S);
    double worst_ratio = 0, steady = 0;
    char summary[512] = "";
    for (size_t k = 0; k < sizeof loads / sizeof loads[0]; k++) {
        const load *l = &loads[k];
        char tenant[64];
        snprintf(tenant, sizeof tenant, "cold_%s_%d", l->name, (int)getpid());
        run r = {0};
        offer(l, tenant, &r);
        long worst = worst_span(&r);
        long tail = 0;
        for (int s = l->steady_from_s; s < l->seconds; s++)
            tail += r.per_second[s];
        double avg = (double)tail * PERIOD_S
                     / (double)(l->seconds - l->steady_from_s);
        printf("| %s | %ld | %zu | %ld | %.3f | %.1f | %.3f |\n", l->what,
               r.offered, r.n, worst, (double)worst / LIMIT, avg,
               avg / LIMIT);
        fflush(stdout);
        write_series(l, &r);
        write_svg(l, &r);
        if ((double)worst / LIMIT > worst_ratio)
            worst_ratio = (double)worst / LIMIT;
        if (strcmp(l->name, "10x") == 0)
            steady = avg / LIMIT;
        size_t used = strlen(summary);
        snprintf(summary + used, sizeof summary - used, "%s%s %.3f",
                 k ? ", " : "", l->name, (double)worst / LIMIT);
        free(r.at_us);
    }
    char rl[600], steady_text[64];
    snprintf(rl, sizeof rl, "worst span / limit: %s", summary);
    snprintf(steady_text, sizeof steady_text, "steady 10x: %.3f x the limit "
             "per period", steady);
    bench_figure("synced, 10 agents, 300 per 10 s, most admitted in any "
                 "10 s", rl, steady_text);
    bench_target("synced, worst span of one period / limit, every load",
                 worst_ratio, "<=", 1.05, "x");
    bench_target("synced, steady 10x overload, admitted per period / limit",
                 steady, ">=", 0.9, "x");
    for (int i = 0; i < AGENTS; i++) {
        rl_agent_close(agents[i]);
        rl_config_free(configs[i]);
    }
    kill(agg, SIGTERM);
    waitpid(agg, NULL, 0);
    return 0;
}
