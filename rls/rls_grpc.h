/*
 * rls_grpc.h: gRPC's framing over HTTP/2, the parts that are plain data:
 * a message's five-byte prefix, the grpc-timeout header, the status codes
 * and the percent-encoding of grpc-message (gRPC's PROTOCOL-HTTP2.md).
 * No I/O here: the connection (nghttp2) hands bytes in and takes them out.
 */
#ifndef RL_RLS_GRPC_H
#define RL_RLS_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The status codes rl-rls answers with (grpc/status.h's numbers). */
typedef enum rls_grpc_status {
    RLS_GRPC_OK = 0,
    RLS_GRPC_UNKNOWN = 2,         /* upstream's errors: no domain, ... */
    RLS_GRPC_INVALID_ARGUMENT = 3,
    RLS_GRPC_DEADLINE_EXCEEDED = 4,
    RLS_GRPC_NOT_FOUND = 5,
    RLS_GRPC_RESOURCE_EXHAUSTED = 8, /* a message over the cap */
    RLS_GRPC_UNIMPLEMENTED = 12,  /* an unknown method; compression */
    RLS_GRPC_INTERNAL = 13,       /* a message that does not decode */
    RLS_GRPC_UNAVAILABLE = 14,    /* draining */
} rls_grpc_status;

/* The message of one unary call, gathered from DATA frames: prefix, then
 * body. The body is refused over max bytes before any of it is kept, and
 * its buffer grows with the bytes that come, not with the length the
 * prefix claims: five bytes from a peer never make megabytes of memory. */
typedef struct rls_grpc_reader {
    uint8_t prefix[5];
    size_t have_prefix;     /* bytes of the prefix seen */
    uint32_t length;        /* the body's, from the prefix */
    uint8_t *body;
    size_t have_body;
    size_t cap;             /* body's size */
    size_t max;             /* the cap on a message */
    int messages;           /* complete ones seen */
} rls_grpc_reader;

typedef enum rls_grpc_read {
    RLS_GRPC_MORE,          /* give it more bytes */
    RLS_GRPC_MESSAGE,       /* body/length hold one whole message */
    RLS_GRPC_TOO_LARGE,     /* over max: RESOURCE_EXHAUSTED */
    RLS_GRPC_COMPRESSED,    /* the flag says compressed: UNIMPLEMENTED */
    RLS_GRPC_SECOND,        /* a second message in a unary call */
    RLS_GRPC_NO_MEMORY,
} rls_grpc_read;

void rls_grpc_reader_init(rls_grpc_reader *r, size_t max);
void rls_grpc_reader_free(rls_grpc_reader *r);

/* Takes len bytes of DATA; *used says how many it consumed (all, unless it
 * returns MESSAGE with bytes left over, which a unary call must not
 * send: the caller feeds the rest to see SECOND). */
rls_grpc_read rls_grpc_reader_feed(rls_grpc_reader *r, const uint8_t *data,
                                   size_t len, size_t *used);

/* The five-byte prefix of an uncompressed message of len bytes. */
void rls_grpc_prefix(uint8_t out[5], uint32_t len);

/* grpc-timeout ("20m", "1S": at most 8 digits, then H M S m u n) in ms,
 * rounded up (a nanosecond left is a ms to wait). 0, or -1 for a value
 * gRPC's grammar refuses (the call then has no deadline of its own). */
int rls_grpc_timeout_ms(const char *value, size_t len, uint64_t *ms);

/* grpc-message's percent-encoding of text (bytes outside 0x20..0x7E, and
 * '%', as %XX) into out; the length written, truncated at cap - 1 bytes
 * (never in the middle of an escape), NUL-terminated. */
size_t rls_grpc_percent_encode(const char *text, char *out, size_t cap);

#endif
