/*
 * rls_stat_key.h: the name envoyproxy/ratelimit counts a descriptor's hits
 * under, and the labels Prometheus sees it by. Upstream names a limit's
 * counters by its stats key ("domain.key_value.key": the descriptors'
 * keys from its config, the request's values where detailed_metric or
 * value_to_metric ask), made safe for statsd (':' and '|' as '_', an IPv4
 * address's dots as '_'), and its exporter's default mapper splits that
 * name at its dots: the first part is the label domain, the second key1,
 * the third (if any) key2, and the rest is dropped. Keys that differ only
 * past the third part are one series there, and one here.
 */
#ifndef RL_RLS_STAT_KEY_H
#define RL_RLS_STAT_KEY_H

#include "rls_config.h"

#include <stddef.h>

/* A label's bytes at most: a longer one is cut (at a character's edge),
 * so that a request's value never makes a label of megabytes. */
#define RLS_LABEL_MAX 256

/* The labels' text: "domain.key1" or "domain.key1.key2". */
#define RLS_STAT_LABELS_MAX (3 * RLS_LABEL_MAX + 3)

/* rls_stat_labels writes the labels of a descriptor's stats key into out
 * (RLS_STAT_LABELS_MAX bytes, not NUL-terminated) and returns their
 * length: m is the lookup that found its limit, NULL for a limit the
 * descriptor carries itself (then every entry is named by its value, as
 * upstream names it). Bytes that are not UTF-8 become '?' (Prometheus
 * takes only UTF-8). -1 without memory for a key of over 4 KiB. */
long rls_stat_labels(const char *domain, const rls_entry *entries, size_t n,
                     const rls_match *m, char *out);

#endif
