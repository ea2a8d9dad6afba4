/*
 * rls_arena.h: memory for what lives only while one call is read or
 * answered (the unpacked request, the response's statuses, the scratch
 * arrays): a block on the caller's stack first, then blocks from the heap,
 * all given back at once. malloc and free were a fifth of a call's
 * instructions, for a handful of small blocks each.
 *
 * Threads: an arena belongs to the thread that made it.
 */
#ifndef RL_RLS_ARENA_H
#define RL_RLS_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* What the first block holds: the usual call with a few descriptors. */
#define RLS_ARENA_FIRST 4096

typedef struct rls_arena_block rls_arena_block;

typedef struct rls_arena {
    uint8_t *at;              /* the next free byte of the current block */
    size_t left;              /* bytes left in it */
    rls_arena_block *heap;    /* blocks from the heap, to give back */
    ProtobufCAllocator protobuf;
    _Alignas(max_align_t) uint8_t first[RLS_ARENA_FIRST];
} rls_arena;

void rls_arena_init(rls_arena *a);

/* n zeroed bytes, aligned for any type, until rls_arena_free; NULL when
 * the heap has none. */
void *rls_arena_alloc(rls_arena *a, size_t n);

/* Gives back the heap's blocks; the arena is empty again. */
void rls_arena_free(rls_arena *a);

#endif
