/*
 * duration.c: periods as whole milliseconds. A rate is kept as two integers,
 * tokens per period in ms, so "100 a minute" stays exact; this file is where
 * the period half of that pair comes from.
 */
#include "duration.h"

#include "rl.h"

#include <stdio.h>
#include <string.h>

struct unit {
    const char *suffix;
    uint64_t ms;
};

/* Largest first, so that formatting picks the largest exact unit. */
static const struct unit units[] = {
    {"d", 24ULL * 3600 * 1000},
    {"h", 3600ULL * 1000},
    {"m", 60ULL * 1000},
    {"s", 1000},
    {"ms", 1},
};

int rl_duration_parse(const char *text, uint64_t *ms)
{
    if (text == NULL || ms == NULL)
        return RL_EINVAL;
    uint64_t count = 0;
    const char *p = text;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (count > RL_DURATION_MAX_MS)
            return RL_EINVAL; /* already too long: stop before overflow */
        count = count * 10 + (uint64_t)(*p - '0');
    }
    if (p == text || count == 0)
        return RL_EINVAL;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].suffix) != 0)
            continue;
        if (count > RL_DURATION_MAX_MS / units[i].ms)
            return RL_EINVAL;
        *ms = count * units[i].ms;
        return RL_OK;
    }
    return RL_EINVAL;
}

void rl_duration_format(uint64_t ms, char *buf, size_t len)
{
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (ms != 0 && ms % units[i].ms == 0) {
            snprintf(buf, len, "%llu%s",
                     (unsigned long long)(ms / units[i].ms), units[i].suffix);
            return;
        }
    }
    snprintf(buf, len, "%llums", (unsigned long long)ms);
}
