/*
 * rls_pool.h: free lists of small blocks by size, for the memory one loop
 * takes and gives back on every call (nghttp2's eight blocks a stream, a
 * call's state, its answer). malloc and free cost 2,200 instructions of a
 * call's 31,000 for nghttp2's blocks alone; a block taken from its list
 * costs a few dozen.
 *
 * A freed block is kept for the next request of its size class while the
 * class keeps at most RLS_POOL_KEEP bytes; past that, and for blocks over
 * RLS_POOL_LARGEST bytes, malloc and free do the work. So a pool holds at
 * most RLS_POOL_CLASSES * RLS_POOL_KEEP bytes it is not using. Under
 * AddressSanitizer it keeps none, so that a use after free is still seen.
 *
 * Threads: a pool belongs to one thread (its loop's); a block is freed
 * through the pool it came from.
 */
#ifndef RL_RLS_POOL_H
#define RL_RLS_POOL_H

#include <stddef.h>

#define RLS_POOL_CLASSES 7          /* 64 bytes to 4 KiB, with the header */
#define RLS_POOL_LARGEST (4096 - 16)
#if defined(__SANITIZE_ADDRESS__)
#define RLS_POOL_KEEP 0
#else
#define RLS_POOL_KEEP (256 * 1024)
#endif

typedef struct rls_pool_block rls_pool_block;

typedef struct rls_pool {
    rls_pool_block *free[RLS_POOL_CLASSES];
    size_t kept[RLS_POOL_CLASSES];  /* bytes on each list */
} rls_pool;

/* An empty pool: zero it ((rls_pool){0}) or call this. */
void rls_pool_init(rls_pool *p);

/* n bytes (not zeroed), aligned for any type; NULL without memory or for
 * an n too large to allocate. */
void *rls_pool_alloc(rls_pool *p, size_t n);

/* n zeroed bytes, as rls_pool_alloc. */
void *rls_pool_zalloc(rls_pool *p, size_t n);

/* block (NULL: a new one) resized to n bytes, its first bytes kept; NULL
 * without memory, block then untouched. */
void *rls_pool_realloc(rls_pool *p, void *block, size_t n);

/* Gives block back (NULL: nothing). */
void rls_pool_free(rls_pool *p, void *block);

/* The n a block was allocated with (not NULL). */
size_t rls_pool_len(const void *block);

/* Gives every kept block back to malloc; the pool is empty again. */
void rls_pool_fini(rls_pool *p);

#endif
