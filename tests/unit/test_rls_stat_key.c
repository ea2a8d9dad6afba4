/*
 * The labels of upstream's stats key: the key built by upstream's rules
 * (config keys; request values under detailed_metric, value_to_metric, a
 * descriptor's own limit; share_threshold patterns), made safe as its
 * SanitizeStatName makes it, and cut at its mapper's third part.
 */
#include "rls_config.h"
#include "rls_stat_key.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const char yaml[] =
    "domain: d\n"
    "descriptors:\n"
    "  - key: ip\n"
    "    detailed_metric: true\n"
    "    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    "  - key: k\n"
    "    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    "  - key: a\n"
    "    descriptors:\n"
    "      - key: b\n"
    "        descriptors:\n"
    "          - key: c\n"
    "            rate_limit: {unit: hour, requests_per_unit: 1}\n"
    "  - key: f\n"
    "    value: files*\n"
    "    share_threshold: true\n"
    "    detailed_metric: true\n"
    "    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    "  - key: w\n"
    "    value: x*\n"
    "    value_to_metric: true\n"
    "    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/* The labels of entries (key, value, key, value, ..., NULL) in domain d,
 * looked up (own: as a descriptor's own limit). */
static const char *labels_of(bool own, const char *key, ...)
{
    static char out[RLS_STAT_LABELS_MAX + 1];
    char err[256];
    rls_config *c = rls_config_new(false, false);
    cr_assert_eq(rls_config_add(c, "config.t.yaml", yaml, strlen(yaml), err,
                                sizeof err), 0, "%s", err);
    rls_entry e[8];
    size_t n = 0;
    va_list ap;
    va_start(ap, key);
    for (const char *k = key; k != NULL && n < 8; k = va_arg(ap, const char *)) {
        const char *v = va_arg(ap, const char *);
        e[n++] = (rls_entry){k, strlen(k), v, strlen(v)};
    }
    va_end(ap);
    rls_match m;
    rls_config_lookup(rls_config_domain(c, "d", 1), e, n, &m);
    cr_assert(own || m.limit != NULL, "no limit for %s", key);
    long len = rls_stat_labels("d", e, n, own ? NULL : &m, out);
    cr_assert_geq(len, 0);
    out[len] = '\0';
    rls_config_free(c);
    return out;
}

Test(rls_stat_key, config_keys_unless_the_config_asks_for_values)
{
    cr_assert_str_eq(labels_of(false, "k", "v", NULL), "d.k");
    cr_assert_str_eq(labels_of(false, "ip", "v", NULL), "d.ip_v");
    cr_assert_str_eq(labels_of(false, "ip", "", NULL), "d.ip_");
    cr_assert_str_eq(labels_of(true, "k", "", NULL), "d.k");
    cr_assert_str_eq(labels_of(true, "k", "v", NULL), "d.k_v");
    /* A wildcard: its pattern, or the value where value_to_metric. */
    cr_assert_str_eq(labels_of(false, "w", "x1", NULL), "d.w_x1");
    cr_assert_str_eq(labels_of(false, "f", "files9", NULL), "d.f_files*");
}

Test(rls_stat_key, the_third_part_is_the_last_label)
{
    cr_assert_str_eq(labels_of(false, "a", "1", "b", "2", "c", "3", NULL),
                     "d.a.b");
    cr_assert_str_eq(labels_of(true, "a", "1", "b", "2", "c", "3", NULL),
                     "d.a_1.b_2");
}

Test(rls_stat_key, made_safe_as_upstreams_statsd_names)
{
    cr_assert_str_eq(labels_of(false, "ip", "10.0.0.1:80|x", NULL),
                     "d.ip_10_0_0_1_80_x");
    /* The leftmost address, its last part as long as it goes. */
    cr_assert_str_eq(labels_of(false, "ip", "1.2.3.4.5", NULL),
                     "d.ip_1_2_3_4.5");
    cr_assert_str_eq(labels_of(false, "ip", "1234.5.6.7", NULL),
                     "d.ip_1234_5_6_7");
    cr_assert_str_eq(labels_of(false, "ip", "1.2.3", NULL), "d.ip_1.2");
}

Test(rls_stat_key, labels_are_utf8_and_cut_at_256_bytes)
{
    cr_assert_str_eq(labels_of(false, "ip", "a\xff\xc3xb", NULL),
                     "d.ip_a?" "?xb");
    char v[600];
    memset(v, 'x', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    /* "ip_" and 252 x, then a character of two bytes that does not fit. */
    memcpy(v + 252, "\xc3\xa9", 2);
    const char *l = labels_of(false, "ip", v, NULL);
    cr_assert_eq(strlen(l), 2 + 255, "%zu", strlen(l));
    cr_assert_eq(l[strlen(l) - 1], 'x');
}
