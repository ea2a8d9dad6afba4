/*
 * rl-rls's free lists (rls_pool.h): a freed block serves the next request
 * of its class, its length is kept, a class keeps no more than its share,
 * and large blocks and resizes across classes still work.
 */
#include "rls_pool.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

Test(rls_pool, a_freed_block_serves_the_next_of_its_class)
{
    rls_pool p = {0};
    void *a = rls_pool_alloc(&p, 100);
    cr_assert_not_null(a);
    cr_assert_eq((uintptr_t)a % _Alignof(max_align_t), 0);
    cr_assert_eq(rls_pool_len(a), 100);
    rls_pool_free(&p, a);
    void *b = rls_pool_alloc(&p, 80);
#if RLS_POOL_KEEP > 0
    cr_assert_eq(b, a, "the kept block is used again");
#endif
    cr_assert_eq(rls_pool_len(b), 80);
    rls_pool_free(&p, b);
    rls_pool_fini(&p);
}

Test(rls_pool, zalloc_zeroes_a_reused_block)
{
    rls_pool p = {0};
    uint8_t *a = rls_pool_alloc(&p, 200);
    memset(a, 0xAB, 200);
    rls_pool_free(&p, a);
    uint8_t *b = rls_pool_zalloc(&p, 200);
    for (size_t i = 0; i < 200; i++)
        cr_assert_eq(b[i], 0);
    rls_pool_free(&p, b);
    rls_pool_fini(&p);
}

Test(rls_pool, a_class_keeps_at_most_its_share)
{
    rls_pool p = {0};
    enum { N = 300 };
    void *blocks[N];
    for (int i = 0; i < N; i++)
        blocks[i] = rls_pool_alloc(&p, 4000);
    for (int i = 0; i < N; i++)
        rls_pool_free(&p, blocks[i]);
    for (int c = 0; c < RLS_POOL_CLASSES; c++)
        cr_assert_leq(p.kept[c], RLS_POOL_KEEP);
#if RLS_POOL_KEEP > 0
    cr_assert_eq(p.kept[RLS_POOL_CLASSES - 1], RLS_POOL_KEEP);
#endif
    rls_pool_fini(&p);
    cr_assert_eq(p.kept[RLS_POOL_CLASSES - 1], 0);
}

Test(rls_pool, large_blocks_and_resizes_keep_their_bytes)
{
    rls_pool p = {0};
    uint8_t *big = rls_pool_alloc(&p, 1 << 20);
    cr_assert_not_null(big);
    memset(big, 7, 1 << 20);
    rls_pool_free(&p, big);
    cr_assert_null(rls_pool_alloc(&p, SIZE_MAX - 8), "no wrap past SIZE_MAX");

    uint8_t *r = rls_pool_realloc(&p, NULL, 10);
    memcpy(r, "0123456789", 10);
    r = rls_pool_realloc(&p, r, 20);         /* the same class */
    cr_assert_eq(rls_pool_len(r), 20);
    r = rls_pool_realloc(&p, r, 10000);      /* past the largest class */
    cr_assert_eq(memcmp(r, "0123456789", 10), 0);
    r = rls_pool_realloc(&p, r, 5);
    cr_assert_eq(memcmp(r, "01234", 5), 0);
    cr_assert_eq(rls_pool_len(r), 5);
    rls_pool_free(&p, r);
    rls_pool_free(&p, NULL);
    rls_pool_fini(&p);
}
