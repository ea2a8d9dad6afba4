/*
 * What a rule makes of a request (common/rules.c) and the values map
 * (common/overrides.c): composite values never collide, the hash-tag part
 * decides the cluster slot, `when` conditions mean what they say, the
 * first override in order wins, and 100,000 values are one lookup each.
 */
#include "config.h"
#include "keys.h"
#include "rl.h"
#include "rules.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static rl_config *parse(const char *yaml)
{
    rl_config *cfg = NULL;
    rl_error err;
    int rc = rl_config_parse(yaml, strlen(yaml), "<test>", &cfg, &err);
    cr_assert_eq(rc, RL_OK, "config refused: %s", err.message);
    return cfg;
}

#define ATTR(n, v) ((rl_attr){.name = (n), .value = (v), .value_len = strlen(v)})

/* The value rule keys on for attrs, as a C string ("" when it does not
 * apply); asserts RL_OK. */
static const char *value_of(const rl_rule *rule, const rl_attr *attrs,
                            size_t n, char *buf)
{
    const char *v = NULL;
    size_t len = 0;
    bool applies = true;
    int rc = rl_rule_value(rule, attrs, n, RL_VALUE_MAX, buf,
                           RL_VALUE_MAX + 1, &v, &len, &applies);
    cr_assert_eq(rc, RL_OK);
    if (!applies)
        return "";
    if (v != buf) {
        memcpy(buf, v, len);
        buf[len] = '\0';
    }
    cr_assert_eq(strlen(buf), len);
    return buf;
}

Test(rules, composite_encoding_is_unambiguous)
{
    rl_config *cfg = parse("rules:\n"
                           "  - {name: r, match: [a, b], limit: 1, "
                           "period: 1s}\n");
    const rl_rule *r = &cfg->rules[0];
    char one[RL_VALUE_MAX + 1], two[RL_VALUE_MAX + 1];
    rl_attr x[] = {ATTR("a", "a:b"), ATTR("b", "c")};
    rl_attr y[] = {ATTR("b", "b:c"), ATTR("a", "a")};
    cr_assert_str_eq(value_of(r, x, 2, one), "3:a:b:1:c");
    cr_assert_str_eq(value_of(r, y, 2, two), "1:a:3:b:c");
    cr_assert_str_neq(one, two);
    /* Digits in a value cannot pose as a length either. */
    rl_attr z[] = {ATTR("a", "1:a"), ATTR("b", "1")};
    rl_attr w[] = {ATTR("a", "1"), ATTR("b", "a:1")};
    cr_assert_str_neq(value_of(r, z, 2, one), value_of(r, w, 2, two));
    rl_config_free(cfg);
}

Test(rules, a_one_attribute_rule_keys_on_the_bytes_themselves)
{
    rl_config *cfg = parse("rules:\n"
                           "  - {name: r, match: ip, limit: 1, period: 1s}\n");
    char buf[RL_VALUE_MAX + 1];
    rl_attr a[] = {ATTR("api_key", "k"), ATTR("ip", "10.0.0.1")};
    cr_assert_str_eq(value_of(&cfg->rules[0], a, 2, buf), "10.0.0.1");
    cr_assert_str_eq(value_of(&cfg->rules[0], a, 1, buf), "");
    rl_config_free(cfg);
}

Test(rules, the_hash_tag_part_decides_the_slot)
{
    rl_config *cfg = parse("rules:\n"
                           "  - {name: r, match: [route, api_key], "
                           "hash_tag: api_key, limit: 1, period: 1s}\n");
    const rl_rule *r = &cfg->rules[0];
    cr_assert_str_eq(r->key_prefix, "rl:route_key:");
    char buf[RL_VALUE_MAX + 1], key1[RL_KEY_MAX], key2[RL_KEY_MAX];
    /* A '{' in the other part cannot steal the tag: the tagged part comes
     * first. */
    rl_attr a[] = {ATTR("route", "/v1/{x}"), ATTR("api_key", "ak_1")};
    rl_attr b[] = {ATTR("route", "/v2"), ATTR("api_key", "ak_1")};
    cr_assert_str_eq(value_of(r, a, 2, buf), "{4:ak_1}:7:/v1/{x}");
    size_t n1, n2;
    cr_assert_eq(rl_key_build(r->key_prefix, buf, strlen(buf), key1,
                              sizeof key1, &n1), RL_OK);
    value_of(r, b, 2, buf);
    cr_assert_eq(rl_key_build(r->key_prefix, buf, strlen(buf), key2,
                              sizeof key2, &n2), RL_OK);
    cr_assert_eq(rl_key_slot(key1, n1), rl_key_slot(key2, n2));
    cr_assert_eq(rl_key_slot(key1, n1), rl_key_slot("4:ak_1", 6));
    rl_config_free(cfg);
}

