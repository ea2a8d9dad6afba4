/*
 * metrics.c: GET /metrics on the --metrics socket, in Prometheus's text
 * format (version 0.0.4): the agent's counters (rl_agent_stats) and the
 * responses this gateway wrote. Anything else there is a 404.
 */
#include "gateway.h"
#include "prom_text.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void put(void *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    gw_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

static void family(gw_buf *b, const char *name, const char *type,
                   const char *help)
{
    rl_prom_family(put, b, name, type, help);
}

static void agent_metrics(gw_buf *b, const rl_agent_counters *s,
                          const rl_rule_counters *rules, size_t n)
{
    family(b, "rl_requests_total", "counter",
           "Requests decided by the agent, by decision.");
    gw_buf_printf(b, "rl_requests_total{decision=\"allowed\"} %llu\n"
                  "rl_requests_total{decision=\"rejected\"} %llu\n",
                  (unsigned long long)s->allowed,
                  (unsigned long long)s->rejected);
    family(b, "rl_requests_degraded_total", "counter",
           "Decisions in which a rule's on_error decided.");
    gw_buf_printf(b, "rl_requests_degraded_total %llu\n",
                  (unsigned long long)s->degraded);
    family(b, "rl_rule_checks_total", "counter",
           "Requests a rule applied to, by rule and verdict.");
    for (size_t i = 0; i < n; i++)
        gw_buf_printf(b, "rl_rule_checks_total{rule=\"%s\",verdict="
                      "\"allowed\"} %llu\nrl_rule_checks_total{rule=\"%s\","
                      "verdict=\"rejected\"} %llu\n", rules[i].rule,
                      (unsigned long long)rules[i].allowed, rules[i].rule,
                      (unsigned long long)rules[i].rejected);
    family(b, "rl_rule_shadow_rejected_total", "counter",
           "Requests a shadow rule would have rejected, by rule.");
    for (size_t i = 0; i < n; i++)
        gw_buf_printf(b, "rl_rule_shadow_rejected_total{rule=\"%s\"} %llu\n",
                      rules[i].rule,
                      (unsigned long long)rules[i].shadow_rejected);
    family(b, "rl_rule_degraded_total", "counter",
           "Requests a rule's on_error decided, by rule.");
    for (size_t i = 0; i < n; i++)
        gw_buf_printf(b, "rl_rule_degraded_total{rule=\"%s\"} %llu\n",
                      rules[i].rule, (unsigned long long)rules[i].degraded);
    family(b, "rl_rule_fallback_total", "counter",
           "Requests a rule's on_error: local bucket (its share of the "
           "fleet's limit) decided while the store did not answer, by rule "
           "and verdict.");
    for (size_t i = 0; i < n; i++)
        gw_buf_printf(b, "rl_rule_fallback_total{rule=\"%s\",verdict="
                      "\"allowed\"} %llu\nrl_rule_fallback_total{rule=\"%s\","
                      "verdict=\"rejected\"} %llu\n", rules[i].rule,
                      (unsigned long long)rules[i].fallback_allowed,
                      rules[i].rule,
                      (unsigned long long)rules[i].fallback_rejected);
    family(b, "rl_store_errors_total", "counter",
           "Bucket calls the store did not answer.");
    gw_buf_printf(b, "rl_store_errors_total %llu\n",
                  (unsigned long long)s->store_errors);
    family(b, "rl_store_batches_total", "counter",
           "Writes to store nodes (one per shard per I/O loop turn).");
    gw_buf_printf(b, "rl_store_batches_total %llu\n",
                  (unsigned long long)s->store_batches);
    rl_prom_histogram(put, b, "rl_exact_check_duration_seconds",
                      "Time from a check's call to its decision, for "
                      "requests that waited for the store (exact rules).",
                      &s->exact_check_seconds);
    family(b, "rl_keys", "gauge", "Keys tracked in the agent, by mode "
           "(fallback: on_error: local's buckets; leased: keys holding "
           "leases).");
    gw_buf_printf(b, "rl_keys{mode=\"synced\"} %llu\nrl_keys{mode=\"local\"} "
                  "%llu\nrl_keys{mode=\"fallback\"} %llu\n"
                  "rl_keys{mode=\"leased\"} %llu\n",
                  (unsigned long long)s->synced_keys,
                  (unsigned long long)s->local_keys,
                  (unsigned long long)s->fallback_keys,
                  (unsigned long long)s->leased_keys);
    family(b, "rl_keys_refused_total", "counter",
           "New keys refused for a key cap, by mode.");
    gw_buf_printf(b, "rl_keys_refused_total{mode=\"synced\"} %llu\n"
                  "rl_keys_refused_total{mode=\"local\"} %llu\n"
                  "rl_keys_refused_total{mode=\"fallback\"} %llu\n"
                  "rl_keys_refused_total{mode=\"leased\"} %llu\n",
                  (unsigned long long)s->synced_keys_refused,
                  (unsigned long long)s->local_keys_refused,
                  (unsigned long long)s->fallback_keys_refused,
                  (unsigned long long)s->leased_keys_refused);
    family(b, "rl_leases_total", "counter",
           "Lease calls made for leased rules.");
    gw_buf_printf(b, "rl_leases_total %llu\n",
                  (unsigned long long)s->leases_taken);
    family(b, "rl_lease_tokens_total", "counter",
           "Tokens the leases took from their buckets.");
    gw_buf_printf(b, "rl_lease_tokens_total %llu\n",
                  (unsigned long long)s->lease_tokens_taken);
    family(b, "rl_lease_returns_total", "counter",
           "Give-back calls of leased tokens (idle keys, reloads, close).");
    gw_buf_printf(b, "rl_lease_returns_total %llu\n",
                  (unsigned long long)s->leases_returned);
    family(b, "rl_lease_returned_tokens_total", "counter",
           "Leased tokens given back to their buckets.");
    gw_buf_printf(b, "rl_lease_returned_tokens_total %llu\n",
                  (unsigned long long)s->lease_tokens_returned);
}

