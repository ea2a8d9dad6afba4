/*
 * rlctl_agents.c: `rlctl agents`: the agents the aggregators hear from, read
 * from each one's /agents page on its metrics address (one tab-separated
 * line per agent: id, address, last report in Redis ms, keys, ms since,
 * reports), one row per agent with the aggregators (by index) it reports
 * to. An aggregator that does not answer is named and the others shown.
 */
#include "rlctl_agents.h"

#include "rlctl_json.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define PAGE_MAX (8u << 20)

/* GET path from host:port over HTTP/1.0; the body, or NULL with a
 * message. */
static char *http_get(const rl_endpoint *ep, const char *path, char *err,
                      size_t errlen)
{
    char port[8];
    snprintf(port, sizeof port, "%u", ep->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(ep->host, port, &hints, &res) != 0) {
        snprintf(err, errlen, "cannot resolve %s", ep->host);
        return NULL;
    }
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int rc = fd >= 0 ? connect(fd, res->ai_addr, res->ai_addrlen) : -1;
    freeaddrinfo(res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot reach the aggregator at %s:%u "
                 "(its metrics address): is rl-aggregator running?", ep->host,
                 ep->port);
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n",
                     path, ep->host);
    char *buf = malloc(PAGE_MAX + 1);
    size_t len = 0;
    if (buf != NULL && write(fd, req, (size_t)n) == n) {
        ssize_t got;
        while (len < PAGE_MAX
               && (got = read(fd, buf + len, PAGE_MAX - len)) > 0)
            len += (size_t)got;
    }
    close(fd);
    if (buf == NULL)
        return NULL;
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) != 0 || strstr(buf, " 200 ") != buf + 8
        || body == NULL) {
        snprintf(err, errlen, "the aggregator at %s:%u did not answer %s",
                 ep->host, ep->port, path);
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* One agent as the aggregators see it: the aggregators (bits by index)
 * that heard it, its latest report, its keys and reports summed. */
typedef struct agent_row {
    char id[128], addr[160];
    unsigned long long last, keys, since, reports;
    unsigned heard_by;
} agent_row;

typedef struct agent_rows {
    agent_row *rows;
    size_t n, cap;
} agent_rows;

/* Adds the lines of one aggregator's /agents page; -1 when out of memory. */
static int add_page(agent_rows *t, char *page, size_t index)
{
    char *save = NULL;
    for (char *line = strtok_r(page, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (t->n == t->cap) {
            size_t cap = t->cap ? 2 * t->cap : 64;
            agent_row *grown = realloc(t->rows, cap * sizeof *grown);
            if (grown == NULL)
                return -1;
            t->rows = grown;
            t->cap = cap;
        }
        agent_row *r = &t->rows[t->n];
        if (sscanf(line, "%127[^\t]\t%159[^\t]\t%llu\t%llu\t%llu\t%llu",
                   r->id, r->addr, &r->last, &r->keys, &r->since,
                   &r->reports) != 6)
            continue;
        r->heard_by = 1u << index;
        t->n++;
    }
    return 0;
}

static int by_id(const void *a, const void *b)
{
    return strcmp(((const agent_row *)a)->id, ((const agent_row *)b)->id);
}

/* One row per agent: an agent reports to several aggregators (a part of
 * its keys to each) under one id. */
static void merge_rows(agent_rows *t)
{
    if (t->n == 0)
        return;
    qsort(t->rows, t->n, sizeof *t->rows, by_id);
    size_t kept = 0;
    for (size_t i = 1; i < t->n; i++) {
        agent_row *k = &t->rows[kept], *r = &t->rows[i];
        if (strcmp(k->id, r->id) != 0) {
            t->rows[++kept] = *r;
            continue;
        }
        k->heard_by |= r->heard_by;
        k->keys += r->keys;
        k->reports += r->reports;
        if (r->last > k->last) {
            k->last = r->last;
            k->since = r->since;
        }
    }
    t->n = kept + 1;
}

static void list_aggregators(unsigned heard_by, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < RL_AGGREGATORS_MAX && used < cap; i++) {
        if (heard_by & (1u << i))
            used += (size_t)snprintf(buf + used, cap - used, "%s%u",
                                     used > 0 ? "," : "", i);
    }
}

static void print_rows(const agent_rows *t, bool json)
{
    /* As wide as the longest id: ids name a program, a host, a pid and a
     * start time, and a column cut or overflowed is unreadable. */
    int width = 24;
    for (size_t i = 0; i < t->n; i++) {
        if ((int)strlen(t->rows[i].id) > width)
            width = (int)strlen(t->rows[i].id);
    }
    if (json)
        printf("{\"agents\":[");
    else
        printf("%-*s %-28s %14s %8s %10s %s\n", width, "AGENT", "ADDRESS",
               "LAST REPORT", "KEYS", "REPORTS", "AGGREGATORS");
    for (size_t i = 0; i < t->n; i++) {
        const agent_row *r = &t->rows[i];
        char aggs[4 * RL_AGGREGATORS_MAX];
        list_aggregators(r->heard_by, aggs, sizeof aggs);
        if (json) {
            printf("%s{\"id\":", i ? "," : "");
            rlctl_json_string(r->id);
            printf(",\"address\":");
            rlctl_json_string(r->addr);
            printf(",\"last_report_ms\":%llu,\"keys\":%llu,\"lag_ms\":%llu,"
                   "\"reports\":%llu,\"aggregators\":[%s]}", r->last,
                   r->keys, r->since, r->reports, aggs);
        } else {
            printf("%-*s %-28s %11llu ms %8llu %10llu %s\n", width, r->id,
                   r->addr, r->since, r->keys, r->reports, aggs);
        }
    }
    if (json)
        printf("]}\n");
    else if (t->n == 0)
        printf("(no agent heard from in the last minute)\n");
}

int rlctl_agents_print(const rl_config *cfg, bool json)
{
    const rl_aggregator_config *c = &cfg->aggregator;
    agent_rows t = {0};
    size_t asked = 0, answered = 0;
    for (size_t i = 0; i < c->n_endpoints; i++) {
        char err[512];
        if (!c->endpoints[i].has_metrics) {
            if (c->n_endpoints > 1)
                fprintf(stderr, "rlctl: warning: aggregator %zu has no "
                        "metrics address: the agents it hears are not "
                        "shown\n", i);
            continue;
        }
        asked++;
        char *page = http_get(&c->endpoints[i].metrics, "/agents", err,
                              sizeof err);
        if (page == NULL) {
            fprintf(stderr, "rlctl: %s%s (aggregator %zu)\n",
                    c->n_endpoints > 1 ? "warning: " : "", err, i);
            continue;
        }
        answered++;
        int rc = add_page(&t, page, i);
        free(page);
        if (rc != 0) {
            free(t.rows);
            fprintf(stderr, "rlctl: out of memory\n");
            return 2;
        }
    }
    if (asked == 0) {
        fprintf(stderr, "rlctl: agents are read from the aggregators' "
                "metrics addresses (aggregator.metrics, or each entry's "
                "metrics in aggregators): set one in the config\n");
        return 1;
    }
    if (answered == 0) {
        free(t.rows);
        return 2;
    }
    merge_rows(&t);
    print_rows(&t, json);
    free(t.rows);
    return 0;
}
