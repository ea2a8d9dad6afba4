/*
 * in_flight.c: the slots this agent holds, and their writes (in_flight.h).
 *
 * One write (rl_6_slots) serves releases and renewals: each key's field
 * is given a new expiry and, for a release, its count less the slots let
 * go ("-D"); for a renewal, the count this agent holds ("=C"), which also
 * repairs what a lost answer left wrong. A release marks its key due and
 * the turn's due keys leave together when the loop goes idle; the renewal
 * marks every key due each lease / 4, so a live agent's fields are always
 * at least three quarters of a lease from expiring, and a dead one's go
 * within a lease of its last renewal.
 *
 * A take is counted as held when it is sent, not when it is answered. A
 * renewal while one is unanswered cannot know whether the store took it,
 * so it only moves the expiry ("~C"). The takes sent before it have run
 * when it runs, and one the store took left the field there: a field
 * gone means they were all refused, and C, the slots answered as taken,
 * is set (the field had expired while the store was away). The next
 * renewal with no take unanswered sets the count. Releases are relative,
 * so the store's sum stays exact.
 *
 * On a cluster a script's keys must share a hash slot, so a write is one
 * call per slot due (and per KEYS_PER_CALL keys). Each key's slot is
 * computed once, when it is first held, and the due keys wait in a list
 * that a flush sorts by slot in linear time: a renewal of K keys costs
 * O(K) here however many slots they span. The store sends the calls of a
 * turn to each primary in one pipelined write (node.c), so a renewal is
 * one write per primary, with one call per slot in it.
 */
#include "in_flight.h"

#include "keys.h"
#include "resp.h"
#include "scripts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keys in one write at most: a script runs alone on Redis's thread, and
 * an agent holding more keys than this renews them in several calls. */
#define KEYS_PER_CALL 512

struct rl_in_flight_key {
    rl_in_flight_key *next;
    rl_in_flight_key *due_next; /* in f->due, while due */
    uint64_t hash;
    uint16_t slot;       /* its cluster slot, computed once */
    uint64_t held;       /* slots held, takes not yet answered included */
    uint32_t unanswered; /* takes sent, not yet answered */
    uint64_t released;   /* slots let go, not yet written */
    bool due;            /* to be written in the next flush */
    bool renew;          /* ...as a renewal */
    size_t len;
    char key[];
};

int rl_in_flight_init(rl_in_flight *f, const char *id, uint32_t lease_ms)
{
    snprintf(f->id, sizeof f->id, "%s", id);
    rl_resp_unsigned(f->lease, lease_ms);
    f->lease_ms = lease_ms;
    f->cap = 64;
    f->table = calloc(f->cap, sizeof *f->table);
    return f->table != NULL ? RL_OK : RL_ENOMEM;
}

static rl_in_flight_key **find(const rl_in_flight *f, const char *key,
                               size_t len, uint64_t hash)
{
    rl_in_flight_key **at = &f->table[hash & (f->cap - 1)];
    while (*at != NULL && ((*at)->hash != hash || (*at)->len != len
                           || memcmp((*at)->key, key, len) != 0))
        at = &(*at)->next;
    return at;
}

/* Doubles the table when it is as full as it is long (chains of one or
 * two); a failed grow keeps the longer chains. */
static void grow(rl_in_flight *f)
{
    size_t cap = f->cap * 2;
    rl_in_flight_key **t = calloc(cap, sizeof *t);
    if (t == NULL)
        return;
    for (size_t i = 0; i < f->cap; i++) {
        for (rl_in_flight_key *k = f->table[i], *next; k != NULL; k = next) {
            next = k->next;
            k->next = t[k->hash & (cap - 1)];
            t[k->hash & (cap - 1)] = k;
        }
    }
    free(f->table);
    f->table = t;
    f->cap = cap;
}

static rl_in_flight_key *lookup(const rl_in_flight *f, const char *key,
                                size_t len)
{
    return *find(f, key, len, rl_key_hash_value(key, len));
}

static void on_flush(uv_idle_t *idle);

/* Puts k in the next flush, once. */
static void make_due(rl_in_flight *f, rl_in_flight_key *k)
{
    if (k->due)
        return;
    k->due = true;
    k->due_next = f->due;
    f->due = k;
    f->n_due++;
}

static void schedule(rl_in_flight *f, rl_in_flight_key *k)
{
    make_due(f, k);
    if (f->started)
        uv_idle_start(&f->flush, on_flush);
}

void rl_in_flight_taking(rl_in_flight *f, const char *key, size_t len)
{
    uint64_t hash = rl_key_hash_value(key, len);
    rl_in_flight_key **at = find(f, key, len, hash);
    rl_in_flight_key *k = *at;
    if (k == NULL) {
        k = calloc(1, sizeof *k + len);
        if (k == NULL)
            return; /* uncounted: the take's answer finds no key */
        k->hash = hash;
        k->slot = rl_key_slot(key, len);
        k->len = len;
        memcpy(k->key, key, len);
        *at = k;
        if (++f->n > f->cap)
            grow(f);
    }
    k->held++;
    k->unanswered++;
}

