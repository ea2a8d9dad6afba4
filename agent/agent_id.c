/*
 * agent_id.c: the name an agent goes by for its life (agent_id.h).
 */
#include "agent_id.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The last start time an agent id of this process took (ms): each takes a
 * later one, so that agents opened in the same millisecond differ. */
static _Atomic uint64_t last_start_ms;

/* name, with what could not sit in an id (a hash tag's braces, a tab, the
 * separators) as '_'; at most cap - 1 bytes. */
static void put_id_part(char *out, size_t cap, const char *name)
{
    size_t n = 0;
    for (; name[n] != '\0' && n + 1 < cap; n++) {
        char c = name[n];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
                     || (c >= '0' && c <= '9') || c == '-' || c == '.'
                     || c == '_';
        out[n] = plain ? c : '_';
    }
    out[n] = '\0';
}

/* An agent's id names it for an operator (rlctl agents, logs): the
 * program and the host it runs on (its short name), its pid, and when it
 * started (ms of the wall clock, base 36), "nginx@web01/4242/mj3x0a1b".
 * Unique per agent start, never reused: the aggregators apply an id's
 * reports only when numbered above the last applied, and a new agent
 * numbers from 1 (a restarted container keeps its host name and pid). No
 * memory address (an earlier id ended in one). At most 15 + 1 + 24 + 1 +
 * 10 + 1 + 9 bytes: under RL_WIRE_ID_MAX. */
void rl_agent_id_make(char *out, size_t cap)
{
    char raw[64] = "", prog[16] = "agent", host[25] = "host";
    FILE *f = fopen("/proc/self/comm", "r");
    if (f != NULL) {
        if (fgets(raw, sizeof raw, f) != NULL) {
            raw[strcspn(raw, "\n")] = '\0';
            if (raw[0] != '\0')
                put_id_part(prog, sizeof prog, raw);
        }
        fclose(f);
    }
    if (gethostname(raw, sizeof raw - 1) == 0) {
        raw[sizeof raw - 1] = '\0';
        raw[strcspn(raw, ".")] = '\0';
        if (raw[0] != '\0')
            put_id_part(host, sizeof host, raw);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t start = (uint64_t)ts.tv_sec * 1000
                     + (uint64_t)ts.tv_nsec / 1000000;
    uint64_t last = atomic_load(&last_start_ms);
    do {
        if (start <= last)
            start = last + 1;
    } while (!atomic_compare_exchange_weak(&last_start_ms, &last, start));
    char start36[16];
    size_t n = sizeof start36;
    start36[--n] = '\0';
    do {
        start36[--n] = "0123456789abcdefghijklmnopqrstuvwxyz"[start % 36];
        start /= 36;
    } while (start > 0 && n > 0);
    snprintf(out, cap, "%s@%s/%ld/%s", prog, host, (long)getpid(),
             start36 + n);
}
