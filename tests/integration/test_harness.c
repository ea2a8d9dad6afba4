/*
 * The test servers themselves: a private standalone server and a
 * 3-primary/3-replica cluster, on loopback, without persistence.
 */
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

Test(harness, standalone_server_is_private_and_not_persistent)
{
    const char *addr = test_env("RL_TEST_REDIS");
    cr_assert(strncmp(addr, "127.0.0.1:", 10) == 0, "%s", addr);
    cr_assert_str_neq(addr, "127.0.0.1:6379", "a fixed, shared port");
    redisContext *c = test_redis_connect(NULL);
    redisReply *r = test_redis_command(c, "CONFIG GET save");
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    cr_assert_eq(r->elements, 2);
    cr_assert_str_empty(r->element[1]->str);
    freeReplyObject(r);
    r = test_redis_command(c, "CONFIG GET bind");
    cr_assert_str_eq(r->element[1]->str, "127.0.0.1");
    freeReplyObject(r);
    redisFree(c);
}

/* Counts primaries and their replicas from one node's CLUSTER SLOTS. */
Test(harness, cluster_has_three_primaries_with_a_replica_each)
{
    const char *all = test_env("RL_TEST_CLUSTER");
    char first[64];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(all, ","), all);
    int nodes = 1;
    for (const char *p = all; *p; p++)
        nodes += *p == ',';
    cr_assert_eq(nodes, 6);

    redisContext *c = test_redis_connect(first);
    redisReply *r = test_redis_command(c, "CLUSTER SLOTS");
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    cr_assert_eq(r->elements, 3, "%zu slot ranges", r->elements);
    long covered = 0;
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *range = r->element[i];
        /* start, end, primary, one replica */
        cr_assert_eq(range->elements, 4, "range %zu has %zu nodes", i,
                     range->elements - 2);
        covered += range->element[1]->integer - range->element[0]->integer + 1;
        cr_assert_str_eq(range->element[2]->element[0]->str, "127.0.0.1");
    }
    cr_assert_eq(covered, 16384);
    freeReplyObject(r);
    redisFree(c);
}
