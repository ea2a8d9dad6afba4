/*
 * rlctl_totals.c: see rlctl_totals.h. A rule's clients' hashes of
 * sub-windows are found with SCAN (never KEYS) on every primary; the
 * fields of the trailing period are read and summed as agents do (wire.h):
 * "recent", the sub-windows w-N+1..w, and "oldest", w-N; the estimate is
 * their sum, never less than what the client was admitted in the last
 * period. At most ROWS_MAX clients are read per rule; more are reported as
 * left out.
 */
#include "rlctl_totals.h"

#include "rlctl_json.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS_MAX 100000

typedef rlctl_row row;
typedef rlctl_table table;

/* The key pattern of a rule's sub-windows: glob characters in the prefix
 * are escaped so that they match themselves. */
static void pattern(const rlctl_store *s, const rl_rule *r, char *out,
                    size_t cap)
{
    char prefix[2 * RL_PREFIX_MAX + 1];
    size_t n = 0;
    for (const char *p = r->key_prefix; *p; p++) {
        if (strchr("*?[]\\", *p) != NULL)
            prefix[n++] = '\\';
        prefix[n++] = *p;
    }
    prefix[n] = '\0';
    snprintf(out, cap, s->cfg->cluster ? "{%s*}:w" : "%s*:w", prefix);
}

/* The client's value inside a window key. */
static bool value_of(const rlctl_store *s, const rl_rule *r, const char *key,
                     char *out)
{
    size_t plen = strlen(r->key_prefix), skip = s->cfg->cluster ? 1 : 0;
    const char *end = strrchr(key, ':');
    if (end == NULL || strlen(key) < skip + plen)
        return false;
    const char *v = key + skip + plen;
    size_t len = (size_t)(end - v) - skip;
    if (end < v || len == 0 || len > RL_VALUE_MAX)
        return false;
    memcpy(out, v, len);
    out[len] = '\0';
    return true;
}

static int by_value(const void *a, const void *b)
{
    return strcmp(((const row *)a)->value, ((const row *)b)->value);
}

/* The row of value: found among the first `sorted` rows (sorted by value),
 * else a new one. Keys are unique within one window, so each scan adds a
 * value at most once. */
static row *row_for(table *t, size_t sorted, const char *value)
{
    row probe;
    snprintf(probe.value, sizeof probe.value, "%s", value);
    row *found = sorted > 0 ? bsearch(&probe, t->rows, sorted,
                                      sizeof *t->rows, by_value)
                            : NULL;
    if (found != NULL)
        return found;
    if (t->n == ROWS_MAX) {
        t->left_out++;
        return NULL;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        row *rows = realloc(t->rows, cap * sizeof *rows);
        if (rows == NULL)
            return NULL;
        t->rows = rows;
        t->cap = cap;
    }
    row *r = &t->rows[t->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->value, sizeof r->value, "%s", value);
    return r;
}

/* A global rule's client: the other regions' counts in the trailing
 * period, kept beside its hash (<base>:r:<region>:<w>, aggregator/
 * regions.c), and this region's, the rest of the estimate. base is the
 * hash's name without its ":w". */
static int read_regions(rlctl_conn *c, const rl_regions_config *rc,
                        const char *base, unsigned long long window,
                        row *client, char *err, size_t errlen)
{
    enum { SPAN = RL_WIRE_SUBWINDOWS + 1 };
    static char keys[SPAN][RL_PREFIX_MAX + RL_VALUE_MAX + 80];
    const char *argv[SPAN + 1] = {"MGET"};
    size_t lens[SPAN + 1] = {4};
    for (size_t r = 0; r < rc->n; r++) {
        if (r == rc->self)
            continue;
        for (int k = 0; k < SPAN; k++) {
            int n = snprintf(keys[k], sizeof keys[k], "%s:r:%s:%llu", base,
                             rc->regions[r].name,
                             window - RL_WIRE_SUBWINDOWS + (unsigned)k);
            argv[k + 1] = keys[k];
            lens[k + 1] = (size_t)n;
        }
        redisReply *v = rlctl_command_argv(c, SPAN + 1, argv, lens);
        if (v == NULL || v->type != REDIS_REPLY_ARRAY) {
            rlctl_store_why(c, v, "MGET", err, errlen);
            freeReplyObject(v);
            return -1;
        }
        for (size_t k = 0; k < v->elements; k++) {
            long long n = v->element[k]->type == REDIS_REPLY_STRING
                              ? atoll(v->element[k]->str) : 0;
            client->regions[r] += n > 0 ? (unsigned long long)n : 0;
        }
        freeReplyObject(v);
    }
    return 0;
}

