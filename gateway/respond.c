/*
 * respond.c: the responses rl-gateway writes itself. Every response has a
 * Content-Length (keep-alive needs it) and says whether the connection
 * stays open. Decisions carry librl's RateLimit headers; a rejection is a
 * 429 with Retry-After and a JSON body naming the rule (also when an
 * on_error: local bucket rejected), or a 503 when the store did not answer
 * and the rule's on_error is deny. The body names the
 * rule, the limit and period that applied and the override that set them
 * ("default": the rule's own).
 */
#include "gateway.h"
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEGRADED_HEADER "RateLimit-Degraded: store unavailable, on_error " \
                        "decided\r\n"

/* A JSON string, quoted the way librl quotes the names in its bodies. */
static void json_string(gw_buf *out, const char *s)
{
    char small[256];
    size_t n = rl_json_quote(small, sizeof small, s);
    if (n < sizeof small) {
        gw_buf_append(out, small, n, SIZE_MAX / 2);
        return;
    }
    char *big = malloc(n + 1);
    if (big == NULL)
        return;
    rl_json_quote(big, n + 1, s);
    gw_buf_append(out, big, n, SIZE_MAX / 2);
    free(big);
}

static void head_lines(gw_buf *out, int status, size_t length,
                       bool keep_alive)
{
    gw_buf_printf(out, "HTTP/1.1 %d %s\r\nContent-Length: %zu\r\n"
                  "Connection: %s\r\n", status,
                  http_status_str((enum http_status)status), length,
                  keep_alive ? "keep-alive" : "close");
}

static void decision_lines(gw_buf *out, const rl_decision *d)
{
    char headers[512];
    if (rl_format_headers(d, headers, sizeof headers) > 0)
        gw_buf_printf(out, "%s", headers);
    if (d->degraded)
        gw_buf_printf(out, "%s", DEGRADED_HEADER);
}

static void finish(gw_buf *out, const gw_buf *body, bool head)
{
    gw_buf_append(out, "\r\n", 2, SIZE_MAX / 2);
    if (!head && body->len > 0)
        gw_buf_append(out, body->data, body->len, SIZE_MAX / 2);
}

/* The body is librl's (rl_format_body), so that every gateway linking
 * librl answers a decision with the same JSON; the status goes with it. */
static void decision_body(gw_buf *body, const rl_decision *d, int *status)
{
    char text[1024];
    int n = rl_format_body(d, text, sizeof text);
    if (n > 0)
        gw_buf_append(body, text, (size_t)n, SIZE_MAX / 2);
    if (d->allowed)
        *status = 200;
    else
        *status = d->degraded && !d->fallback ? 503 : 429;
}

void gw_respond_decision(gw_buf *out, const rl_decision *d, bool keep_alive,
                         bool head)
{
    gw_buf body = {0};
    int status;
    decision_body(&body, d, &status);
    head_lines(out, status, body.len, keep_alive);
    gw_buf_printf(out, "Content-Type: application/json\r\n");
    decision_lines(out, d);
    finish(out, &body, head);
    gw_buf_free(&body);
}

void gw_respond_error(gw_buf *out, int status, const char *error,
                      const char *reason, bool keep_alive)
{
    gw_buf body = {0};
    gw_buf_printf(&body, "{\"error\":");
    json_string(&body, error);
    gw_buf_printf(&body, ",\"reason\":");
    json_string(&body, reason);
    gw_buf_printf(&body, "}\n");
    head_lines(out, status, body.len, keep_alive);
    gw_buf_printf(out, "Content-Type: application/json\r\n");
    finish(out, &body, false);
    gw_buf_free(&body);
}

/* Headers that describe one hop, not the message (RFC 9110 7.6.1), and the
 * framing the gateway sets again itself. */
bool gw_is_hop_by_hop(const char *name)
{
    static const char *const names[] = {
        "Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer",
        "Transfer-Encoding", "Upgrade", "Content-Length", NULL};
    for (int i = 0; names[i] != NULL; i++) {
        if (strcasecmp(name, names[i]) == 0)
            return true;
    }
    return false;
}

void gw_respond_proxied(gw_buf *out, const gw_message *resp, int status,
                        const rl_decision *d, bool keep_alive)
{
    head_lines(out, status, resp->body.len, keep_alive);
    for (int i = 0; i < resp->n_headers; i++) {
        const gw_header *h = &resp->headers[i];
        if (!gw_is_hop_by_hop(h->name.data))
            gw_buf_printf(out, "%s: %s\r\n", h->name.data, h->value.data);
    }
    decision_lines(out, d);
    finish(out, &resp->body, false);
}
