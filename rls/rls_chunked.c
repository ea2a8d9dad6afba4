/*
 * rls_chunked.c: the chunked coding's reader (rls_chunked.h), a byte at a
 * time outside of data. Lines end in CRLF only: a bare LF is refused, so
 * that no proxy in front can see a different end of the body.
 */
#include "rls_chunked.h"

enum {
    SIZE,       /* the chunk size's hex digits */
    EXT,        /* after them, up to CR: extensions, ignored */
    SIZE_LF,
    DATA,
    DATA_CR,
    DATA_LF,
    TRAILER,    /* a trailer line's first byte, or the final CR */
    FIELD,      /* the rest of a trailer line, skipped */
    FIELD_LF,
    END_LF,
    DONE
};

void rls_chunked_init(rls_chunked *c, size_t max)
{
    *c = (rls_chunked){.state = SIZE, .max = max};
}

size_t rls_chunked_want(const rls_chunked *c)
{
    if (c->state == DONE)
        return 0;
    return c->state == DATA ? (size_t)c->left : 1;
}

int rls_chunked_in_data(const rls_chunked *c)
{
    return c->state == DATA;
}

static int bad(rls_chunked *c, const char *why)
{
    c->why = why;
    return RLS_CHUNKED_EBAD;
}

static int hex(uint8_t b)
{
    if (b >= '0' && b <= '9')
        return b - '0';
    if (b >= 'a' && b <= 'f')
        return b - 'a' + 10;
    if (b >= 'A' && b <= 'F')
        return b - 'A' + 10;
    return -1;
}

static int size_byte(rls_chunked *c, uint8_t b)
{
    int d = hex(b);
    if (d >= 0 && c->state == SIZE) {
        /* Checked digit by digit: never past max, so never overflows. */
        c->left = c->left * 16 + (uint64_t)d;
        return c->left > c->max - c->len ? RLS_CHUNKED_EBIG
                                         : RLS_CHUNKED_MORE;
    }
    if (c->line == 1)
        return bad(c, "a chunk size is not a hex number");
    if (b == '\r')
        c->state = SIZE_LF;
    else if (b == '\n')
        return bad(c, "a chunk size line ends in LF, not CRLF");
    else if (c->state == SIZE && b != ';' && b != ' ' && b != '\t')
        return bad(c, "a chunk size is not a hex number");
    else
        c->state = EXT;
    return RLS_CHUNKED_MORE;
}

static int expect(rls_chunked *c, uint8_t b, uint8_t want, int next,
                  const char *why)
{
    if (b != want)
        return bad(c, why);
    c->state = next;
    c->line = 0;
    return RLS_CHUNKED_MORE;
}

static int trailer_byte(rls_chunked *c, uint8_t b)
{
    if (++c->trailers > RLS_CHUNKED_TRAILERS_MAX)
        return bad(c, "the trailers are over 16 KiB");
    if (c->state == TRAILER && b == '\r')
        c->state = END_LF;
    else if (c->state == FIELD_LF)
        return expect(c, b, '\n', TRAILER, "a trailer line ends in CR "
                      "without LF");
    else if (b == '\r')
        c->state = FIELD_LF;
    else if (b == '\n')
        return bad(c, "a trailer line ends in LF, not CRLF");
    else
        c->state = FIELD;
    return RLS_CHUNKED_MORE;
}

int rls_chunked_byte(rls_chunked *c, uint8_t b)
{
    if (++c->line > RLS_CHUNKED_LINE_MAX)
        return bad(c, "a line of the chunked body is over 4 KiB");
    switch (c->state) {
    case SIZE:
    case EXT:
        return size_byte(c, b);
    case SIZE_LF:
        return expect(c, b, '\n', c->left == 0 ? TRAILER : DATA,
                      "a chunk size line ends in CR without LF");
    case DATA_CR:
        return expect(c, b, '\r', DATA_LF, "a chunk is longer than its "
                      "size");
    case DATA_LF:
        return expect(c, b, '\n', SIZE, "a chunk's data ends in CR "
                      "without LF");
    case END_LF:
        if (b != '\n')
            return bad(c, "the chunked body ends in CR without LF");
        c->state = DONE;
        return RLS_CHUNKED_DONE;
    case TRAILER:
    case FIELD:
    case FIELD_LF:
        return trailer_byte(c, b);
    default:
        return bad(c, "a byte after the chunked body's end");
    }
}

int rls_chunked_data(rls_chunked *c, size_t n)
{
    c->left -= n;
    c->len += n;
    if (c->left == 0)
        c->state = DATA_CR;
    return RLS_CHUNKED_MORE;
}