/* The trailing period's sub-windows (w-N..w) of one rule's clients on one
 * primary, one row per client. */
static int scan(rlctl_conn *c, const rlctl_store *s, const rl_rule *rule,
                const rl_regions_config *rc, unsigned long long window,
                table *t, char *err, size_t errlen)
{
    char match[2 * RL_PREFIX_MAX + 64], cursor[32] = "0";
    pattern(s, rule, match, sizeof match);
    do {
        redisReply *r = rlctl_command(c, "SCAN", cursor, "MATCH", match,
                                      "COUNT", "1000", NULL);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            rlctl_store_why(c, r, "SCAN", err, errlen);
            freeReplyObject(r);
            return -1;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            char value[RL_VALUE_MAX + 1];
            if (!value_of(s, rule, keys->element[i]->str, value))
                continue;
            redisReply *g = rlctl_command(c, "HGETALL",
                                          keys->element[i]->str, NULL);
            if (g == NULL || g->type == REDIS_REPLY_ERROR) {
                rlctl_store_why(c, g, "HGETALL", err, errlen);
                freeReplyObject(g);
                freeReplyObject(r);
                return -1;
            }
            row *client = g != NULL && g->type == REDIS_REPLY_ARRAY
                              ? row_for(t, 0, value) : NULL;
            for (size_t f = 0; client != NULL && f + 1 < g->elements;
                 f += 2) {
                char *end;
                unsigned long long w = strtoull(g->element[f]->str, &end, 10);
                unsigned long long n = strtoull(g->element[f + 1]->str, NULL,
                                                10);
                /* Not a sub-window: the head and sums (m, windows.c). */
                if (*end != '\0' || end == g->element[f]->str
                    || w > window || w + RL_WIRE_SUBWINDOWS < window)
                    continue;
                *(w + RL_WIRE_SUBWINDOWS == window ? &client->previous
                                                   : &client->current) += n;
            }
            freeReplyObject(g);
            if (client != NULL && rule->global && rc->n > 0) {
                char base[RL_PREFIX_MAX + RL_VALUE_MAX + 8];
                snprintf(base, sizeof base, "%.*s",
                         (int)(strlen(keys->element[i]->str) - 2),
                         keys->element[i]->str);
                if (read_regions(c, rc, base, window, client, err, errlen)
                    != 0) {
                    freeReplyObject(r);
                    return -1;
                }
            }
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

static int by_estimate(const void *a, const void *b)
{
    const row *x = a, *y = b;
    return x->estimate < y->estimate ? 1 : x->estimate > y->estimate ? -1
                                                                    : 0;
}

/* A global rule's row's parts per region: text columns, or a JSON
 * object. */
static void print_regions(const rl_rule *r, const rl_regions_config *rc,
                          const row *w, bool json)
{
    if (!r->global || rc->n == 0)
        return;
    printf(json ? ",\"regions\":{" : "");
    for (size_t g = 0; g < rc->n; g++) {
        if (json) {
            printf("%s", g ? "," : "");
            rlctl_json_string(rc->regions[g].name);
            printf(":%llu", w->regions[g]);
        } else {
            printf(" %10llu", w->regions[g]);
        }
    }
    printf(json ? "}" : "");
}

static void print_rule(const rl_rule *r, const rl_regions_config *rc,
                       table *t, unsigned long top, bool json, bool first)
{
    size_t n = t->n < top ? t->n : top;
    if (json) {
        printf("%s{\"rule\":", first ? "" : ",");
        rlctl_json_string(r->name);
        printf(",\"limit\":%llu,\"clients\":%zu,\"left_out\":%zu,"
               "\"top\":[", (unsigned long long)r->limit, t->n,
               t->left_out);
        for (size_t i = 0; i < n; i++) {
            const row *w = &t->rows[i];
            printf("%s{\"value\":", i ? "," : "");
            rlctl_json_string(w->value);
            printf(",\"current\":%llu,\"previous\":%llu,\"estimate\":%llu",
                   w->current, w->previous, w->estimate);
            print_regions(r, rc, w, true);
            printf("}");
        }
        printf("]}");
        return;
    }
    printf("%s%s (limit %llu%s): %zu client%s%s\n", first ? "" : "\n",
           r->name, (unsigned long long)r->limit,
           r->global && rc->n > 0 ? ", global" : "", t->n,
           t->n == 1 ? "" : "s", t->left_out ? ", more not read" : "");
    if (n == 0)
        return;
    printf("  %-40s %12s %12s %12s", "VALUE", "RECENT", "OLDEST",
           "ESTIMATE");
    for (size_t g = 0; r->global && g < rc->n; g++) {
        char upper[RL_REGION_NAME_MAX + 1];
        size_t k = 0;
        for (; rc->regions[g].name[k] != '\0'; k++)
            upper[k] = (char)(rc->regions[g].name[k] >= 'a'
                                      && rc->regions[g].name[k] <= 'z'
                                  ? rc->regions[g].name[k] - 32
                                  : rc->regions[g].name[k]);
        upper[k] = '\0';
        printf(" %10s", upper);
    }
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        printf("  %-40s %12llu %12llu %12llu", t->rows[i].value,
               t->rows[i].current, t->rows[i].previous, t->rows[i].estimate);
        print_regions(r, rc, &t->rows[i], false);
        printf("\n");
    }
}

int rlctl_totals_collect(rlctl_store *s, const rl_rule *r,
                         const rl_regions_config *regions,
                         unsigned long long now, rlctl_table *t)
{
    unsigned long long w = now / rl_wire_subwindow_ms(r->period_ms);
    memset(t, 0, sizeof *t);
    int failed = -1;
    char err[512] = "";
    for (int p = 0; p < s->n && failed < 0; p++)
        failed = scan(s->primaries[p], s, r, regions, w, t, err, sizeof err) ? p
                                                                   : -1;
    /* A client's hash is on one primary: rows merge only if a value
     * repeats across primaries, which a cluster's slots rule out. */
    if (t->n > 0)
        qsort(t->rows, t->n, sizeof *t->rows, by_value);
    size_t merged = 0;
    for (size_t k = 0; k < t->n; k++) {
        if (merged > 0
            && strcmp(t->rows[merged - 1].value, t->rows[k].value) == 0) {
            t->rows[merged - 1].current += t->rows[k].current;
            t->rows[merged - 1].previous += t->rows[k].previous;
            for (size_t g = 0; g < RL_REGIONS_MAX; g++)
                t->rows[merged - 1].regions[g] += t->rows[k].regions[g];
        } else {
            t->rows[merged++] = t->rows[k];
        }
    }
    t->n = merged;
    if (failed >= 0) {
        free(t->rows);
        t->rows = NULL;
        fprintf(stderr, "rlctl: %s:%u: %s\n", s->endpoints[failed].host,
                s->endpoints[failed].port, err);
        return -1;
    }
    for (size_t k = 0; k < t->n; k++) {
        row *c = &t->rows[k];
        c->estimate = c->current + c->previous;
        /* This region's part: what the others' do not hold. */
        unsigned long long others = 0;
        for (size_t g = 0; r->global && g < regions->n; g++)
            others += g != regions->self ? c->regions[g] : 0;
        if (r->global && regions->n > 0)
            c->regions[regions->self] = c->estimate > others
                                            ? c->estimate - others : 0;
    }
    if (t->n > 0)
        qsort(t->rows, t->n, sizeof *t->rows, by_estimate);
    return 0;
}

int rlctl_totals_print(const rl_config *cfg, rlctl_store *s,
                       unsigned long long now, const char *rule,
                       unsigned long top, bool json)
{
    bool first = true;
    if (json)
        printf("{\"rules\":[");
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        if (r->mode != RL_MODE_SYNCED
            || (rule != NULL && strcmp(rule, r->name) != 0))
            continue;
        table t;
        if (rlctl_totals_collect(s, r, &cfg->regions, now, &t) != 0)
            return 2;
        print_rule(r, &cfg->regions, &t, top, json, first);
        first = false;
        free(t.rows);
    }
    if (json)
        printf("]}\n");
    else if (first)
        printf("no synced rules in the config\n");
    return 0;
}