/* Whether k is held by no request and no take, with nothing to write:
 * then it is forgotten. */
static bool idle(const rl_in_flight_key *k)
{
    return k->held == 0 && k->unanswered == 0 && !k->due
           && k->released == 0;
}

static void forget(rl_in_flight *f, rl_in_flight_key *k)
{
    rl_in_flight_key **at = find(f, k->key, k->len, k->hash);
    *at = k->next;
    free(k);
    f->n--;
}

void rl_in_flight_taken(rl_in_flight *f, const char *key, size_t len,
                        bool took)
{
    rl_in_flight_key *k = lookup(f, key, len);
    if (k == NULL || k->unanswered == 0)
        return;
    k->unanswered--;
    k->held -= !took;
    if (idle(k))
        forget(f, k);
}

void rl_in_flight_release(rl_in_flight *f, const char *key, size_t len)
{
    rl_in_flight_key *k = lookup(f, key, len);
    if (k == NULL || k->held == 0)
        return;
    k->held--;
    k->released++;
    schedule(f, k);
}

uint64_t rl_in_flight_held(const rl_in_flight *f, const char *key,
                           size_t len)
{
    const rl_in_flight_key *k = lookup(f, key, len);
    return k != NULL ? k->held : 0;
}

/* One of the close's writes is answered: the last ends the close. */
static void closing_answered(rl_in_flight *f)
{
    if (f->closed != NULL && --f->closing_calls == 0) {
        void (*done)(void *) = f->closed;
        f->closed = NULL;
        uv_timer_stop(&f->renew);
        done(f->closed_arg);
    }
}

static void on_written(void *arg, const redisReply *reply, const char *error)
{
    rl_in_flight *f = arg;
    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER)
        rl_log(f->log, RL_LOG_WARN, "in_flight_write_failed",
               "reason=\"%s\"", reply == NULL ? error : "unexpected reply");
}

/* A write of the close's: only those count towards its end, not one a
 * release sent before it. */
static void on_close_written(void *arg, const redisReply *reply,
                             const char *error)
{
    on_written(arg, reply, error);
    closing_answered(arg);
}

/* A due key's part of a write (see the top), and it is no longer due. */
static void write_op(rl_in_flight_key *k, char *op)
{
    if (k->renew && k->unanswered == 0) {
        op[0] = '=';
        rl_resp_unsigned(op + 1, k->held);
    } else if (k->released > 0) {
        op[0] = '-';
        rl_resp_unsigned(op + 1, k->released);
    } else {
        op[0] = '~';
        rl_resp_unsigned(op + 1, k->held - k->unanswered);
    }
    k->released = 0;
    k->due = k->renew = false;
}

/* What one write's arguments take. */
typedef struct write_args {
    const char *argv[3 + 2 * KEYS_PER_CALL];
    size_t lens[3 + 2 * KEYS_PER_CALL];
    char counts[KEYS_PER_CALL][24];
} write_args;

/* One write of keys[0..n), n <= KEYS_PER_CALL, all of one cluster slot
 * on a cluster. */
static void write_keys(rl_in_flight *f, rl_in_flight_key *const *keys,
                       int n, write_args *w)
{
    const char **argv = w->argv;
    size_t *lens = w->lens;
    char (*counts)[24] = w->counts;
    for (int i = 0; i < n; i++) {
        argv[1 + i] = keys[i]->key;
        lens[1 + i] = keys[i]->len;
        write_op(keys[i], counts[i]);
    }
    char numkeys[24];
    argv[0] = numkeys;
    lens[0] = rl_resp_unsigned(numkeys, (uint64_t)n);
    argv[1 + n] = f->id;
    lens[1 + n] = strlen(f->id);
    argv[2 + n] = f->lease;
    lens[2 + n] = strlen(f->lease);
    for (int i = 0; i < n; i++) {
        argv[3 + n + i] = counts[i];
        lens[3 + n + i] = strlen(counts[i]);
    }
    if (f->closed != NULL)
        f->closing_calls++;
    rl_store_run(f->store, RL_SCRIPT_SLOTS, 3 + 2 * n, argv, lens,
                 f->closed != NULL ? on_close_written : on_written, f);
}

/* Sorts keys[0..n) by slot, stably, in two counting passes of 7 bits
 * (slots have 14), through tmp[0..n): linear in n, where a scan of the
 * table per slot was n x slots. */
