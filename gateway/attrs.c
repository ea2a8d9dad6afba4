/*
 * attrs.c: what a request is checked as. ip is the peer's address, or the
 * first X-Forwarded-For hop when the gateway is told to trust that header
 * (only behind a proxy that sets it: a client can write anything there).
 * api_key comes from X-Api-Key or "Authorization: Bearer"; tenant from
 * X-Tenant or, failing that, the tenant map. Any other attribute a rule
 * names comes from the header of that name.
 */
#include "gateway.h"

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

static void put_api_key_and_tenant(const gw_server *srv,
                                   const gw_message *req, gw_attrs *out)
{
    size_t len = 0;
    const char *key = api_key_of(req, &len);
    bool have_key = key != NULL && put(out, "api_key", key, len);
    const char *tenant = gw_message_header(req, "X-Tenant");
    if (tenant != NULL && put(out, "tenant", tenant, strlen(tenant)))
        return;
    if (!have_key)
        return;
    const rl_attr *k = &out->attrs[out->n - 1];
    if (k->value_len > RL_VALUE_MAX)
        return;
    memcpy(out->api_key, k->value, k->value_len);
    out->api_key[k->value_len] = '\0';
    tenant = gw_tenant_map_find(srv->tenants, out->api_key);
    if (tenant != NULL)
        put(out, "tenant", tenant, strlen(tenant));
}

void gw_attrs_of(const gw_server *srv, const gw_message *req,
                 const char *peer_ip, gw_attrs *out)
{
    out->n = 0;
    put_ip(srv, req, peer_ip, out);
    put_api_key_and_tenant(srv, req, out);
    for (size_t i = 0; i < srv->n_attr_names; i++) {
        const char *name = srv->attr_names[i];
        if (strcmp(name, "ip") == 0 || strcmp(name, "api_key") == 0
            || strcmp(name, "tenant") == 0 || out->n == RL_ATTRS_MAX)
            continue;
        const char *v = gw_message_header(req, name);
        if (v != NULL)
            put(out, name, v, strlen(v));
    }
}
