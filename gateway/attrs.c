/*
 * attrs.c: what a request is checked as. ip is the peer's address, or the
 * first X-Forwarded-For hop when the gateway is told to trust that header
 * (only behind a proxy that sets it: a client can write anything there).
 * api_key comes from X-Api-Key or "Authorization: Bearer"; tenant from
 * X-Tenant or, failing that, the tenant map; plan only from the tenant map
 * (a client must not name its own plan). method is the request's method,
 * path its target without the query string, host the Host header without
 * its port (a rule about a virtual host should not depend on whether the
 * client spelled out the default port), route the name of the longest
 * gateway.routes prefix of the path, else the path itself. Any other
 * attribute a rule names (in match, when or an override's when, or listed
 * in `attributes:`) comes from the header of that name.
 */
#include "gateway.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char space[] = " \t";

/* Trims blanks around [*p, *p + *len). */
static void trim(const char **p, size_t *len)
{
    while (*len > 0 && strchr(space, (*p)[0]) != NULL) {
        (*p)++;
        (*len)--;
    }
    while (*len > 0 && strchr(space, (*p)[*len - 1]) != NULL)
        (*len)--;
}

static bool put(gw_attrs *out, const char *name, const char *value,
                size_t len)
{
    trim(&value, &len);
    if (len == 0)
        return false;
    out->attrs[out->n++] = (rl_attr){name, value, len};
    return true;
}

static void put_ip(const gw_server *srv, const gw_message *req,
                   const char *peer_ip, gw_attrs *out)
{
    const char *xff = srv->trust_forwarded_for
                          ? gw_message_header(req, "X-Forwarded-For") : NULL;
    if (xff != NULL) {
        const char *hop = xff;
        size_t len = strcspn(xff, ",");
        trim(&hop, &len);
        if (len > 0 && len < sizeof out->ip) {
            memcpy(out->ip, hop, len);
            out->ip[len] = '\0';
            put(out, "ip", out->ip, len);
            return;
        }
    }
    put(out, "ip", peer_ip, strlen(peer_ip));
}

/* The API key, from X-Api-Key or a bearer token; NULL if neither. */
static const char *api_key_of(const gw_message *req, size_t *len)
{
    const char *key = gw_message_header(req, "X-Api-Key");
    if (key != NULL) {
        *len = strlen(key);
        return key;
    }
    const char *auth = gw_message_header(req, "Authorization");
    if (auth == NULL)
        return NULL;
    auth += strspn(auth, space);
    if (strncasecmp(auth, "Bearer", 6) != 0 || strchr(space, auth[6]) == NULL
        || auth[6] == '\0')
        return NULL;
    *len = strlen(auth + 6);
    return auth + 6;
}

static void put_api_key_tenant_plan(const gw_server *srv,
                                    const gw_message *req, gw_attrs *out)
{
    size_t len = 0;
    const char *key = api_key_of(req, &len);
    bool have_key = key != NULL && put(out, "api_key", key, len);
    const char *mapped = NULL, *plan = NULL;
    if (have_key) {
        const rl_attr *k = &out->attrs[out->n - 1];
        if (k->value_len <= RL_VALUE_MAX) {
            memcpy(out->api_key, k->value, k->value_len);
            out->api_key[k->value_len] = '\0';
            gw_tenant_map_find(srv->tenants, out->api_key, &mapped, &plan);
        }
    }
    const char *tenant = gw_message_header(req, "X-Tenant");
    if ((tenant == NULL || !put(out, "tenant", tenant, strlen(tenant)))
        && mapped != NULL)
        put(out, "tenant", mapped, strlen(mapped));
    if (plan != NULL)
        put(out, "plan", plan, strlen(plan));
}

void gw_attrs_path(const char *url, size_t url_len, const char **path,
                   size_t *len)
{
    const char *p = url;
    size_t n = url_len;
    /* Absolute form (a request to a proxy): skip scheme and authority. */
    const char *scheme = memchr(url, ':', url_len);
    if (url_len > 0 && url[0] != '/' && scheme != NULL
        && (size_t)(scheme - url) + 3 <= url_len
        && memcmp(scheme, "://", 3) == 0) {
        const char *auth = scheme + 3;
        size_t rest = url_len - (size_t)(auth - url);
        const char *slash = memchr(auth, '/', rest);
        p = slash != NULL ? slash : "/";
        n = slash != NULL ? url_len - (size_t)(slash - url) : 1;
    }
    size_t cut = 0;
    while (cut < n && p[cut] != '?' && p[cut] != '#')
        cut++;
    *path = p;
    *len = cut;
}

