/*
 * config_loader.h: what config.c and config_rules.c share while they turn
 * libcyaml's strings and the YAML document into a validated rl_config:
 * where they are, and how they say what is wrong (file:line:column, the
 * field's path, the rule). Private to librl.
 */
#ifndef RL_COMMON_CONFIG_LOADER_H
#define RL_COMMON_CONFIG_LOADER_H

#include "config.h"
#include "config_yaml.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

/* Where validation is: the text and its YAML document (for the fields
 * libcyaml cannot read, and to find lines in), its name for messages, the
 * directory the files it names are relative to ("" for the working
 * directory), and the rule being checked, if any, so that messages can
 * name it. */
struct loader {
    const char *yaml;
    size_t len;
    const char *name;
    const char *dir;
    const char *rule;
    yaml_document_t doc;
    bool have_doc;
    rl_error *err;
};

/* rl_config_vbad sets err to "NAME:LINE:COLUMN: PATH (rule "R"): what"
 * and returns RL_ECONFIG. The position is node's, else that of the node at
 * the dotted path (its key with at_key); left out when neither is found. */
int rl_config_vbad(struct loader *ld, const yaml_node_t *node,
                   const char *path, bool at_key, const char *fmt,
                   va_list ap);

/* A problem with the value at path. */
__attribute__((format(printf, 3, 4)))
static inline int bad(struct loader *ld, const char *path, const char *fmt,
                      ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = rl_config_vbad(ld, NULL, path, false, fmt, ap);
    va_end(ap);
    return rc;
}

/* A problem with the key of path's last step (an attribute name). */
__attribute__((format(printf, 3, 4)))
static inline int bad_key(struct loader *ld, const char *path,
                          const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = rl_config_vbad(ld, NULL, path, true, fmt, ap);
    va_end(ap);
    return rc;
}

/* A problem with a node in hand; path is only shown. */
__attribute__((format(printf, 4, 5)))
static inline int bad_node(struct loader *ld, const yaml_node_t *node,
                           const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = rl_config_vbad(ld, node, path, false, fmt, ap);
    va_end(ap);
    return rc;
}

int rl_config_oom(struct loader *ld);

/* Whether url is one nng can listen on or dial (tcp://, tls+tcp://...). */
bool rl_config_nng_url(const char *url);

/* config_regions.c: `region` and `regions`, after the aggregators (a
 * region's peers are one per aggregator) and before the rules (scope). */
int rl_config_load_regions(struct loader *ld, const rl_raw_config *raw,
                           rl_config *cfg);

/* rl_config_parse_u64 reads a decimal integer from min to max (digits
 * only); on a bad number writes why and returns false. */
bool rl_config_parse_u64(const char *text, uint64_t min, uint64_t max,
                         uint64_t *out, char *why, size_t cap);
int rl_config_parse_int(struct loader *ld, const char *path,
                        const char *text, uint64_t min, uint64_t max,
                        uint64_t *out);
/* true or false; NULL text leaves *out. */
int rl_config_parse_bool(struct loader *ld, const char *path,
                         const char *text, bool *out);
/* Whether burst x period_ms stays below 2^53 (the scripts' exact range);
 * if not, writes why. */
bool rl_config_rate_countable(const rl_limit *rate, char *why, size_t cap);
/* Letters, digits and the characters of extra; not empty. */
bool rl_config_plain_name(const char *s, const char *extra);

/* config_rules.c: the rule fields beyond one attribute and one rate. */

/* Reads rules[i].match (a string or a list) into rule's parts, and its
 * hash_tag. */
int rl_config_load_match(struct loader *ld, size_t i, const rl_raw_rule *raw,
                         rl_rule *rule);
/* Reads rules[i].when, overrides and overrides_file into rule. */
int rl_config_load_overrides(struct loader *ld, size_t i,
                             const rl_raw_rule *raw, const rl_config *cfg,
                             rl_rule *rule);
/* Every attribute a `when` names must be known (see config.h). */
int rl_config_check_attributes(struct loader *ld, const rl_config *cfg);
/* Frees what the loaders above allocated in rule. */
void rl_config_rule_fini(rl_rule *rule);

#endif
