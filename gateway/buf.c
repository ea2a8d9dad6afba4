/*
 * buf.c: a growable byte buffer with a ceiling, for what the gateway reads
 * off sockets and writes back.
 */
#include "gateway.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gw_buf_append(gw_buf *b, const char *p, size_t n, size_t max)
{
    if (n > max || b->len > max - n)
        return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *data = realloc(b->data, cap);
        if (data == NULL)
            return -1;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0'; /* headers are read as C strings */
    return 0;
}

int gw_buf_vprintf(gw_buf *b, const char *fmt, va_list args)
{
    char small[512];
    va_list ap;
    va_copy(ap, args);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -1;
    if ((size_t)n < sizeof small)
        return gw_buf_append(b, small, (size_t)n, SIZE_MAX / 2);
    char *big = malloc((size_t)n + 1);
    if (big == NULL)
        return -1;
    va_copy(ap, args);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = gw_buf_append(b, big, (size_t)n, SIZE_MAX / 2);
    free(big);
    return rc;
}

int gw_buf_printf(gw_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = gw_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void gw_buf_free(gw_buf *b)
{
    free(b->data);
    *b = (gw_buf){0};
}
