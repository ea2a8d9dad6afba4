/*
 * bench_report.h: what the benchmarks hand to scripts/bench.sh besides
 * their own tables: one line per headline figure and one per target, in
 * files under $RL_BENCH_OUT. The script puts them at the top of the report
 * and judges each target itself, so that "met" is never typed by hand.
 */
#ifndef RL_BENCH_REPORT_H
#define RL_BENCH_REPORT_H

#include <stdio.h>
#include <stdlib.h>

/* A whole number with thousands separators, "183,467", for the figures
 * table. The text lives in one of eight rotating buffers: enough for the
 * arguments of one snprintf; single-threaded use only. */
static inline const char *bench_int(double v)
{
    static char bufs[8][32];
    static int next;
    char *out = bufs[next++ % 8], digits[32];
    int n = snprintf(digits, sizeof digits, "%.0f", v < 0 ? -v : v);
    int o = 0;
    if (v <= -0.5)
        out[o++] = '-';
    for (int i = 0; i < n; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            out[o++] = ',';
        out[o++] = digits[i];
    }
    out[o] = '\0';
    return out;
}

/* Appends one tab-separated line to $RL_BENCH_OUT/name (nothing when run
 * outside `make bench`). */
static inline void bench_report_line(const char *name, const char *line)
{
    const char *dir = getenv("RL_BENCH_OUT");
    char path[512];
    if (dir == NULL)
        return;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(stderr, "bench: cannot write %s\n", path);
        return;
    }
    fprintf(f, "%s\n", line);
    fclose(f);
}

/* A row of the report's figures table: what, rl's figure, and what it is
 * compared with in the same run. Medians of the runs. */
static inline void bench_figure(const char *what, const char *rl,
                                const char *others)
{
    char line[1024];
    snprintf(line, sizeof line, "%s\t%s\t%s", what, rl, others);
    bench_report_line("figures.tsv", line);
}

/* A target: measured (a median) against wanted, cmp one of "<", "<=",
 * ">=". bench.sh says whether it is met. */
static inline void bench_target(const char *what, double measured,
                                const char *cmp, double wanted,
                                const char *unit)
{
    char line[512];
    snprintf(line, sizeof line, "%s\t%.2f\t%s\t%.2f\t%s", what, measured, cmp,
             wanted, unit);
    bench_report_line("targets.tsv", line);
}

#endif