Test(rules, a_composite_value_is_bounded_and_checked)
{
    rl_config *cfg = parse("rules:\n"
                           "  - {name: r, match: [a, b], limit: 1, "
                           "period: 1s}\n");
    const rl_rule *r = &cfg->rules[0];
    char buf[RL_VALUE_MAX + 1], big[200];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    const char *v;
    size_t len;
    bool applies;
    rl_attr a[] = {ATTR("a", big), ATTR("b", big)};
    cr_assert_eq(rl_rule_value(r, a, 2, RL_VALUE_MAX, buf, sizeof buf, &v,
                               &len, &applies), RL_ETOOLONG);
    rl_attr e[] = {ATTR("a", ""), ATTR("b", "x")};
    cr_assert_eq(rl_rule_value(r, e, 2, RL_VALUE_MAX, buf, sizeof buf, &v,
                               &len, &applies), RL_EINVAL);
    rl_attr m[] = {ATTR("a", "x")};
    cr_assert_eq(rl_rule_value(r, m, 1, RL_VALUE_MAX, buf, sizeof buf, &v,
                               &len, &applies), RL_OK);
    cr_assert_not(applies);
    rl_attr s[] = {ATTR("a", "xyz"), ATTR("b", "x")};
    cr_assert_eq(rl_rule_value(r, s, 2, 2, buf, sizeof buf, &v, &len,
                               &applies), RL_ETOOLONG);
    rl_config_free(cfg);
}

Test(rules, when_equal_any_and_prefix)
{
    rl_config *cfg = parse("rules:\n"
                           "  - name: r\n"
                           "    match: ip\n"
                           "    limit: 1\n"
                           "    period: 1s\n"
                           "    when: {method: [POST, PUT], path: {prefix: "
                           "/v1/}, host: api}\n");
    const rl_rule *r = &cfg->rules[0];
    char buf[RL_VALUE_MAX + 1];
    rl_attr ok[] = {ATTR("ip", "1"), ATTR("method", "PUT"),
                    ATTR("path", "/v1/login"), ATTR("host", "api")};
    cr_assert_str_eq(value_of(r, ok, 4, buf), "1");
    rl_attr get[] = {ATTR("ip", "1"), ATTR("method", "GET"),
                     ATTR("path", "/v1/login"), ATTR("host", "api")};
    cr_assert_str_eq(value_of(r, get, 4, buf), "");
    rl_attr v2[] = {ATTR("ip", "1"), ATTR("method", "POST"),
                    ATTR("path", "/v2/login"), ATTR("host", "api")};
    cr_assert_str_eq(value_of(r, v2, 4, buf), "");
    rl_attr host[] = {ATTR("ip", "1"), ATTR("method", "POST"),
                      ATTR("path", "/v1/"), ATTR("host", "api2")};
    cr_assert_str_eq(value_of(r, host, 4, buf), "");
    rl_attr none[] = {ATTR("ip", "1"), ATTR("method", "POST"),
                      ATTR("host", "api")};
    cr_assert_str_eq(value_of(r, none, 3, buf), "");
    rl_config_free(cfg);
}

Test(rules, when_prefix_matches_the_start)
{
    rl_config *cfg = parse("rules:\n"
                           "  - {name: r, match: ip, limit: 1, period: 1s, "
                           "when: {path: {prefix: /v1/}}}\n");
    const rl_when_clause *c = &cfg->rules[0].when.clauses[0];
    rl_attr a[] = {ATTR("path", "/v1/users/7")};
    rl_attr b[] = {ATTR("path", "/v1/")};
    rl_attr d[] = {ATTR("path", "/v1")};
    rl_attr e[] = {ATTR("path", "/x/v1/")};
    cr_assert(rl_when_clause_holds(c, a, 1));
    cr_assert(rl_when_clause_holds(c, b, 1));
    cr_assert_not(rl_when_clause_holds(c, d, 1));
    cr_assert_not(rl_when_clause_holds(c, e, 1));
    rl_config_free(cfg);
}

