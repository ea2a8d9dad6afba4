/*
 * rlctl_agents.c: `rlctl agents`: the agents an aggregator hears from, read
 * from its /agents page on aggregator.metrics (one tab-separated line per
 * agent: id, address, last report in Redis ms, keys, ms since, reports).
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
                 "(aggregator.metrics): is rl-aggregator running?", ep->host,
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

int rlctl_agents_print(const rl_config *cfg, bool json)
{
    if (!cfg->aggregator.has_metrics) {
        fprintf(stderr, "rlctl: agents are read from the aggregator's "
                "aggregator.metrics address: set it in the config\n");
        return 1;
    }
    char err[512];
    char *page = http_get(&cfg->aggregator.metrics, "/agents", err,
                          sizeof err);
    if (page == NULL) {
        fprintf(stderr, "rlctl: %s\n", err);
        return 2;
    }
    if (json)
        printf("{\"agents\":[");
    else
        printf("%-24s %-28s %14s %8s %10s\n", "AGENT", "ADDRESS",
               "LAST REPORT", "KEYS", "REPORTS");
    int n = 0;
    for (char *line = strtok(page, "\n"); line; line = strtok(NULL, "\n")) {
        char id[128], addr[160];
        unsigned long long last, keys, since, reports;
        if (sscanf(line, "%127[^\t]\t%159[^\t]\t%llu\t%llu\t%llu\t%llu", id,
                   addr, &last, &keys, &since, &reports) != 6)
            continue;
        if (json) {
            printf("%s{\"id\":", n ? "," : "");
            rlctl_json_string(id);
            printf(",\"address\":");
            rlctl_json_string(addr);
            printf(",\"last_report_ms\":%llu,\"keys\":%llu,\"lag_ms\":%llu,"
                   "\"reports\":%llu}", last, keys, since, reports);
        }
        else
            printf("%-24s %-28s %11llu ms %8llu %10llu\n", id, addr, since,
                   keys, reports);
        n++;
    }
    if (json)
        printf("]}\n");
    else if (n == 0)
        printf("(no agent heard from in the last minute)\n");
    free(page);
    return 0;
}
