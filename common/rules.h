/*
 * rules.h: what a rule makes of a request: whether it applies (every part
 * of its key present, its `when` met), the value it keys on (one
 * attribute's, or a composite key's encoding) and the rate that applies (an
 * override's, or its own). Shared by the agent's checks and rlctl's
 * explanations, so both say the same. Private to rl.
 *
 * A composite key's value encodes each part as <length>:<bytes>, parts
 * joined by ':', e.g. api_key "ak:1" and route "/v1" make "4:ak:1:3:/v1":
 * no two lists of byte strings share an encoding. The part named by the
 * rule's hash_tag comes first, wrapped in braces ("{4:ak:1}:3:/v1" for
 * match [api_key, route] and hash_tag api_key; "{3:/v1}:4:ak:1" for
 * hash_tag route), so that its '{' is the key's first whatever bytes the
 * other parts hold, and on a Redis Cluster every key holding it lands on
 * one slot. (config.c refuses a '{' in such a rule's key_prefix.)
 */
#ifndef RL_COMMON_RULES_H
#define RL_COMMON_RULES_H

#include "config.h"
#include "rl.h"

#include <stdbool.h>
#include <stddef.h>

/* The attribute named name among attrs[0..n), or NULL. */
const rl_attr *rl_attr_find(const rl_attr *attrs, size_t n, const char *name);

/* Whether a request meets one condition / all of them. */
bool rl_when_clause_holds(const rl_when_clause *c, const rl_attr *attrs,
                          size_t n);
bool rl_when_holds(const rl_when *w, const rl_attr *attrs, size_t n);

/* rl_rule_value finds the value rule keys on in a request. *applies is
 * false (and RL_OK returned) when a part of the key is missing or the
 * rule's `when` does not hold. Otherwise *value and *len are the value: an
 * attribute's own bytes for a one-attribute rule, or the composite encoding
 * written into buf (cap bytes; RL_VALUE_MAX + 1 always suffice). Returns
 * RL_ETOOLONG for an attribute over max_value_bytes or an encoding over
 * RL_VALUE_MAX bytes, RL_EINVAL for an empty value or one holding a NUL. */
int rl_rule_value(const rl_rule *rule, const rl_attr *attrs, size_t n,
                  uint32_t max_value_bytes, char *buf, size_t cap,
                  const char **value, size_t *len, bool *applies);

/* rl_rule_override returns the override that sets the rate for a request
 * whose key value is value (len bytes): the first in order whose `when`
 * holds or whose values hold value, or NULL for the rule's own rate. One
 * hash lookup, however many values overrides the rule has. */
const rl_override *rl_rule_override(const rl_rule *rule, const rl_attr *attrs,
                                    size_t n, const char *value, size_t len);

/* The rate of an override, or of the rule when o is NULL. */
static inline const rl_limit *rl_rule_rate(const rl_rule *rule,
                                           const rl_override *o)
{
    return o != NULL ? &o->rate : &rule->own;
}

/* rl_override_label writes how messages, headers and rlctl name an
 * override: its `name`, else "overrides[I]" for an inline one, else
 * "FILE:LINE" for a line of overrides_file (FILE as written in the
 * config); "default" for NULL. Truncated with "..." to cap. */
void rl_override_label(const rl_rule *rule, const rl_override *o, char *buf,
                       size_t cap);

/* The overrides map (built by config.c, read by everyone). */
int rl_override_map_new(size_t n_values, rl_override_map **out);
/* Adds value -> o; RL_EINVAL if value is already mapped (*existing then
 * names its override). */
int rl_override_map_add(rl_override_map *m, const char *value, size_t len,
                        const rl_override *o, const rl_override **existing);
const rl_override *rl_override_map_find(const rl_override_map *m,
                                        const char *value, size_t len);
/* The same for a value whose rl_key_hash_value (keys.h) is value_hash: a
 * check hashes its value once for this map and the synced table. */
const rl_override *rl_override_map_find_hashed(const rl_override_map *m,
                                               const char *value, size_t len,
                                               uint64_t value_hash);
/* rl_override_map_each calls fn for every value the map holds (value, its
 * len bytes, its override), in no particular order, until fn returns
 * false. For what must list values: the reload diff (common/config_diff.c)
 * and rlctl. The map must not change meanwhile. */
void rl_override_map_each(const rl_override_map *m,
                          bool (*fn)(const char *value, size_t len,
                                     const rl_override *o, void *arg),
                          void *arg);
/* Bytes the map holds, for the docs' memory figures and rlctl. */
size_t rl_override_map_bytes(const rl_override_map *m);
void rl_override_map_free(rl_override_map *m);

#endif
