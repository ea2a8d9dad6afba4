/*
 * address.c: Redis addresses as written in configs. Parsing is strict (no
 * silent defaults for a half-written address) so that a typo is an error
 * at load time rather than a connection to the wrong place.
 */
#include "address.h"

#include "rl.h"

#include <string.h>

/* Reads a decimal number of at most max from [p, end) into *out. */
static int parse_number(const char *p, const char *end, unsigned long max,
                        unsigned long *out)
{
    unsigned long n = 0;
    if (p == end)
        return RL_EINVAL;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return RL_EINVAL;
        n = n * 10 + (unsigned long)(*p - '0');
        if (n > max)
            return RL_EINVAL;
    }
    *out = n;
    return RL_OK;
}

/* Splits [text, end) into host and optional ":port". */
static int parse_host_port(const char *text, const char *end,
                           uint16_t default_port, rl_endpoint *out)
{
    const char *host = text, *host_end, *colon;
    if (*text == '[') {
        host = text + 1;
        host_end = memchr(host, ']', (size_t)(end - host));
        if (host_end == NULL)
            return RL_EINVAL;
        colon = host_end + 1 < end ? host_end + 1 : NULL;
        if (colon != NULL && *colon != ':')
            return RL_EINVAL;
    } else {
        colon = memchr(text, ':', (size_t)(end - text));
        host_end = colon != NULL ? colon : end;
        if (colon != NULL && memchr(colon + 1, ':', (size_t)(end - colon - 1)))
            return RL_EINVAL; /* a bare IPv6 address needs brackets */
    }
    size_t host_len = (size_t)(host_end - host);
    if (host_len == 0)
        return RL_EINVAL;
    if (host_len >= RL_HOST_MAX)
        return RL_ETOOLONG;
    unsigned long port = default_port;
    if (colon != NULL && (parse_number(colon + 1, end, 65535, &port) != RL_OK
                          || port == 0))
        return RL_EINVAL;
    if (colon == NULL && default_port == 0)
        return RL_EINVAL;
    memcpy(out->host, host, host_len);
    out->host[host_len] = '\0';
    out->port = (uint16_t)port;
    return RL_OK;
}

int rl_endpoint_parse(const char *text, rl_endpoint *out)
{
    if (text == NULL || out == NULL)
        return RL_EINVAL;
    return parse_host_port(text, text + strlen(text), 0, out);
}

int rl_redis_url_parse(const char *url, rl_endpoint *out, unsigned *db,
                       bool *tls)
{
    static const char scheme[] = "redis://", tls_scheme[] = "rediss://";
    if (url == NULL || out == NULL || db == NULL || tls == NULL)
        return RL_EINVAL;
    bool secure = strncmp(url, tls_scheme, sizeof tls_scheme - 1) == 0;
    if (!secure && strncmp(url, scheme, sizeof scheme - 1) != 0)
        return RL_EINVAL;
    const char *authority = url + (secure ? sizeof tls_scheme
                                          : sizeof scheme) - 1;
    const char *end = authority + strlen(authority);
    const char *slash = strchr(authority, '/');
    const char *host_end = slash != NULL ? slash : end;
    if (memchr(authority, '@', (size_t)(host_end - authority)) != NULL)
        return RL_EINVAL;
    rl_endpoint ep;
    int rc = parse_host_port(authority, host_end, RL_REDIS_DEFAULT_PORT, &ep);
    if (rc != RL_OK)
        return rc;
    unsigned long n = 0;
    if (slash != NULL && slash + 1 < end
        && parse_number(slash + 1, end, 1000000, &n) != RL_OK)
        return RL_EINVAL;
    *out = ep;
    *db = (unsigned)n;
    *tls = secure;
    return RL_OK;
}