static void shard_metrics(gw_buf *b, rl_agent *agent)
{
    rl_shard_counters shards[64];
    size_t n = rl_agent_shards(agent, shards, 64);
    family(b, "rl_store_node_batches_total", "counter",
           "Writes to each store node (shard).");
    for (size_t i = 0; i < n && i < 64; i++)
        gw_buf_printf(b, "rl_store_node_batches_total{node=\"%s\"} %llu\n",
                      shards[i].node, (unsigned long long)shards[i].batches);
    family(b, "rl_store_node_calls_total", "counter",
           "Bucket calls sent to each store node (shard).");
    for (size_t i = 0; i < n && i < 64; i++)
        gw_buf_printf(b, "rl_store_node_calls_total{node=\"%s\"} %llu\n",
                      shards[i].node, (unsigned long long)shards[i].calls);
}

static void gateway_metrics(gw_buf *b, const gw_server *srv)
{
    family(b, "rl_gateway_responses_total", "counter",
           "Responses written, by status class.");
    for (int k = 1; k <= 5; k++)
        gw_buf_printf(b, "rl_gateway_responses_total{code=\"%dxx\"} %llu\n",
                      k, (unsigned long long)srv->counts.by_status[k]);
    family(b, "rl_gateway_upstream_errors_total", "counter",
           "Allowed requests the upstream failed (502, 504).");
    gw_buf_printf(b, "rl_gateway_upstream_errors_total %llu\n",
                  (unsigned long long)srv->counts.upstream_errors);
    family(b, "rl_gateway_reloads_total", "counter",
           "SIGHUP reloads, by result (failed: the old config was kept).");
    gw_buf_printf(b, "rl_gateway_reloads_total{result=\"ok\"} %llu\n"
                  "rl_gateway_reloads_total{result=\"failed\"} %llu\n",
                  (unsigned long long)srv->reloads,
                  (unsigned long long)srv->reloads_failed);
    family(b, "rl_gateway_connections", "gauge", "Open connections.");
    gw_buf_printf(b, "rl_gateway_connections %zu\n", srv->n_conns);
}

void gw_respond_metrics(gw_buf *out, gw_server *srv, const char *path,
                        bool keep_alive)
{
    if (path == NULL || strcmp(path, "/metrics") != 0) {
        gw_respond_error(out, 404, "not_found", "only /metrics is served "
                         "here", keep_alive);
        return;
    }
    rl_agent_counters s;
    rl_rule_counters *rules = calloc(srv->config->n_rules + 1,
                                     sizeof *rules);
    gw_buf body = {0};
    if (rules != NULL
        && rl_agent_stats(srv->agent, &s, rules, srv->config->n_rules)
               == RL_OK) {
        /* The agent's rules are the config's, reloads included. */
        agent_metrics(&body, &s, rules,
                      s.n_rules < srv->config->n_rules
                          ? s.n_rules : srv->config->n_rules);
        shard_metrics(&body, srv->agent);
        gateway_metrics(&body, srv);
    }
    free(rules);
    gw_buf_printf(out, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n"
                  "Content-Type: text/plain; version=0.0.4\r\n"
                  "Connection: %s\r\n\r\n", body.len,
                  keep_alive ? "keep-alive" : "close");
    if (body.len > 0)
        gw_buf_append(out, body.data, body.len, SIZE_MAX / 2);
    gw_buf_free(&body);
}