static void sort_by_slot(rl_in_flight_key **keys, rl_in_flight_key **tmp,
                         size_t n)
{
    for (int shift = 0; shift < 14; shift += 7) {
        size_t at[129] = {0};
        for (size_t i = 0; i < n; i++)
            at[((keys[i]->slot >> shift) & 127) + 1]++;
        for (int b = 0; b < 128; b++)
            at[b + 1] += at[b];
        for (size_t i = 0; i < n; i++)
            tmp[at[(keys[i]->slot >> shift) & 127]++] = keys[i];
        memcpy(keys, tmp, n * sizeof *keys);
    }
}

/* How many of keys[0..n) go in the first write: up to KEYS_PER_CALL, of
 * the first one's slot on a cluster. */
static int call_size(const rl_in_flight *f, rl_in_flight_key *const *keys,
                     size_t n)
{
    bool cluster = rl_store_is_cluster(f->store);
    size_t i = 1;
    while (i < n && i < KEYS_PER_CALL
           && (!cluster || keys[i]->slot == keys[0]->slot))
        i++;
    return (int)i;
}

/* Writes every due key, one call per cluster slot (and per
 * KEYS_PER_CALL keys); a key its write leaves idle is forgotten. */
static void flush(rl_in_flight *f)
{
    if (f->store == NULL || f->due == NULL)
        return;
    write_args *w = malloc(sizeof *w);
    rl_in_flight_key **keys = malloc(2 * f->n_due * sizeof *keys);
    if (w == NULL || keys == NULL) {
        free(w);
        free(keys);
        rl_log(f->log, RL_LOG_WARN, "in_flight_write_failed",
               "reason=\"%s\"", "out of memory");
        return; /* still due: the next flush tries again */
    }
    size_t n = 0;
    for (rl_in_flight_key *k = f->due; k != NULL; k = k->due_next)
        keys[n++] = k;
    f->due = NULL;
    f->n_due = 0;
    if (rl_store_is_cluster(f->store))
        sort_by_slot(keys, keys + n, n);
    for (size_t i = 0; i < n;) {
        int size = call_size(f, keys + i, n - i);
        write_keys(f, keys + i, size, w);
        for (int j = 0; j < size; j++) {
            if (idle(keys[i + j]))
                forget(f, keys[i + j]);
        }
        i += (size_t)size;
    }
    free(keys);
    free(w);
}

static void on_flush(uv_idle_t *idle)
{
    uv_idle_stop(idle);
    flush(idle->data);
}

static void on_renew(uv_timer_t *timer)
{
    rl_in_flight *f = timer->data;
    for (size_t i = 0; i < f->cap; i++) {
        for (rl_in_flight_key *k = f->table[i]; k != NULL; k = k->next) {
            k->renew = k->held > 0;
            if (k->renew)
                make_due(f, k);
        }
    }
    flush(f);
}

void rl_in_flight_start(rl_in_flight *f, rl_store *store, uv_loop_t *loop,
                        const rl_logger *log)
{
    if (f->started)
        return;
    f->store = store;
    f->log = log;
    uv_timer_init(loop, &f->renew);
    uv_idle_init(loop, &f->flush);
    f->renew.data = f->flush.data = f;
    uv_timer_start(&f->renew, on_renew, f->lease_ms / 4, f->lease_ms / 4);
    f->started = true;
}

/* A store that does not answer holds the close up for one deadline. */
static void close_deadline(uv_timer_t *timer)
{
    rl_in_flight *f = timer->data;
    f->closing_calls = 1;
    closing_answered(f);
}

void rl_in_flight_close(rl_in_flight *f, uint32_t timeout_ms,
                        void (*done)(void *arg), void *arg)
{
    if (!f->started || f->store == NULL) {
        done(arg);
        return;
    }
    uv_timer_start(&f->renew, close_deadline, timeout_ms, 0);
    uv_idle_stop(&f->flush);
    for (size_t i = 0; i < f->cap; i++) {
        for (rl_in_flight_key *k = f->table[i]; k != NULL; k = k->next) {
            make_due(f, k);
            k->renew = true;
            k->held = k->unanswered = 0;
        }
    }
    /* Held while the calls go out: one that fails at once answers inside
     * rl_store_run and must not end the close early. */
    f->closed = done;
    f->closed_arg = arg;
    f->closing_calls = 1;
    flush(f);
    closing_answered(f);
}

static void free_keys(rl_in_flight *f)
{
    for (size_t i = 0; i < f->cap; i++) {
        for (rl_in_flight_key *k = f->table[i], *next; k != NULL; k = next) {
            next = k->next;
            free(k);
        }
    }
    free(f->table);
    f->table = NULL;
}

void rl_in_flight_stop(rl_in_flight *f)
{
    if (f->started) {
        uv_close((uv_handle_t *)&f->renew, NULL);
        uv_close((uv_handle_t *)&f->flush, NULL);
        f->started = false;
    }
    f->store = NULL;
}

void rl_in_flight_fini(rl_in_flight *f)
{
    free_keys(f);
}
