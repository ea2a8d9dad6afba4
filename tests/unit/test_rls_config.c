/*
 * rl-rls's reading of envoyproxy/ratelimit's config: the files upstream's
 * README describes, written here, loaded and looked up as upstream does;
 * every fault upstream refuses, refused with upstream's message.
 */
#include "rls_config.h"
#include "rls_store.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Loaded as rl-rls with an aggregator loads it (mode: synced served). */
static rls_config *load(const char *yaml)
{
    rls_config *c = rls_config_new(false, true);
    char err[512] = "";
    cr_assert_eq(rls_config_add(c, "config.test.yaml", yaml, strlen(yaml),
                                err, sizeof err),
                 0, "%s", err);
    return c;
}

/* The message a file is refused with. */
static const char *refused(const char *yaml, bool merge, const char *first)
{
    static char err[512];
    rls_config *c = rls_config_new(merge, true);
    err[0] = '\0';
    if (first != NULL)
        cr_assert_eq(rls_config_add(c, "config.first.yaml", first,
                                    strlen(first), err, sizeof err),
                     0, "%s", err);
    cr_assert_neq(rls_config_add(c, "config.test.yaml", yaml, strlen(yaml),
                                 err, sizeof err),
                  0, "accepted: %s", yaml);
    rls_config_free(c);
    return err;
}

/* The limit a request's entries ("k=v" or "k" for an empty value) find. */
static const rls_limit *lookup(const rls_config *c, const char *domain,
                               rls_match *m, int n, ...)
{
    rls_entry e[8];
    char buf[8][64];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        snprintf(buf[i], sizeof buf[i], "%s", va_arg(ap, const char *));
        char *eq = strchr(buf[i], '=');
        *eq = '\0';
        e[i] = (rls_entry){buf[i], strlen(buf[i]), eq + 1, strlen(eq + 1)};
    }
    va_end(ap);
    rls_config_lookup(rls_config_domain(c, domain, strlen(domain)), e,
                      (size_t)n, m);
    return m->limit;
}

static const char *const nested =
    "domain: mongo_cps\n"
    "descriptors:\n"
    "  - key: database\n"
    "    value: users\n"
    "    rate_limit:\n"
    "      unit: second\n"
    "      requests_per_unit: 500\n"
    "  - key: database\n"
    "    rate_limit:\n"
    "      unit: Minute\n"
    "      requests_per_unit: 20\n"
    "      name: per-database\n"
    "  - key: remote_address\n"
    "    descriptors:\n"
    "      - key: path\n"
    "        value: /login\n"
    "        rate_limit: {unit: HOUR, requests_per_unit: 10}\n"
    "  - key: source_cluster\n"
    "    value: proxy\n"
    "    rate_limit: {unit: day, requests_per_unit: 7}\n"
    "    descriptors:\n"
    "      - key: destination_cluster\n"
    "        rate_limit: {unit: week, requests_per_unit: 3}\n";

