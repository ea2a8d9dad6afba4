/*
 * bench_capacity.c: the lean client. Its commands are the plain loop's
 * (bench_pipeline.c), same keys and arguments, but all of them are
 * formatted before the clock starts, written 500 to a system call with
 * 1,000 in flight, and a reply is read as the line it is (an integer, or
 * an error) without building an object. What it costs per call is measured
 * beside what Redis costs, so the bound can be stated with the client's
 * share accounted.
 */
#include "bench_capacity.h"

#include "bench_redis.h"
#include "bench_stats.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BATCH 500 /* commands per write; BENCH_KEYS is a multiple */
#define PASSES 90 /* calls per key at most: under its limit of 100 */

_Static_assert(BENCH_KEYS % BATCH == 0, "batches do not straddle a pass");

void bench_meter_start(bench_meter *m, redisContext *ctl, clockid_t clock)
{
    bench_run(ctl, "CONFIG RESETSTAT");
    *m = (bench_meter){.ctl = ctl, .clock = clock,
                       .server_cpu = bench_server_cpu_s(ctl),
                       .cpu = bench_cpu_s(clock), .start = bench_now_s()};
}

bench_account bench_meter_stop(const bench_meter *m)
{
    double elapsed = bench_now_s() - m->start;
    double cpu = bench_cpu_s(m->clock) - m->cpu;
    double server_cpu = bench_server_cpu_s(m->ctl) - m->server_cpu;
    bench_account a = {0};
    double usec;
    bench_script_stats(m->ctl, &a.calls, &usec);
    if (a.calls > 0) {
        a.rate = a.calls / elapsed;
        a.server_usec = usec / a.calls;
        a.server_cpu_us = server_cpu * 1e6 / a.calls;
        a.client_cpu_us = cpu * 1e6 / a.calls;
    }
    return a;
}

/* Every key once, in a shuffled order, as one buffer; at[i] is where
 * command i starts, at[BENCH_KEYS] the end. */
static char *format_commands(const bench_script *s, long period_ms,
                             size_t *at)
{
    static int order[BENCH_KEYS];
    unsigned seed = 7;
    for (int i = 0; i < BENCH_KEYS; i++)
        order[i] = i;
    for (int i = BENCH_KEYS - 1; i > 0; i--) {
        int j = rand_r(&seed) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    size_t len = 0, cap = (size_t)BENCH_KEYS * 128;
    char *buf = malloc(cap);
    for (int i = 0; i < BENCH_KEYS; i++) {
        char key[64], *cmd;
        bench_key(key, sizeof key, 0, order[i]);
        int n = redisFormatCommand(&cmd, "%s %s 1 %s 100 100 %ld 1",
                                   s->command, s->name, key, period_ms);
        if (n < 0 || len + (size_t)n > cap) {
            fprintf(stderr, "bench: cannot format the lean client's "
                    "commands\n");
            exit(1);
        }
        at[i] = len;
        memcpy(buf + len, cmd, (size_t)n);
        len += (size_t)n;
        redisFreeCommand(cmd);
    }
    at[BENCH_KEYS] = len;
    return buf;
}

static void write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "bench: lean client: write: %s\n",
                    strerror(errno));
            exit(1);
        }
        p += n;
        len -= (size_t)n;
    }
}

/* Replies as lines: each one, integer or error, is exactly one. */
typedef struct replies {
    int fd;
    enum { LINE_START, AFTER_COLON, IN_LINE } at;
    long lines, errors, rejected;
    char buf[1 << 16];
} replies;

static void read_replies(replies *r)
{
    ssize_t n = read(r->fd, r->buf, sizeof r->buf);
    if (n < 0 && errno == EINTR)
        return;
    if (n <= 0) {
        fprintf(stderr, "bench: lean client: connection lost\n");
        exit(1);
    }
    for (const char *p = r->buf, *end = r->buf + n; p < end;) {
        if (r->at == LINE_START) {
            r->errors += *p == '-';
            r->at = *p == ':' ? AFTER_COLON : IN_LINE;
            p++;
            continue;
        }
        if (r->at == AFTER_COLON) {
            r->rejected += *p == '-'; /* rl's reply is -(d + 1) then */
            r->at = IN_LINE;
        }
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            break;
        r->lines++;
        r->at = LINE_START;
        p = nl + 1;
    }
}

bench_account bench_capacity_run(const char *addr, redisContext *ctl,
                                  const bench_script *s, long period_ms,
                                  double seconds)
{
    static size_t at[BENCH_KEYS + 1];
    char *cmds = format_commands(s, period_ms, at);
    redisContext *c = bench_connect(addr);
    replies *r = calloc(1, sizeof *r);
    r->fd = c->fd;
    long sent = 0, last = (long)PASSES * BENCH_KEYS;
    bench_meter m;
    bench_meter_start(&m, ctl, CLOCK_THREAD_CPUTIME_ID);
    double end = m.start + seconds;
    while (sent < last) {
        /* Two batches in flight: one being answered while the next is
         * read by the server. */
        if (sent - r->lines <= BATCH && (sent == 0 || bench_now_s() < end)) {
            long i = sent % BENCH_KEYS;
            write_all(c->fd, cmds + at[i], at[i + BATCH] - at[i]);
            sent += BATCH;
            continue;
        }
        if (r->lines == sent)
            break;
        read_replies(r);
    }
    while (r->lines < sent)
        read_replies(r);
    bench_account a = bench_meter_stop(&m);
    if (r->errors > 0 || r->rejected > 0)
        fprintf(stderr, "bench: lean client: %ld errors, %ld rejected\n",
                r->errors, r->rejected);
    free(r);
    free(cmds);
    redisFree(c);
    return a;
}
