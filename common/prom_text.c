/*
 * prom_text.c: see prom_text.h.
 */
#include "prom_text.h"

#include <stdio.h>
#include <string.h>

void rl_prom_family(rl_prom_put *put, void *out, const char *name,
                    const char *type, const char *help)
{
    put(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A bound as a plain decimal ("0.00001", "2.5", "10"): the le label is
 * matched as text in PromQL, so every process must write it alike. */
static void format_bound(double s, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.6f", s);
    char *end = buf + strlen(buf);
    while (end[-1] == '0')
        *--end = '\0';
    if (end[-1] == '.')
        end[-1] = '\0';
}

void rl_prom_histogram(rl_prom_put *put, void *out, const char *name,
                       const char *help, const rl_histogram *h)
{
    rl_prom_family(put, out, name, "histogram", help);
    for (int i = 0; i < RL_HISTOGRAM_BOUNDS; i++) {
        char le[32];
        format_bound(h->le_s[i], le, sizeof le);
        put(out, "%s_bucket{le=\"%s\"} %llu\n", name, le,
            (unsigned long long)h->buckets[i]);
    }
    put(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9f\n%s_count %llu\n",
        name, (unsigned long long)h->count, name, h->sum_s, name,
        (unsigned long long)h->count);
}