Test(rls_config, a_value_then_the_bare_key_and_only_at_the_last_level)
{
    rls_config *c = load(nested);
    rls_match m;
    const rls_limit *l = lookup(c, "mongo_cps", &m, 1, "database=users");
    cr_assert_not_null(l);
    cr_expect_eq(l->requests_per_unit, 500);
    cr_expect_eq(l->unit, RLS_UNIT_SECOND);
    cr_expect_str_eq(l->full_key, "mongo_cps.database_users");
    /* Any other value: the bare key's default, per value. */
    l = lookup(c, "mongo_cps", &m, 1, "database=orders");
    cr_assert_not_null(l);
    cr_expect_eq(l->requests_per_unit, 20);
    cr_expect_eq(l->unit, RLS_UNIT_MINUTE);
    cr_expect_str_eq(l->name, "per-database");
    cr_expect_str_eq(l->full_key, "mongo_cps.database");
    /* Two levels; a request one level short or one too deep: none. */
    l = lookup(c, "mongo_cps", &m, 2, "remote_address=10.0.0.1",
               "path=/login");
    cr_assert_not_null(l);
    cr_expect_eq(l->requests_per_unit, 10);
    cr_expect_str_eq(l->full_key, "mongo_cps.remote_address.path_/login");
    cr_expect_null(lookup(c, "mongo_cps", &m, 1, "remote_address=10.0.0.1"));
    cr_expect_null(lookup(c, "mongo_cps", &m, 3, "remote_address=10.0.0.1",
                          "path=/login", "x=y"));
    cr_expect_null(lookup(c, "mongo_cps", &m, 2, "remote_address=1",
                          "path=/other"));
    /* A limit at an upper level is not inherited by a deeper request. */
    l = lookup(c, "mongo_cps", &m, 1, "source_cluster=proxy");
    cr_expect_eq(l->requests_per_unit, 7);
    l = lookup(c, "mongo_cps", &m, 2, "source_cluster=proxy",
               "destination_cluster=db");
    cr_expect_eq(l->requests_per_unit, 3);
    cr_expect_eq(l->unit, RLS_UNIT_WEEK);
    cr_expect_null(lookup(c, "mongo_cps", &m, 2, "source_cluster=proxy",
                          "other=db"));
    /* An unknown domain: no limit, no error. */
    cr_expect_null(rls_config_domain(c, "nope", 4));
    cr_expect_null(lookup(c, "nope", &m, 1, "database=users"));
    /* The first level must match: a request starting elsewhere finds
     * nothing below. */
    cr_expect_null(lookup(c, "mongo_cps", &m, 2, "path=/login",
                          "remote_address=1"));
    rls_config_free(c);
}

Test(rls_config, wildcards_in_order_after_the_exact_value)
{
    rls_config *c = load(
        "domain: api\n"
        "descriptors:\n"
        "  - key: path\n"
        "    value: /v1/exact\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n"
        "  - key: path\n"
        "    value: /v1/*\n"
        "    rate_limit: {unit: second, requests_per_unit: 2}\n"
        "  - key: path\n"
        "    value: /v*\n"
        "    rate_limit: {unit: second, requests_per_unit: 3}\n"
        "    share_threshold: true\n"
        "  - key: path\n"
        "    value: /a/*/b*c\n"
        "    rate_limit: {unit: second, requests_per_unit: 4}\n"
        "  - key: path\n"
        "    rate_limit: {unit: second, requests_per_unit: 5}\n");
    rls_match m;
    cr_expect_eq(lookup(c, "api", &m, 1, "path=/v1/exact")
                     ->requests_per_unit, 1);
    /* The first wildcard that matches, in the file's order. */
    cr_expect_eq(lookup(c, "api", &m, 1, "path=/v1/other")
                     ->requests_per_unit, 2);
    cr_expect_null(m.shared[0]);
    cr_expect_eq(lookup(c, "api", &m, 1, "path=/v2")->requests_per_unit, 3);
    /* share_threshold: every value the pattern matches, one counter. */
    cr_expect_str_eq(m.shared[0], "/v*");
    /* Pieces between stars, in order, none overlapping; a star may be
     * empty. */
    cr_expect_eq(lookup(c, "api", &m, 1, "path=/a/x/bzc")
                     ->requests_per_unit, 4);
    cr_expect_eq(lookup(c, "api", &m, 1, "path=/a//bc")->requests_per_unit,
                 4);
    cr_expect_eq(lookup(c, "api", &m, 1, "path=/a/x/cb")->requests_per_unit,
                 5);
    cr_expect_eq(lookup(c, "api", &m, 1, "path=/a/bc")->requests_per_unit, 5);
    cr_expect_eq(lookup(c, "api", &m, 1, "path=/z")->requests_per_unit, 5);
    rls_config_free(c);
}

Test(rls_config, unlimited_zero_replaces_and_flags)
{
    rls_config *c = load(
        "domain: d\n"
        "descriptors:\n"
        "  - key: a\n"
        "    rate_limit: {unlimited: true}\n"
        "  - key: b\n"
        "    shadow_mode: true\n"
        "    detailed_metric: yes\n"
        "    rate_limit:\n"
        "      unit: year\n"
        "      requests_per_unit: 0\n"
        "      name: blocked\n"
        "      replaces: [{name: per-a}, {name: per-c}]\n"
        "  - key: c\n");
    rls_match m;
    const rls_limit *a = lookup(c, "d", &m, 1, "a=x");
    cr_expect(a->unlimited);
    cr_expect_eq(a->unit, RLS_UNIT_UNKNOWN);
    const rls_limit *b = lookup(c, "d", &m, 1, "b=x");
    cr_expect_eq(b->requests_per_unit, 0);
    cr_expect_eq(b->unit, RLS_UNIT_YEAR);
    cr_expect(b->shadow_mode && b->detailed_metric && !b->quota_mode);
    cr_assert_eq(b->n_replaces, 2);
    cr_expect_str_eq(b->replaces[0], "per-a");
    cr_expect_str_eq(b->replaces[1], "per-c");
    /* A descriptor without a limit or children: a match, no limit. */
    cr_expect_null(lookup(c, "d", &m, 1, "c=x"));
    rls_config_free(c);
}

