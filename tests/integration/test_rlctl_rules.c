/*
 * rlctl and issue 15's rules: check naming the override and the `when`
 * clauses that held or not, config listing overrides and shadow rules, and
 * config --diff with its exit codes (0 no change, 5 changes, 3 invalid),
 * each output compared whole.
 */
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes dir/name under the test's folder; returns its path (static). */
static const char *write_file(const char *dir, const char *name,
                              const char *text)
{
    static char path[8][600];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 600, "%s/rlctl-rules-%d-%s", test_env("RL_TEST_TMPDIR"),
             (int)getpid(), dir);
    mkdir(p, 0755);
    strcat(p, "/");
    strcat(p, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static const char *with_store(const char *dir, const char *rules)
{
    char yaml[4096];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 2000}\n%s",
             test_env("RL_TEST_REDIS"), rules);
    return write_file(dir, "rl.yaml", yaml);
}

static const char rules_a[] =
    "rules:\n"
    "  - name: per-key\n    match: api_key\n    limit: 100\n    period: 1h\n"
    "    overrides:\n"
    "      - {when: {plan: enterprise}, limit: 1000, name: premium}\n"
    "    overrides_file: partners.tsv\n"
    "  - {name: old, match: user, limit: 1, period: 1s}\n";
static const char partners_a[] = "# value limit period\n"
                                 "ak_p1 1000 1m\nak_p2\t2000 1m\n";
static const char rules_b[] =
    "rules:\n"
    "  - name: per-key\n    match: api_key\n    limit: 200\n    period: 1h\n"
    "    overrides:\n"
    "      - {when: {plan: enterprise}, limit: 5000, name: premium}\n"
    "    overrides_file: partners.tsv\n"
    "  - name: login-per-ip\n    match: ip\n"
    "    when: {method: POST, path: /v1/login}\n"
    "    limit: 5\n    period: 1m\n"
    "  - {name: cap, match: tenant, limit: 10, period: 1m, mode: synced, "
    "shadow: true}\n";
static const char partners_b[] = "ak_p2 3000 1m\nak_p3 10 1m\n";

Test(rlctl_rules, config_diff_prints_what_a_reload_would_change)
{
    write_file("a", "partners.tsv", partners_a);
    write_file("b", "partners.tsv", partners_b);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s", with_store("a", rules_a));
    snprintf(b, sizeof b, "%s", with_store("b", rules_b));
    char out[8192], want[4096];
    cr_assert_eq(test_rlctl(out, sizeof out, a, "config --diff %s", b), 5, "%s",
                 out);
    snprintf(want, sizeof want,
             "diff:        %s -> %s\n"
             "rule per-key: limit 100 -> 200\n"
             "rule per-key: burst 100 -> 200\n"
             "rule per-key: override premium: when plan: enterprise; 1000 "
             "per 1h -> when plan: enterprise; 5000 per 1h\n"
             "rule per-key: values 2 -> 2 (1 added, 1 removed, 1 changed)\n"
             "rule per-key: value ak_p1 removed\n"
             "rule per-key: value ak_p2: 2000 per 1m -> 3000 per 1m\n"
             "rule per-key: value ak_p3 added: 10 per 1m\n"
             "rule login-per-ip added: ip, 5 per 1m, exact\n"
             "rule cap added: tenant, 10 per 1m, synced, shadow\n"
             "rule old removed\n"
             "summary:     2 rules added, 1 removed, 1 changed; overrides "
             "3 -> 3\n", a, b);
    cr_assert_str_eq(out, want);
    /* No change: exit 0. */
    cr_assert_eq(test_rlctl(out, sizeof out, a, "config --diff %s", a), 0, "%s",
                 out);
    snprintf(want, sizeof want, "diff:        %s -> %s\nno change: a "
             "reload would keep every rule as it is\n", a, a);
    cr_assert_str_eq(out, want);
    /* JSON carries the same lines. */
    cr_assert_eq(test_rlctl(out, sizeof out, b, "--json config --diff %s", a), 5);
    cr_assert(strstr(out, "\"changed\":true,\"rules_added\":1,"
                     "\"rules_removed\":2,\"rules_changed\":1,"
                     "\"overrides_before\":3,\"overrides_after\":3,"
                     "\"changes\":[\"rule per-key: limit 200 -> 100\",")
              != NULL, "%s", out);
    /* An invalid NEW: exit 3 with its message, no diff. */
    const char *bad = write_file("c", "rl.yaml", "rules: [\n");
    cr_assert_eq(test_rlctl(out, sizeof out, a, "config --diff %s", bad), 3);
    cr_assert(strstr(out, "rl.yaml:") != NULL && strstr(out, "diff:") == NULL,
              "%s", out);
}

