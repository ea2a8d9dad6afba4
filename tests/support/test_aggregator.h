/*
 * test_aggregator.h: a real rl-aggregator process for tests, on free
 * loopback ports, with a config written for it, and agents that talk to it.
 */
#ifndef RL_TEST_AGGREGATOR_H
#define RL_TEST_AGGREGATOR_H

#include "rl.h"

#include <stdint.h>
#include <sys/types.h>

typedef struct test_aggregator {
    pid_t pid;
    char config[512];    /* path of its config */
    char reports[64];    /* tcp://127.0.0.1:PORT */
    char totals[64];
    char log[600];       /* its stderr */
    uint16_t metrics;    /* its Prometheus port, on 127.0.0.1 */
    const char *extra;   /* more aggregator: lines, indented (or "") */
    /* Words run before rl-aggregator's own (the first a full path, e.g.
     * "/usr/bin/env", "LD_PRELOAD=..."), NULL-terminated; or NULL. */
    const char *const *wrapper;
    char index[24];      /* its --index in an aggregators: list, or "" */
    long log_from;       /* the log's size when this run started */
} test_aggregator;

/* A template for test_aggregator_start's reuse_from that asks for a fresh
 * config with extra aggregator lines ("  max_agents: 1\n"). */
#define TEST_AGGREGATOR_EXTRA(lines) \
    ((test_aggregator){.pid = -1, .extra = (lines)})

/* A template that runs the aggregator through a wrapper command; the
 * words must outlive the aggregator (a restart reuses them). */
#define TEST_AGGREGATOR_WRAPPED(words) \
    ((test_aggregator){.pid = -1, .extra = "", .wrapper = (words)})

/* test_aggregator_start writes a config (store: redis, host:port, seeds
 * joined by commas, a whole store mapping "{url: ...}", or RL_TEST_REDIS
 * when NULL; the given rules; sync_interval_ms) and starts
 * rl-aggregator on it. With reuse_from, it listens on the same ports and
 * reads the same config as that one did (a restart), unless reuse_from is
 * a TEST_AGGREGATOR_EXTRA or TEST_AGGREGATOR_WRAPPED template. */
void test_aggregator_start(test_aggregator *agg, const char *redis,
                           const char *rules_yaml, unsigned sync_interval_ms,
                           const test_aggregator *reuse_from);

/* test_aggregators_start writes one config listing n aggregators
 * (aggregators:, each on its own free ports) and starts one rl-aggregator
 * per entry with its --index; agents on aggs[0]'s config report to all
 * of them. A restart of one is test_aggregator_start(&aggs[i], NULL, NULL,
 * 0, &aggs[i]). */
void test_aggregators_start(test_aggregator *aggs, size_t n,
                            const char *redis, const char *rules_yaml,
                            unsigned sync_interval_ms);

/* The same, with extra lines after the config's aggregator: line
 * (indented lines under it, then top-level ones, such as region:). */
void test_aggregators_start_extra(test_aggregator *aggs, size_t n,
                                  const char *redis, const char *rules_yaml,
                                  unsigned sync_interval_ms,
                                  const char *extra);

/* SIGTERM and wait: the aggregator's clean exit (status 0 asserted). */
/* Waits until the aggregator has read Redis's clock (event=store_ready):
 * it is listening before that, and sends a report back for a retry. */
void test_aggregator_wait_ready(test_aggregator *agg);

void test_aggregator_stop(test_aggregator *agg);

/* SIGKILL, as a crash. */
void test_aggregator_kill(test_aggregator *agg);

/* An agent on the same config as agg (the rules and its URLs). The caller
 * closes it with rl_agent_close and frees *config. */
rl_agent *test_synced_agent(const test_aggregator *agg, rl_config **config);

#endif