Test(rls_config, units_as_upstream_counts_them)
{
    static const struct {
        const char *name;
        rls_unit unit;
        uint64_t seconds;
    } units[] = {
        {"second", RLS_UNIT_SECOND, 1},     {"MINUTE", RLS_UNIT_MINUTE, 60},
        {"Hour", RLS_UNIT_HOUR, 3600},      {"day", RLS_UNIT_DAY, 86400},
        {"week", RLS_UNIT_WEEK, 604800},    {"month", RLS_UNIT_MONTH, 2592000},
        {"year", RLS_UNIT_YEAR, 31536000},
    };
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        char yaml[200];
        snprintf(yaml, sizeof yaml, "domain: u\ndescriptors:\n  - key: k\n"
                 "    rate_limit: {unit: %s, requests_per_unit: 1}\n",
                 units[i].name);
        rls_config *c = load(yaml);
        rls_match m;
        const rls_limit *l = lookup(c, "u", &m, 1, "k=v");
        cr_expect_eq(l->unit, units[i].unit, "%s", units[i].name);
        cr_expect_eq(rls_unit_seconds(l->unit), units[i].seconds, "%s",
                     units[i].name);
        rls_config_free(c);
    }
}

Test(rls_config, every_fault_upstream_refuses_with_its_message)
{
    static const struct {
        const char *yaml, *message;
    } faults[] = {
        {"domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n",
         "config.test.yaml: config error, unknown key 'ratelimit'"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      requestsperunit: 5\n",
         "config.test.yaml: config error, unknown key 'requestsperunit'"},
        {"domain: d\ndescriptors:\n  - key: k\n    0.25: x\n",
         "config.test.yaml: config error, key is not of type string: 0.25"},
        {"domain: d\ndescriptors:\n  - a\n",
         "config.test.yaml: config error, yaml file contains list of type "
         "other than map: a"},
        {"domain: d\ndescriptors:\n  - key: k\n    value: 0.5\n",
         "config.test.yaml: error checking config"},
        {"descriptors:\n  - key: k\n",
         "config.test.yaml: config file cannot have empty domain"},
        {"", "config.test.yaml: config file cannot have empty domain"},
        {"domain: d\ndescriptors:\n  - value: v\n",
         "config.test.yaml: descriptor has empty key"},
        {"domain: d\ndescriptors:\n  - key: k\n    value: v\n"
         "  - key: k\n    value: v\n",
         "config.test.yaml: duplicate descriptor composite key 'd.k_v'"},
        {"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n"
         "      - key: s\n      - key: s\n",
         "config.test.yaml: duplicate descriptor composite key 'd.k.s'"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      unit: foo\n      requests_per_unit: 5\n",
         "config.test.yaml: invalid rate limit unit 'foo'"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      requests_per_unit: 5\n",
         "config.test.yaml: invalid rate limit unit ''"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      unit: unknown\n",
         "config.test.yaml: invalid rate limit unit 'unknown'"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      unlimited: true\n      unit: second\n",
         "config.test.yaml: should not specify rate limit unit when "
         "unlimited"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      unit: second\n      name: n\n      replaces: [{name: \"\"}]\n",
         "config.test.yaml: should not have an empty replaces entry"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      unit: second\n      name: n\n      replaces: [{name: n}]\n",
         "config.test.yaml: replaces should not contain name of same "
         "descriptor"},
        {"domain: d\ndescriptors:\n  - key: k\n    value: v\n"
         "    share_threshold: true\n",
         "config.test.yaml: share_threshold can only be used with wildcard "
         "values (containing '*'), but found key 'k_v'"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      unit: second\n      requests_per_unit: abc\n",
         "config.test.yaml: error loading config file: yaml: unmarshal "
         "errors:\n  line 6: cannot unmarshal !!str `abc` into uint32"},
        {"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
         "      unit: second\n      requests_per_unit: -1\n",
         "config.test.yaml: error loading config file: yaml: unmarshal "
         "errors:\n  line 6: cannot unmarshal !!int `-1` into uint32"},
        {"domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
         "config.test.yaml: error loading config file: yaml: unmarshal "
         "errors:\n  line 4: cannot unmarshal !!str `maybe` into bool"},
        {"domain: d\ndescriptors: [\n",
         "config.test.yaml: error loading config file: yaml: line 3: did "
         "not find expected node content"},
    };
    for (size_t i = 0; i < sizeof faults / sizeof *faults; i++) {
        const char *got = refused(faults[i].yaml, false, NULL);
        cr_expect(strcmp(got, faults[i].message) == 0,
                  "fault %zu: '%s', not '%s'", i, got, faults[i].message);
    }
}

Test(rls_config, a_domain_in_two_files_is_refused_unless_merged)
{
    const char *first = "domain: d\ndescriptors:\n  - key: a\n"
                        "    rate_limit: {unit: second, requests_per_unit: 1}\n";
    const char *second = "domain: d\ndescriptors:\n  - key: b\n"
                         "    rate_limit: {unit: second, "
                         "requests_per_unit: 2}\n";
    cr_expect_str_eq(refused(second, false, first),
                     "config.test.yaml: duplicate domain 'd' in config file");
    /* Merged, a top-level key the first file has is still a duplicate. */
    cr_expect_str_eq(refused(first, true, first),
                     "config.test.yaml: duplicate descriptor composite key "
                     "'d.a'");
    rls_config *c = rls_config_new(true, false);
    char err[256];
    cr_assert_eq(rls_config_add(c, "config.1.yaml", first, strlen(first), err,
                                sizeof err), 0, "%s", err);
    cr_assert_eq(rls_config_add(c, "config.2.yaml", second, strlen(second),
                                err, sizeof err), 0, "%s", err);
    rls_match m;
    cr_expect_eq(lookup(c, "d", &m, 1, "a=x")->requests_per_unit, 1);
    cr_expect_eq(lookup(c, "d", &m, 1, "b=x")->requests_per_unit, 2);
    rls_config_free(c);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(rls_config, the_runtime_layout_names_each_file_by_its_key)
{
    char dir[] = "/tmp/rls-config-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char sub[600];
    snprintf(sub, sizeof sub, "%s/team", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    write_file(dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n"
               "    rate_limit: {unit: second, requests_per_unit: 1}\n");
    write_file(sub, "b.yaml", "domain: b\ndescriptors:\n  - key: k\n"
               "    rate_limit: {unit: minute, requests_per_unit: 2}\n");
    write_file(dir, ".hidden.yaml", "domain: b\n");
    rls_config *c;
    char err[512] = "";
    /* Dotfiles read, as upstream's default: the second domain b. */
    cr_expect_neq(rls_config_load_dir(dir, "config.", false, false, false,
                                      &c, err, sizeof err), 0);
    cr_expect_str_eq(err, "config.team.b.yaml: duplicate domain 'b' in "
                     "config file");
    /* RUNTIME_IGNOREDOTFILES. */
    cr_assert_eq(rls_config_load_dir(dir, "config.", true, false, false,
                                     &c, err, sizeof err), 0, "%s", err);
    rls_match m;
    cr_expect_eq(lookup(c, "b", &m, 1, "k=v")->requests_per_unit, 2);
    char *dump = rls_config_dump(c);
    cr_expect_str_eq(dump, "a.k: unit=SECOND requests_per_unit=1, "
                     "shadow_mode: false, quota_mode: false\n"
                     "b.k: unit=MINUTE requests_per_unit=2, "
                     "shadow_mode: false, quota_mode: false\n");
    free(dump);
    rls_config_free(c);
    write_file(sub, "b.yaml", "domain: b\ndescriptors:\n  - key: k\n"
               "    rate_limit: {unit: fortnight}\n");
    cr_expect_neq(rls_config_load_dir(dir, "", true, false, false, &c,
                                      err, sizeof err), 0);
    cr_expect_str_eq(err, "team.b.yaml: invalid rate limit unit 'fortnight'");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(rls_config, a_level_of_many_values_loads_and_finds_each)
{
    enum { N = 20000 };
    size_t cap = 64 + (size_t)N * 96;
    char *yaml = malloc(cap);
    size_t len = (size_t)snprintf(yaml, cap, "domain: many\ndescriptors:\n");
    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(yaml + len, cap - len,
                                "  - key: tenant\n    value: t%d\n"
                                "    rate_limit: {unit: second, "
                                "requests_per_unit: %d}\n", i, i + 1);
    rls_config *c = load(yaml);
    rls_match m;
    cr_expect_eq(lookup(c, "many", &m, 1, "tenant=t0")->requests_per_unit, 1);
    cr_expect_eq(lookup(c, "many", &m, 1, "tenant=t12345")->requests_per_unit,
                 12346);
    cr_expect_null(lookup(c, "many", &m, 1, "tenant=t20000"));
    /* A duplicate far down is still found. */
    len += (size_t)snprintf(yaml + len, cap - len,
                            "  - key: tenant\n    value: t7\n");
    cr_expect_str_eq(refused(yaml, false, NULL),
                     "config.test.yaml: duplicate descriptor composite key "
                     "'many.tenant_t7'");
    rls_config_free(c);
    free(yaml);
}

/* rl's extension of a descriptor: how its limit is counted. */
Test(rls_config, rls_extension_counts_a_limit_rls_way)
{
    rls_config *c = load("domain: d\ndescriptors:\n  - key: k\n"
                         "    rate_limit: {unit: hour, requests_per_unit: 2}\n"
                         "    rl: {algorithm: token_bucket, burst: 4, "
                         "on_error: deny}\n  - key: j\n"
                         "    rate_limit: {unit: hour, requests_per_unit: 2}\n");
    rls_entry k = {"k", 1, "v", 1}, j = {"j", 1, "v", 1};
    rls_match m = {0};
    const rls_domain *d = rls_config_domain(c, "d", 1);
    rls_config_lookup(d, &k, 1, &m);
    cr_assert(m.limit->token_bucket);
    cr_assert_eq(m.limit->burst, 4);
    cr_assert(m.limit->deny_on_error);
    rls_config_lookup(d, &j, 1, &m);
    cr_assert(!m.limit->token_bucket && !m.limit->deny_on_error);
    cr_assert(!m.limit->local);
    rls_config_free(c);
    static const struct {
        const char *ext, *message;
    } faults[] = {
        {"{algorithm: leaky}", "config.test.yaml: rl: unknown algorithm "
                               "'leaky' (fixed_window or token_bucket)"},
        {"{mode: fast}", "config.test.yaml: rl: unknown mode 'fast' "
                         "(exact, local, synced or leased)"},
        {"{mode: synced, algorithm: fixed_window}",
         "config.test.yaml: rl: mode: synced counts the limit over any span "
         "of the unit (rl-aggregator's sliding windows), neither a fixed "
         "window nor a token bucket: leave algorithm out"},
        {"{mode: synced, algorithm: token_bucket}",
         "config.test.yaml: rl: mode: synced counts the limit over any span "
         "of the unit (rl-aggregator's sliding windows), neither a fixed "
         "window nor a token bucket: leave algorithm out"},
        {"{mode: synced, burst: 5}",
         "config.test.yaml: rl: mode: synced has no burst (it admits "
         "requests_per_unit over any span of the unit): leave burst out"},
        {"{mode: synced, on_error: later}",
         "config.test.yaml: rl: unknown on_error 'later' (local, allow or "
         "deny)"},
        {"{mode: leased, algorithm: fixed_window}",
         "config.test.yaml: rl: mode: leased spends a token bucket's tokens "
         "in leases, and a fixed window's count cannot be leased: leave "
         "algorithm out (or token_bucket)"},
        {"{mode: leased, on_error: local}",
         "config.test.yaml: rl: unknown on_error 'local' (allow or deny)"},
        {"{mode: leased, burst: 1}",
         "config.test.yaml: rl: burst 1 is below requests_per_unit 2"},
        {"{mode: local, on_error: deny}",
         "config.test.yaml: rl: on_error has no effect with mode: local "
         "(each instance counts alone, with no store to wait for)"},
        {"{on_error: local}", "config.test.yaml: rl: unknown on_error "
                              "'local' (allow or deny)"},
        {"{burst: 9}", "config.test.yaml: rl: burst is a token bucket's: "
                       "give algorithm: token_bucket, or leave burst out"},
        {"{algorithm: token_bucket, burst: 1}",
         "config.test.yaml: rl: burst 1 is below requests_per_unit 2"},
    };
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        char yaml[256];
        snprintf(yaml, sizeof yaml, "domain: d\ndescriptors:\n  - key: k\n"
                 "    rate_limit: {unit: hour, requests_per_unit: 2}\n"
                 "    rl: %s\n", faults[i].ext);
        cr_assert_str_eq(refused(yaml, false, NULL), faults[i].message);
    }
}

/* mode: synced and leased, and which of rl-rls's rules counts each: a
 * synced limit by its unit's rule and on_error (local by default), a
 * leased one as a token bucket (its burst allowed). */
Test(rls_config, rls_extension_synced_and_leased)
{
    rls_config *c = load("domain: d\ndescriptors:\n"
                         "  - key: s\n"
                         "    rate_limit: {unit: minute, requests_per_unit: 9}\n"
                         "    rl: {mode: synced}\n"
                         "  - key: sd\n"
                         "    rate_limit: {unit: year, requests_per_unit: 9}\n"
                         "    rl: {mode: synced, on_error: deny}\n"
                         "  - key: sa\n"
                         "    rate_limit: {unit: week, requests_per_unit: 9}\n"
                         "    rl: {mode: synced, on_error: allow}\n"
                         "  - key: l\n"
                         "    rate_limit: {unit: hour, requests_per_unit: 9}\n"
                         "    rl: {mode: leased, burst: 12}\n"
                         "  - key: ld\n"
                         "    rate_limit: {unit: hour, requests_per_unit: 9}\n"
                         "    rl: {mode: leased, on_error: deny, "
                         "algorithm: token_bucket}\n");
    const rls_domain *d = rls_config_domain(c, "d", 1);
    static const struct {
        const char *key, *rule;
    } want[] = {{"s", "rls-synced-minute"},
                {"sd", "rls-synced-year-deny"},
                {"sa", "rls-synced-week-allow"},
                {"l", "rls-leased"},
                {"ld", "rls-leased-deny"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        rls_entry e = {want[i].key, strlen(want[i].key), "v", 1};
        rls_match m = {0};
        rls_config_lookup(d, &e, 1, &m);
        cr_assert_not_null(m.limit, "%s", want[i].key);
        cr_assert_str_eq(rls_rule_of(m.limit), want[i].rule, "%s",
                         want[i].key);
    }
    rls_entry l = {"l", 1, "v", 1};
    rls_match m = {0};
    rls_config_lookup(d, &l, 1, &m);
    cr_assert(m.limit->token_bucket);
    cr_assert_eq(m.limit->burst, 12);
    rls_config_free(c);
}

/* Without an aggregator (rl-rls has none in --config), a synced limit
 * cannot be counted: refused, saying what to add. */
Test(rls_config, rls_extension_synced_without_an_aggregator_is_refused)
{
    static const char yaml[] = "domain: d\ndescriptors:\n  - key: s\n"
                               "    rate_limit: {unit: second, "
                               "requests_per_unit: 9}\n"
                               "    rl: {mode: synced}\n";
    rls_config *c = rls_config_new(false, false);
    char err[512] = "";
    cr_assert_neq(rls_config_add(c, "config.test.yaml", yaml, strlen(yaml),
                                 err, sizeof err), 0);
    cr_assert_str_eq(err, "config.test.yaml: rl: mode: synced counts "
                     "through rl-aggregator, and rl-rls has none: give "
                     "rl-rls --config a file with an aggregator: (or "
                     "aggregators:) section, and start rl-aggregator on "
                     "what rl-rls --config FILE --print-rl-config prints "
                     "(docs/envoy.md, Synced descriptors)");
    rls_config_free(c);
}