Test(rlctl_rules, config_lists_overrides_and_shadow_rules)
{
    write_file("l", "partners.tsv", partners_b);
    const char *cfg = with_store("l", rules_b);
    char out[8192];
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "config"), 0, "%s", out);
    const char *tail = strstr(out, "\noverrides (first match wins):\n");
    cr_assert_not_null(tail, "%s", out);
    cr_assert_str_eq(tail,
        "\noverrides (first match wins):\n"
        "RULE                 OVERRIDE             APPLIES TO"
        "                         RATE\n"
        "per-key              premium              when plan: enterprise"
        "              5000 per 1h\n"
        "per-key              partners.tsv         2 values (one per line)"
        "            per line\n"
        "\nshadow:      cap\n");
}

Test(rlctl_rules, check_names_the_override_and_the_when_clauses)
{
    write_file("k", "partners.tsv", partners_b);
    const char *cfg = with_store("k", rules_b);
    char out[8192];
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --dry-run --attr "
                       "ip=192.0.2.1 --attr method=GET --attr path=/v1/login "
                       "--attr api_key=ak_p3 --attr plan=enterprise"), 0,
                 "%s", out);
    const char *why = strstr(out, "\nwhy:\n");
    cr_assert_not_null(why, "%s", out);
    /* The when override comes first: premium, not the file's ak_p3. */
    cr_assert_str_eq(why,
        "\nwhy:\n"
        "  per-key              applies, override premium (when plan: "
        "enterprise: held): 5000 per 1h\n"
        "  login-per-ip         not applied: when method: POST: not held "
        "(method=GET); when path: /v1/login: held\n"
        "  cap                  not applied: no tenant in the request\n"
        "\ndecision:    would be allowed\n");
    cr_assert(strstr(out, "\nper-key              exact   premium  ") != NULL,
              "%s", out);
    /* Without the plan, the file's line sets the rate; a POST to
     * /v1/login brings login-per-ip in. */
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --dry-run --attr "
                       "ip=192.0.2.1 --attr method=POST --attr "
                       "path=/v1/login --attr api_key=ak_p3"), 0, "%s", out);
    why = strstr(out, "\nwhy:\n");
    cr_assert_not_null(why, "%s", out);
    cr_assert_str_eq(why,
        "\nwhy:\n"
        "  per-key              applies, override partners.tsv:2: 10 per 1m\n"
        "  login-per-ip         applies (when method: POST: held; when path: "
        "/v1/login: held), override default: 5 per 1m\n"
        "  cap                  not applied: no tenant in the request\n"
        "\ndecision:    would be allowed\n");
}

/* A rule tagged by another attribute (issue 18): rlctl finds its keys
 * given the tag's value, and the untagged key without it. */
Test(rlctl_rules, tagged_keys_are_found_by_bucket_reset_and_check)
{
    const char *cfg = with_store("tagged",
                                 "rules:\n"
                                 "  - {name: per-key, match: api_key, "
                                 "limit: 10, period: 1h, hash_tag: tenant}\n");
    char out[8192], want[256], value[64], tenant[64], key[160];
    snprintf(value, sizeof value, "tagged-%d", (int)getpid());
    snprintf(tenant, sizeof tenant, "org-%d", (int)getpid());
    snprintf(key, sizeof key, "rl:key:{%zu:%s}:%s", strlen(tenant), tenant,
             value);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --attr api_key=%s "
                            "--attr tenant=%s", value, tenant), 0, "%s", out);
    cr_assert_gt(test_redis_pttl(NULL, key), 0, "no bucket at %s", key);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--json bucket per-key %s "
                            "--attr tenant=%s", value, tenant), 0, "%s", out);
    snprintf(want, sizeof want, "\"key\":\"%s\"", key);
    cr_assert_not_null(strstr(out, want), "%s", out);
    cr_assert_not_null(strstr(out, "\"tokens\":9"), "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--json bucket per-key %s",
                            value), 0, "%s", out);
    snprintf(want, sizeof want, "\"key\":\"rl:key:%s\"", value);
    cr_assert_not_null(strstr(out, want), "%s", out);
    cr_assert_not_null(strstr(out, "\"tokens\":10"), "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --dry-run --attr "
                            "api_key=%s --attr tenant=%s", value, tenant), 0,
                 "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "reset per-key %s --attr "
                            "tenant=%s --yes", value, tenant), 0, "%s", out);
    snprintf(want, sizeof want, "deleted 1 key for per-key %s\n", value);
    cr_assert_str_eq(out, want);
    cr_assert_eq(test_redis_pttl(NULL, key), -2);
}