const char *gw_attrs_route(const rl_config *cfg, const char *path,
                           size_t len)
{
    const rl_route *best = NULL;
    size_t best_len = 0;
    for (size_t i = 0; i < cfg->gateway.n_routes; i++) {
        const rl_route *r = &cfg->gateway.routes[i];
        size_t plen = strlen(r->prefix);
        if (plen <= len && memcmp(path, r->prefix, plen) == 0
            && (best == NULL || plen > best_len)) {
            best = r;
            best_len = plen;
        }
    }
    return best != NULL ? best->name : NULL;
}

/* method, path, host, route. */
static void put_request_line(const gw_server *srv, const gw_message *req,
                             gw_attrs *out)
{
    if (req->method >= 0) {
        const char *m = http_method_str((enum http_method)req->method);
        put(out, "method", m, strlen(m));
    }
    const char *path;
    size_t len;
    gw_attrs_path(req->url.data != NULL ? req->url.data : "", req->url.len,
                  &path, &len);
    if (put(out, "path", path, len)) {
        const char *route = gw_attrs_route(srv->config, path, len);
        if (route != NULL)
            put(out, "route", route, strlen(route));
        else
            put(out, "route", path, len);
    }
    const char *host = gw_message_header(req, "Host");
    if (host != NULL) {
        size_t hlen = strlen(host);
        /* The port goes: after "]" for [v6]:port, after the only ':'
         * otherwise (a bare v6 address has several and keeps them). */
        const char *colon = strrchr(host, ':');
        const char *bracket = strrchr(host, ']');
        if (colon != NULL && (bracket != NULL ? colon > bracket
                                              : strchr(host, ':') == colon))
            hlen = (size_t)(colon - host);
        put(out, "host", host, hlen);
    }
}

bool gw_attr_builtin(const char *name)
{
    static const char *const builtins[] = {"ip", "api_key", "tenant", "plan",
                                           "method", "path", "host", "route",
                                           NULL};
    for (int i = 0; builtins[i] != NULL; i++) {
        if (strcmp(name, builtins[i]) == 0)
            return true;
    }
    return false;
}

static void collect(gw_server *srv, const char *name)
{
    if (gw_attr_builtin(name) || srv->n_attr_names == RL_ATTRS_MAX)
        return;
    for (size_t j = 0; j < srv->n_attr_names; j++) {
        if (strcmp(srv->attr_names[j], name) == 0)
            return;
    }
    srv->attr_names[srv->n_attr_names++] = name;
}

static void collect_when(gw_server *srv, const rl_when *w)
{
    for (size_t i = 0; i < w->n; i++)
        collect(srv, w->clauses[i].attr);
}

void gw_attrs_collect(gw_server *srv)
{
    const rl_config *cfg = srv->config;
    srv->n_attr_names = 0;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        for (size_t p = 0; p < r->n_parts; p++)
            collect(srv, r->parts[p]);
        collect_when(srv, &r->when);
        for (size_t o = 0; o < r->n_when_overrides; o++)
            collect_when(srv, &r->when_overrides[o]->when);
    }
    for (size_t i = 0; i < cfg->n_attributes_extra; i++)
        collect(srv, cfg->attributes_extra[i]);
}

void gw_attrs_of(const gw_server *srv, const gw_message *req,
                 const char *peer_ip, gw_attrs *out)
{
    out->n = 0;
    put_ip(srv, req, peer_ip, out);
    put_api_key_tenant_plan(srv, req, out);
    put_request_line(srv, req, out);
    for (size_t i = 0; i < srv->n_attr_names && out->n < RL_ATTRS_MAX;
         i++) {
        const char *name = srv->attr_names[i];
        const char *v = gw_message_header(req, name);
        if (v != NULL)
            put(out, name, v, strlen(v));
    }
}
