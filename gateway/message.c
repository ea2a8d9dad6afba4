/*
 * message.c: an HTTP message as http_parser hands it over, in pieces: the
 * target, each header's name and value (either may arrive split across
 * reads), the body. Every part has a ceiling; a message over one is marked
 * with the status to refuse it with and parsing stops.
 */
#include "gateway.h"

#include <stdint.h>
#include <stdlib.h>
#include <strings.h>

void gw_message_reset(gw_message *m)
{
    gw_buf_free(&m->url);
    for (int i = 0; i < m->n_headers; i++) {
        gw_buf_free(&m->headers[i].name);
        gw_buf_free(&m->headers[i].value);
    }
    gw_buf_free(&m->body);
    size_t body_max = m->body_max;
    bool skip_body = m->skip_body;
    *m = (gw_message){.body_max = body_max, .skip_body = skip_body};
}

static int refuse(gw_message *m, int status, const char *why)
{
    m->error_status = status;
    m->error = why;
    return -1; /* stops http_parser */
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    gw_message *m = p->data;
    if (gw_buf_append(&m->url, at, len, GW_URL_MAX) != 0)
        return refuse(m, 414, "the request target is over 8 KiB");
    return 0;
}

static int count_header_bytes(gw_message *m, size_t len)
{
    m->header_bytes += len;
    if (m->header_bytes > GW_HEADER_BYTES_MAX)
        return refuse(m, 431, "the headers are over 64 KiB");
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    gw_message *m = p->data;
    if (count_header_bytes(m, len) != 0)
        return -1;
    if (m->n_headers == 0 || m->in_value) {
        if (m->n_headers == GW_HEADERS_MAX)
            return refuse(m, 431, "more than 100 headers");
        m->n_headers++;
        m->in_value = false;
    }
    gw_header *h = &m->headers[m->n_headers - 1];
    if (gw_buf_append(&h->name, at, len, GW_HEADER_BYTES_MAX) != 0)
        return refuse(m, 431, "the headers are over 64 KiB");
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    gw_message *m = p->data;
    if (count_header_bytes(m, len) != 0)
        return -1;
    m->in_value = true;
    gw_header *h = &m->headers[m->n_headers - 1];
    /* An empty value still gets a (NUL-terminated) buffer. */
    if (gw_buf_append(&h->value, at, len, GW_HEADER_BYTES_MAX) != 0)
        return refuse(m, 431, "the headers are over 64 KiB");
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    gw_message *m = p->data;
    m->method = p->type == HTTP_REQUEST ? (int)p->method : -1;
    for (int i = 0; i < m->n_headers; i++) {
        if (m->headers[i].value.data == NULL
            && gw_buf_append(&m->headers[i].value, "", 0, 1) != 0)
            return refuse(m, 503, "out of memory");
    }
    if (p->type == HTTP_REQUEST && p->content_length != UINT64_MAX
        && p->content_length > m->body_max)
        return refuse(m, 413, "the body is over the gateway's limit");
    return m->skip_body ? 1 : 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    gw_message *m = p->data;
    if (gw_buf_append(&m->body, at, len, m->body_max) != 0)
        return refuse(m, p->type == HTTP_REQUEST ? 413 : 502,
                      "the body is over the gateway's limit");
    return 0;
}

static int on_message_complete(http_parser *p)
{
    gw_message *m = p->data;
    m->complete = true;
    /* One message at a time: what follows (a pipelined request) waits in
     * the connection's buffer until this one is answered. */
    http_parser_pause(p, 1);
    return 0;
}

void gw_message_settings(http_parser_settings *s)
{
    http_parser_settings_init(s);
    s->on_url = on_url;
    s->on_header_field = on_header_field;
    s->on_header_value = on_header_value;
    s->on_headers_complete = on_headers_complete;
    s->on_body = on_body;
    s->on_message_complete = on_message_complete;
}

const char *gw_message_header(const gw_message *m, const char *name)
{
    for (int i = 0; i < m->n_headers; i++) {
        if (m->headers[i].name.data != NULL
            && strcasecmp(m->headers[i].name.data, name) == 0)
            return m->headers[i].value.data;
    }
    return NULL;
}
