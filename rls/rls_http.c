/*
 * rls_http.c: /healthcheck and /rlconfig (rls_http.h) on nng's HTTP
 * server. Each handler reads what it serves when asked: the draining
 * flag, a referenced snapshot of the config.
 */
#include "rls_http.h"

#include "nng_handoff.h"

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rls_http {
    const rls_http_config *c;
    nng_http_server *main, *debug;
};

static void reply(nng_aio *aio, uint16_t status, const char *type,
                  const char *body, size_t len)
{
    nng_http_res *res;
    int rv = nng_http_res_alloc(&res);
    if (rv == 0)
        rv = nng_http_res_set_status(res, status);
    if (rv == 0)
        rv = nng_http_res_set_header(res, "Content-Type", type);
    if (rv == 0)
        rv = nng_http_res_copy_data(res, body, len);
    if (rv != 0) {
        if (res != NULL)
            nng_http_res_free(res);
        nng_aio_finish(aio, rv);
        return;
    }
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static rls_http *http_of(nng_aio *aio)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    rls_http *http = nng_http_handler_get_data(h);
    rl_nng_handoff(http);
    return http;
}

static void serve_health(nng_aio *aio)
{
    rls_http *http = http_of(aio);
    const rls_http_config *c = http->c;
    rls_snapshot *s = rls_runtime_get(c->runtime);
    bool loaded = s != NULL;
    rls_snapshot_put(s);
    rl_nng_handoff(http);
    if (atomic_load(c->draining))
        reply(aio, 500, "text/plain", "draining\n", 9);
    else if (c->need_config && !loaded)
        reply(aio, 500, "text/plain", "no config loaded\n", 17);
    else
        reply(aio, 200, "text/plain", "OK", 2);
}

static void serve_rlconfig(nng_aio *aio)
{
    rls_http *http = http_of(aio);
    rls_snapshot *s = rls_runtime_get(http->c->runtime);
    rl_nng_handoff(http);
    char *dump = s != NULL ? rls_config_dump(s->cfg) : NULL;
    rls_snapshot_put(s);
    if (s != NULL && dump == NULL) {
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    const char *body = dump != NULL ? dump : "";
    reply(aio, 200, "text/plain", body, strlen(body));
    free(dump);
}

static int serve(nng_http_server **out, rls_http *http, const char *host,
                 uint16_t port, const char *path, void (*fn)(nng_aio *))
{
    char url[300];
    snprintf(url, sizeof url, strchr(host, ':') ? "http://[%s]:%u"
                                                : "http://%s:%u",
             host[0] != '\0' ? host : "0.0.0.0", port);
    nng_url *u = NULL;
    nng_http_handler *h = NULL;
    int rv = nng_url_parse(&u, url);
    if (rv == 0)
        rv = nng_http_server_hold(out, u);
    if (rv == 0)
        rv = nng_http_handler_alloc(&h, path, fn);
    if (rv == 0)
        rv = nng_http_handler_set_method(h, "GET");
    if (rv == 0)
        rv = nng_http_handler_set_data(h, http, NULL);
    if (rv == 0)
        rv = nng_http_server_add_handler(*out, h);
    else if (h != NULL)
        nng_http_handler_free(h);
    if (rv == 0)
        rv = nng_http_server_start(*out);
    nng_url_free(u);
    return rv;
}

int rls_http_start(rls_http **out, const rls_http_config *c, char *err,
                   size_t cap)
{
    rls_http *http = calloc(1, sizeof *http);
    *out = NULL;
    if (http == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    http->c = c;
    rl_nng_handoff(http);
    int rv = serve(&http->main, http, c->host, c->port, "/healthcheck",
                   serve_health);
    const char *which = "HOST:PORT";
    if (rv == 0) {
        which = "DEBUG_HOST:DEBUG_PORT";
        rv = serve(&http->debug, http, c->debug_host, c->debug_port,
                   "/rlconfig", serve_rlconfig);
    }
    if (rv != 0) {
        snprintf(err, cap, "cannot serve HTTP on %s: %s", which,
                 nng_strerror(rv));
        rls_http_stop(http);
        return -1;
    }
    *out = http;
    return 0;
}

void rls_http_stop(rls_http *h)
{
    if (h == NULL)
        return;
    if (h->main != NULL) {
        nng_http_server_stop(h->main);
        nng_http_server_release(h->main);
    }
    if (h->debug != NULL) {
        nng_http_server_stop(h->debug);
        nng_http_server_release(h->debug);
    }
    rl_nng_handoff(h);
    free(h);
}