Test(rules, first_matching_override_wins_by_order)
{
    rl_config *cfg = parse("rules:\n"
                           "  - name: r\n"
                           "    match: api_key\n"
                           "    limit: 1\n"
                           "    period: 1s\n"
                           "    overrides:\n"
                           "      - {when: {plan: gold}, limit: 10}\n"
                           "      - {values: [k1], limit: 20}\n"
                           "      - {when: {plan: silver}, limit: 30}\n");
    const rl_rule *r = &cfg->rules[0];
    rl_attr gold[] = {ATTR("api_key", "k1"), ATTR("plan", "gold")};
    rl_attr silver[] = {ATTR("api_key", "k1"), ATTR("plan", "silver")};
    rl_attr other[] = {ATTR("api_key", "k2"), ATTR("plan", "silver")};
    rl_attr plain[] = {ATTR("api_key", "k2")};
    const rl_override *o = rl_rule_override(r, gold, 2, "k1", 2);
    cr_assert_eq(rl_rule_rate(r, o)->limit, 10);
    o = rl_rule_override(r, silver, 2, "k1", 2);
    cr_assert_eq(rl_rule_rate(r, o)->limit, 20);
    o = rl_rule_override(r, other, 2, "k2", 2);
    cr_assert_eq(rl_rule_rate(r, o)->limit, 30);
    o = rl_rule_override(r, plain, 1, "k2", 2);
    cr_assert_null(o);
    cr_assert_eq(rl_rule_rate(r, o)->limit, 1);
    rl_config_free(cfg);
}

Test(rules, a_label_is_cut_with_dots)
{
    rl_config *cfg = parse("rules:\n"
                           "  - {name: r, match: api_key, limit: 1, "
                           "period: 1s, overrides: [{values: [k], limit: 2, "
                           "name: a-rather-long-override-name}]}\n");
    char buf[8];
    rl_override_label(&cfg->rules[0], &cfg->rules[0].overrides[0], buf,
                      sizeof buf);
    cr_assert_str_eq(buf, "a-ra...");
    rl_config_free(cfg);
}

Test(overrides, a_hundred_thousand_values_are_all_found_and_others_missed)
{
    enum { N = 100000 };
    static rl_override o[4];
    rl_override_map *m = NULL;
    cr_assert_eq(rl_override_map_new(N, &m), RL_OK);
    char v[32];
    for (int i = 0; i < N; i++) {
        int len = snprintf(v, sizeof v, "ak_%08d", i);
        cr_assert_eq(rl_override_map_add(m, v, (size_t)len, &o[i % 4], NULL),
                     RL_OK);
    }
    for (int i = 0; i < N; i++) {
        int len = snprintf(v, sizeof v, "ak_%08d", i);
        cr_assert_eq(rl_override_map_find(m, v, (size_t)len), &o[i % 4],
                     "%s", v);
        len = snprintf(v, sizeof v, "ak_%08d", i + N);
        cr_assert_null(rl_override_map_find(m, v, (size_t)len), "%s", v);
        /* A prefix of a mapped value is not mapped. */
        cr_assert_null(rl_override_map_find(m, v, (size_t)len - 1));
    }
    /* Slots, entries and bytes: well under 64 bytes a value. */
    size_t bytes = rl_override_map_bytes(m);
    cr_assert_lt(bytes, (size_t)N * 64, "%zu bytes", bytes);
    rl_override_map_free(m);
}

Test(overrides, a_value_is_mapped_once)
{
    rl_override a, b;
    const rl_override *was = NULL;
    rl_override_map *m = NULL;
    cr_assert_eq(rl_override_map_new(1, &m), RL_OK);
    cr_assert_eq(rl_override_map_add(m, "k", 1, &a, &was), RL_OK);
    cr_assert_null(was);
    /* Past the size it was made for: it grows. */
    for (int i = 0; i < 100; i++) {
        char v[8];
        int len = snprintf(v, sizeof v, "v%d", i);
        cr_assert_eq(rl_override_map_add(m, v, (size_t)len, &b, NULL), RL_OK);
    }
    cr_assert_eq(rl_override_map_add(m, "k", 1, &b, &was), RL_EINVAL);
    cr_assert_eq(was, &a);
    cr_assert_eq(rl_override_map_find(m, "k", 1), &a);
    cr_assert_eq(rl_override_map_find(m, "v99", 3), &b);
    cr_assert_null(rl_override_map_find(NULL, "k", 1));
    rl_override_map_free(m);
    rl_override_map_free(NULL);
}
