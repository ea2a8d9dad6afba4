/*
 * rls_pool.c: a header before each block holds its length and class; a
 * free block's bytes hold the link of its list.
 */
#include "rls_pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 16 bytes on x86-64: what malloc's alignment asks anyway. */
typedef struct rls_pool_head {
    _Alignas(max_align_t) size_t n;
    unsigned cls;               /* RLS_POOL_CLASSES: from malloc alone */
} rls_pool_head;

struct rls_pool_block {
    rls_pool_head head;
    rls_pool_block *next;       /* on a free list */
};

_Static_assert(sizeof(rls_pool_head) == 16, "the classes assume 16");

/* The class of a block of n bytes and its header: the power of two from
 * 64 up that holds them (n at most RLS_POOL_LARGEST). */
static unsigned class_of(size_t n)
{
    size_t total = n + sizeof(rls_pool_head);
    if (total <= 64)
        return 0;
    return (unsigned)(64 - __builtin_clzll((unsigned long long)total - 1)) -
           6;
}

static size_t class_size(unsigned cls)
{
    return (size_t)64 << cls;
}

void rls_pool_init(rls_pool *p)
{
    memset(p, 0, sizeof *p);
}

void *rls_pool_alloc(rls_pool *p, size_t n)
{
    unsigned cls = n <= RLS_POOL_LARGEST ? class_of(n) : RLS_POOL_CLASSES;
    rls_pool_block *b = NULL;
    if (cls < RLS_POOL_CLASSES && p->free[cls] != NULL) {
        b = p->free[cls];
        p->free[cls] = b->next;
        p->kept[cls] -= class_size(cls);
    } else {
        size_t total = cls < RLS_POOL_CLASSES
                           ? class_size(cls)
                           : n + sizeof(rls_pool_head);
        if (total < n)
            return NULL;
        b = malloc(total);
        if (b == NULL)
            return NULL;
    }
    b->head.n = n;
    b->head.cls = cls;
    return &b->head + 1;
}

void *rls_pool_zalloc(rls_pool *p, size_t n)
{
    void *m = rls_pool_alloc(p, n);
    if (m != NULL)
        memset(m, 0, n);
    return m;
}

void rls_pool_free(rls_pool *p, void *block)
{
    if (block == NULL)
        return;
    rls_pool_block *b = (rls_pool_block *)((rls_pool_head *)block - 1);
    unsigned cls = b->head.cls;
    if (cls >= RLS_POOL_CLASSES ||
        p->kept[cls] + class_size(cls) > RLS_POOL_KEEP) {
        free(b);
        return;
    }
    b->next = p->free[cls];
    p->free[cls] = b;
    p->kept[cls] += class_size(cls);
}

void *rls_pool_realloc(rls_pool *p, void *block, size_t n)
{
    if (block == NULL)
        return rls_pool_alloc(p, n);
    rls_pool_head *h = (rls_pool_head *)block - 1;
    if (h->cls < RLS_POOL_CLASSES && n <= RLS_POOL_LARGEST &&
        class_of(n) == h->cls) {
        h->n = n;
        return block;
    }
    void *m = rls_pool_alloc(p, n);
    if (m == NULL)
        return NULL;
    memcpy(m, block, h->n < n ? h->n : n);
    rls_pool_free(p, block);
    return m;
}

size_t rls_pool_len(const void *block)
{
    return ((const rls_pool_head *)block - 1)->n;
}

void rls_pool_fini(rls_pool *p)
{
    for (unsigned cls = 0; cls < RLS_POOL_CLASSES; cls++) {
        while (p->free[cls] != NULL) {
            rls_pool_block *b = p->free[cls];
            p->free[cls] = b->next;
            free(b);
        }
        p->kept[cls] = 0;
    }
}
