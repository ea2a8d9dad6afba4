/*
 * rls_store.h: the rl config rl-rls runs its agents on. Its store comes
 * from upstream's REDIS_* variables (REDIS_TYPE single, cluster or
 * sentinel, REDIS_URL, REDIS_AUTH, REDIS_TLS*), or from rl's own YAML
 * given with --config (store, aggregators, deadlines: everything but
 * rules); its rules are rl-rls's own, one per way of counting a
 * descriptor's limit can ask for (rls_rule_of): a fixed window or a token
 * bucket, on_error allow or deny, counted by each instance alone (mode:
 * local), leased (mode: leased), or synced through rl-aggregator (mode:
 * synced, one rule per unit). Every descriptor is checked through one
 * of them at its limit's rate (rl_check_rule_async), keyed under
 * CACHE_KEY_PREFIX and the rule's name.
 */
#ifndef RL_RLS_STORE_H
#define RL_RLS_STORE_H

#include "rls_config.h"
#include "rls_settings.h"

#include <stdbool.h>
#include <stddef.h>

#define RLS_RULE "rls"

/* The rule a limit is counted by: RLS_RULE (upstream's fixed window,
 * on_error: allow) unless rl's extension asks otherwise. */
const char *rls_rule_of(const rls_limit *limit);

/* The environment variable rl-rls hands REDIS_AUTH's password through, so
 * that no YAML text holds it. */
#define RLS_PASSWORD_ENV "RL_RLS_REDIS_PASSWORD"

/* rls_store_yaml writes the config's YAML: rl_yaml's text (the --config
 * file's, NULL without one) or a store from the settings, then the rules,
 * with synced: the synced ones too (rls-synced-<unit>[-allow|-deny], one
 * per upstream unit and on_error; only with an aggregator to count them:
 * an agent with a synced rule dials its aggregators). They depend on
 * nothing but CACHE_KEY_PREFIX, so the aggregators' copy of them never
 * changes with the descriptors. A string to free, or NULL with the reason
 * in err. Sets RLS_PASSWORD_ENV when REDIS_AUTH holds a password. */
char *rls_store_yaml(const rls_settings *s, const char *rl_yaml, bool synced,
                     char *err, size_t cap);

#endif
