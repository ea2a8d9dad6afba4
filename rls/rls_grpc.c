/*
 * rls_grpc.c: gRPC's length-prefixed messages and its header grammar,
 * written from gRPC's PROTOCOL-HTTP2.md.
 */
#include "rls_grpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rls_grpc_reader_init(rls_grpc_reader *r, size_t max)
{
    memset(r, 0, sizeof *r);
    r->max = max;
}

void rls_grpc_reader_free(rls_grpc_reader *r)
{
    free(r->body);
    r->body = NULL;
}

/* A body's first buffer: what a small message needs, at most this. */
#define RLS_GRPC_FIRST_BUFFER 16384

/* The prefix is complete: its flag and length, and a first buffer. */
static rls_grpc_read begin_body(rls_grpc_reader *r)
{
    if (r->prefix[0] != 0)
        return RLS_GRPC_COMPRESSED;
    r->length = (uint32_t)r->prefix[1] << 24 | (uint32_t)r->prefix[2] << 16
                | (uint32_t)r->prefix[3] << 8 | r->prefix[4];
    if (r->length > r->max)
        return RLS_GRPC_TOO_LARGE;
    /* One byte more: an empty message still has a buffer. */
    r->cap = (r->length < RLS_GRPC_FIRST_BUFFER ? r->length
                                                 : RLS_GRPC_FIRST_BUFFER) + 1;
    r->body = malloc(r->cap);
    return r->body != NULL ? RLS_GRPC_MORE : RLS_GRPC_NO_MEMORY;
}

/* Room for need more bytes of the body: doubled, up to its length. */
static bool make_room(rls_grpc_reader *r, size_t need)
{
    if (r->cap - r->have_body >= need)
        return true;
    size_t cap = r->cap;
    while (cap - r->have_body < need)
        cap *= 2;
    if (cap > (size_t)r->length + 1)
        cap = (size_t)r->length + 1;
    uint8_t *body = realloc(r->body, cap);
    if (body == NULL)
        return false;
    r->body = body;
    r->cap = cap;
    return true;
}

rls_grpc_read rls_grpc_reader_feed(rls_grpc_reader *r, const uint8_t *data,
                                   size_t len, size_t *used)
{
    size_t at = 0;
    *used = 0;
    if (r->messages > 0 && len > 0)
        return RLS_GRPC_SECOND;
    while (r->have_prefix < 5 && at < len)
        r->prefix[r->have_prefix++] = data[at++];
    if (r->have_prefix < 5) {
        *used = at;
        return RLS_GRPC_MORE;
    }
    if (r->body == NULL) {
        rls_grpc_read rc = begin_body(r);
        if (rc != RLS_GRPC_MORE)
            return rc;
    }
    size_t take = len - at;
    if (take > r->length - r->have_body)
        take = r->length - r->have_body;
    if (!make_room(r, take))
        return RLS_GRPC_NO_MEMORY;
    memcpy(r->body + r->have_body, data + at, take);
    r->have_body += take;
    at += take;
    *used = at;
    if (r->have_body < r->length)
        return RLS_GRPC_MORE;
    r->messages++;
    return RLS_GRPC_MESSAGE;
}

void rls_grpc_prefix(uint8_t out[5], uint32_t len)
{
    out[0] = 0;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
}

int rls_grpc_timeout_ms(const char *value, size_t len, uint64_t *ms)
{
    /* TimeoutValue: 1 to 8 ASCII digits; TimeoutUnit: one letter. */
    if (len < 2 || len > 9)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i + 1 < len; i++) {
        if (value[i] < '0' || value[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(value[i] - '0');
    }
    uint64_t ns_per;
    switch (value[len - 1]) {
    case 'H':
        ns_per = 3600000000000ULL;
        break;
    case 'M':
        ns_per = 60000000000ULL;
        break;
    case 'S':
        ns_per = 1000000000ULL;
        break;
    case 'm':
        ns_per = 1000000ULL;
        break;
    case 'u':
        ns_per = 1000ULL;
        break;
    case 'n':
        ns_per = 1;
        break;
    default:
        return -1;
    }
    /* At most 99,999,999 hours: in ms, well inside 64 bits. */
    if (ns_per >= 1000000ULL)
        *ms = v * (ns_per / 1000000ULL);
    else
        *ms = (v * ns_per + 999999ULL) / 1000000ULL;
    return 0;
}

size_t rls_grpc_percent_encode(const char *text, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    if (cap == 0)
        return 0;
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0';
         p++) {
        bool plain = *p >= 0x20 && *p <= 0x7e && *p != '%';
        size_t need = plain ? 1 : 3;
        if (n + need >= cap)
            break;
        if (plain) {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    out[n] = '\0';
    return n;
}
