/*
 * rls_arena.c: a bump allocator whose first block is the arena's own.
 */
#include "rls_arena.h"

#include <stdlib.h>
#include <string.h>

struct rls_arena_block {
    rls_arena_block *next;
    _Alignas(max_align_t) uint8_t bytes[];
};

/* A heap block holds at least this much, so that many small blocks past
 * the first cost one malloc each few. */
#define HEAP_BLOCK 16384

static void *protobuf_alloc(void *data, size_t n)
{
    return rls_arena_alloc(data, n);
}

/* protobuf-c frees what it unpacked one piece at a time: the arena gives
 * it all back at once. */
static void protobuf_free(void *data, void *p)
{
    (void)data;
    (void)p;
}

void rls_arena_init(rls_arena *a)
{
    a->at = a->first;
    a->left = sizeof a->first;
    a->heap = NULL;
    a->protobuf = (ProtobufCAllocator){protobuf_alloc, protobuf_free, a};
}

static size_t aligned(size_t n)
{
    size_t align = _Alignof(max_align_t);
    return n > SIZE_MAX - align ? 0 : (n + align - 1) & ~(align - 1);
}

void *rls_arena_alloc(rls_arena *a, size_t n)
{
    size_t need = aligned(n > 0 ? n : 1);
    if (need == 0)
        return NULL;
    if (need > a->left) {
        size_t size = need > HEAP_BLOCK ? need : HEAP_BLOCK;
        if (size > SIZE_MAX - sizeof(rls_arena_block))
            return NULL;
        rls_arena_block *b = malloc(sizeof *b + size);
        if (b == NULL)
            return NULL;
        b->next = a->heap;
        a->heap = b;
        a->at = b->bytes;
        a->left = size;
    }
    void *p = a->at;
    a->at += need;
    a->left -= need;
    return memset(p, 0, n);
}

void rls_arena_free(rls_arena *a)
{
    while (a->heap != NULL) {
        rls_arena_block *next = a->heap->next;
        free(a->heap);
        a->heap = next;
    }
    rls_arena_init(a);
}
