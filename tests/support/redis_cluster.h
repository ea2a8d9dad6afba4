/*
 * redis_cluster.h: a private 3-primary/3-replica Redis Cluster for tests,
 * built from six test_redis nodes with redis-cli --cluster create.
 */
#ifndef RL_TEST_REDIS_CLUSTER_H
#define RL_TEST_REDIS_CLUSTER_H

#include "redis_server.h"

#define TEST_CLUSTER_PRIMARIES 3
#define TEST_CLUSTER_NODES (2 * TEST_CLUSTER_PRIMARIES)

typedef struct test_cluster {
    test_redis nodes[TEST_CLUSTER_NODES];
    uint16_t tls_ports[TEST_CLUSTER_NODES]; /* 0: no TLS */
} test_cluster;

/* test_cluster_start starts the nodes under root, joins them into a cluster
 * with one replica per primary, and returns once every node reports
 * cluster_state:ok and lists every primary with a synced replica. On
 * failure everything started is stopped and -1 is returned with a reason. */
int test_cluster_start(test_cluster *cl, const char *root, char *err,
                       size_t errlen);

/* test_cluster_start_tls is test_cluster_start with every node serving
 * TLS as well, on tls_ports (tls-cluster and tls-replication yes: the bus
 * and the replicas use it too, and the slot map names the TLS ports), with
 * certs_dir's server.pem, server.key and ca.pem. */
int test_cluster_start_tls(test_cluster *cl, const char *root,
                           const char *certs_dir, char *err, size_t errlen);

/* test_cluster_stop stops every node that is running. */
void test_cluster_stop(test_cluster *cl);

#endif
