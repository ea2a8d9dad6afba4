/*
 * rls_chunked.h: HTTP/1.1's chunked transfer coding (RFC 9112 §7.1) read
 * as a request body arrives, for /json (rls_http.c). The reader is told
 * the bytes as they come and says how many it wants next, so that it never
 * asks for a byte past the body's end (the next request on the connection
 * is not read by mistake): a line's bytes (chunk sizes, trailers) one at a
 * time, a chunk's data at once. Chunk extensions are ignored, trailer
 * fields skipped. Bounded: the data at most max bytes in all (refused
 * before a byte of the chunk over it is read), a line at most
 * RLS_CHUNKED_LINE_MAX bytes, the trailers RLS_CHUNKED_TRAILERS_MAX.
 */
#ifndef RL_RLS_CHUNKED_H
#define RL_RLS_CHUNKED_H

#include <stddef.h>
#include <stdint.h>

#define RLS_CHUNKED_LINE_MAX 4096
#define RLS_CHUNKED_TRAILERS_MAX 16384

typedef struct rls_chunked {
    int state;
    uint64_t left;      /* of the chunk's data, or its size being read */
    size_t line;        /* bytes of the line being read */
    size_t trailers;    /* bytes of trailer lines so far */
    size_t len, max;    /* data so far, and its cap */
    const char *why;    /* RLS_CHUNKED_EBAD's reason */
} rls_chunked;

/* What rls_chunked_byte and _data answer. */
#define RLS_CHUNKED_MORE 0     /* read rls_chunked_want's bytes next */
#define RLS_CHUNKED_DONE 1     /* the body is over: nothing more to read */
#define RLS_CHUNKED_EBAD (-1)  /* not chunked coding (why says how) */
#define RLS_CHUNKED_EBIG (-2)  /* its data would be over max */

void rls_chunked_init(rls_chunked *c, size_t max);

/* rls_chunked_want: how many bytes to read next, at most; when
 * rls_chunked_in_data says they are data, they go to the body (and then to
 * rls_chunked_data), else one byte to rls_chunked_byte. */
size_t rls_chunked_want(const rls_chunked *c);
int rls_chunked_in_data(const rls_chunked *c);

/* rls_chunked_byte takes one byte of a line. */
int rls_chunked_byte(rls_chunked *c, uint8_t b);

/* rls_chunked_data: n bytes of data (n ≤ rls_chunked_want) were read. */
int rls_chunked_data(rls_chunked *c, size_t n);

#endif
