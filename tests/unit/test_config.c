/*
 * The rules config: the seed's example loads with exact values, defaults are
 * what the README says, and every bad file is refused with a message that
 * names the file, the line and the culprit.
 */
#include "config.h"
#include "rl.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static rl_config *load_ok(const char *yaml)
{
    rl_config *cfg = NULL;
    rl_error err;
    int rc = rl_config_parse(yaml, strlen(yaml), "<test>", &cfg, &err);
    cr_assert_eq(rc, RL_OK, "config refused: %s", err.message);
    cr_assert_eq(err.code, RL_OK);
    cr_assert_str_empty(err.message);
    return cfg;
}

static void expect_refused(const char *yaml, const char *message)
{
    rl_config *cfg = (rl_config *)1;
    rl_error err;
    int rc = rl_config_parse(yaml, strlen(yaml), "<test>", &cfg, &err);
    cr_assert_eq(rc, RL_ECONFIG, "accepted: %s", yaml);
    cr_assert_null(cfg);
    cr_assert_eq(err.code, RL_ECONFIG);
    cr_assert_str_eq(err.message, message);
}

Test(config, example_holds_the_seeds_three_rules)
{
    char path[512];
    rl_config *cfg = NULL;
    rl_error err;
    test_path(path, sizeof path, "RL_TEST_EXAMPLES", "rules.example.yaml");
    cr_assert_eq(rl_config_load(path, &cfg, &err), RL_OK, "%s", err.message);
    cr_assert_eq(cfg->n_rules, 3);

    const rl_rule *ip = &cfg->rules[0], *key = &cfg->rules[1],
                  *tenant = &cfg->rules[2];
    cr_assert_str_eq(ip->name, "per-ip");
    cr_assert_str_eq(ip->match, "ip");
    cr_assert_eq(ip->limit, 1000);
    cr_assert_eq(ip->period_ms, 60000);
    cr_assert_eq(ip->burst, 1000);
    cr_assert_eq(ip->mode, RL_MODE_EXACT);
    cr_assert_str_eq(ip->key_prefix, "rl:ip:");

    cr_assert_str_eq(key->match, "api_key");
    cr_assert_eq(key->limit, 100);
    cr_assert_eq(key->period_ms, 60000);
    cr_assert_str_eq(key->key_prefix, "rl:key:");
    cr_assert_eq(key->on_error, RL_ON_ERROR_ALLOW);

    cr_assert_eq(tenant->limit, 10000);
    cr_assert_eq(tenant->period_ms, 3600000);
    cr_assert_eq(tenant->mode, RL_MODE_SYNCED);
    cr_assert_str_eq(tenant->key_prefix, "rl:tenant:");

    cr_assert_eq(cfg->store.cluster, false);
    cr_assert_str_eq(cfg->store.nodes[0].host, "127.0.0.1");
    cr_assert_eq(cfg->store.nodes[0].port, 6379);
    cr_assert_eq(cfg->store.timeout_ms, 50);
    cr_assert_eq(cfg->aggregator.sync_interval_ms, 1000);
    cr_assert_eq(cfg->charge, RL_CHARGE_ALL);
    cr_assert_eq(cfg->local_max_keys, 100000);
    cr_assert_eq(cfg->log_level, RL_LOG_INFO);
    cr_assert_str_eq(cfg->gateway.tenant_map, "");
    rl_config_free(cfg);
}

Test(config, local_rules_and_the_gateway_section)
{
    rl_config *cfg = load_ok("local: {max_keys: 5000}\n"
                             "gateway: {tenant_map: tenants.txt}\n"
                             "rules:\n"
                             "  - {name: r, match: ip, limit: 7, "
                             "period: 1s, mode: local}\n");
    cr_assert_eq(cfg->rules[0].mode, RL_MODE_LOCAL);
    cr_assert_eq(cfg->local_max_keys, 5000);
    cr_assert_str_eq(cfg->gateway.tenant_map, "tenants.txt");
    rl_config_free(cfg);
}

Test(config, omitted_fields_take_the_documented_defaults)
{
    rl_config *cfg = load_ok("rules:\n"
                             "  - {name: r, match: customer, limit: 7, "
                             "period: 500ms}\n");
    const rl_rule *r = &cfg->rules[0];
    cr_assert_eq(r->limit, 7);
    cr_assert_eq(r->period_ms, 500);
    cr_assert_eq(r->burst, 7);
    cr_assert_eq(r->mode, RL_MODE_EXACT);
    cr_assert_eq(r->algorithm, RL_ALGO_TOKEN_BUCKET);
    cr_assert_eq(r->on_error, RL_ON_ERROR_ALLOW);
    cr_assert_str_eq(r->key_prefix, "rl:customer:");
    cr_assert_eq(cfg->store.n_nodes, 1);
    cr_assert_str_eq(cfg->store.nodes[0].host, "127.0.0.1");
    cr_assert_eq(cfg->store.nodes[0].port, 6379);
    cr_assert_eq(cfg->store.db, 0);
    cr_assert_null(cfg->store.username);
    cr_assert_null(cfg->store.password);
    cr_assert_eq(cfg->store.timeout_ms, 50);
    cr_assert_eq(cfg->store.scripts, RL_SCRIPTS_AUTO);
    cr_assert_str_eq(cfg->aggregator.reports, "tcp://127.0.0.1:7301");
    cr_assert_str_eq(cfg->aggregator.totals, "tcp://127.0.0.1:7302");
    cr_assert_eq(cfg->aggregator.sync_interval_ms, 1000);
    cr_assert_eq(cfg->charge, RL_CHARGE_ALL);
    rl_config_free(cfg);
}

Test(config, every_field_can_be_set)
{
    rl_config *cfg = load_ok(
        "store:\n"
        "  url: redis://redis.internal:6380/3\n"
        "  username: rl\n"
        "  password: s3cret\n"
        "  timeout_ms: 20\n"
        "  scripts: eval\n"
        "  wait_replicas: 1\n"
        "aggregator:\n"
        "  reports: ipc:///run/rl/reports\n"
        "  totals: tcp://[::1]:9000\n"
        "  sync_interval_ms: 250\n"
        "  metrics: 127.0.0.1:9464\n"
        "charge: refund\n"
        "log_level: warn\n"
        "rules:\n"
        "  - name: per-key\n"
        "    match: api_key\n"
        "    limit: 100\n"
        "    period: 1m\n"
        "    burst: 20\n"
        "    mode: synced\n"
        "    algorithm: gcra\n"
        "    on_error: deny\n"
        "    key_prefix: \"{acme}:key:\"\n");
    const rl_rule *r = &cfg->rules[0];
    cr_assert_eq(r->burst, 20);
    cr_assert_eq(r->mode, RL_MODE_SYNCED);
    cr_assert_eq(r->algorithm, RL_ALGO_GCRA);
    cr_assert_eq(r->on_error, RL_ON_ERROR_DENY);
    cr_assert_str_eq(r->key_prefix, "{acme}:key:");
    cr_assert_str_eq(cfg->store.nodes[0].host, "redis.internal");
    cr_assert_eq(cfg->store.nodes[0].port, 6380);
    cr_assert_eq(cfg->store.db, 3);
    cr_assert_str_eq(cfg->store.username, "rl");
    cr_assert_str_eq(cfg->store.password, "s3cret");
    cr_assert_eq(cfg->store.timeout_ms, 20);
    cr_assert_eq(cfg->store.scripts, RL_SCRIPTS_EVAL);
    cr_assert_eq(cfg->store.wait_replicas, 1);
    cr_assert_str_eq(cfg->aggregator.reports, "ipc:///run/rl/reports");
    cr_assert_str_eq(cfg->aggregator.totals, "tcp://[::1]:9000");
    cr_assert_eq(cfg->aggregator.sync_interval_ms, 250);
    cr_assert(cfg->aggregator.has_metrics);
    cr_assert_eq(cfg->log_level, RL_LOG_WARN);
    cr_assert_eq(cfg->aggregator.metrics.port, 9464);
    cr_assert_eq(cfg->charge, RL_CHARGE_REFUND);
    rl_config_free(cfg);
}

Test(config, cluster_seeds_take_names_ipv4_and_ipv6)
{
    rl_config *cfg = load_ok("store:\n"
                             "  cluster: [10.0.0.1:7000, \"[::1]:7001\", "
                             "redis-2.internal:7002]\n"
                             "rules:\n"
                             "  - {name: r, match: ip, limit: 1, period: 1s}\n");
    cr_assert(cfg->store.cluster);
    cr_assert_eq(cfg->store.n_nodes, 3);
    cr_assert_str_eq(cfg->store.nodes[0].host, "10.0.0.1");
    cr_assert_eq(cfg->store.nodes[0].port, 7000);
    cr_assert_str_eq(cfg->store.nodes[1].host, "::1");
    cr_assert_eq(cfg->store.nodes[1].port, 7001);
    cr_assert_str_eq(cfg->store.nodes[2].host, "redis-2.internal");
    cr_assert_eq(cfg->store.nodes[2].port, 7002);
    rl_config_free(cfg);
}

Test(config, rates_stay_two_integers)
{
    /* 100 a minute is not 1.6666 a second: nothing is rounded. */
    rl_config *cfg = load_ok("rules:\n"
                             "  - {name: a, match: ip, limit: 100, period: 1m}\n"
                             "  - {name: b, match: api_key, limit: 9007199254740991, "
                             "period: 1ms}\n"
                             "  - {name: c, match: tenant, limit: 1, "
                             "period: 366d}\n");
    cr_assert_eq(cfg->rules[0].limit, 100);
    cr_assert_eq(cfg->rules[0].period_ms, 60000);
    cr_assert_eq(cfg->rules[1].limit, 9007199254740991ULL);
    cr_assert_eq(cfg->rules[1].period_ms, 1);
    cr_assert_eq(cfg->rules[2].period_ms, 366ULL * 86400000);
    rl_config_free(cfg);
}

Test(config, limits_past_two_to_the_53_are_refused)
{
    expect_refused("rules:\n"
                   "  - {name: a, match: ip, limit: 9007199254740992, "
                   "period: 1m}\n",
                   "<test>:2:33: rules[0].limit (rule \"a\"): must be a whole "
                   "number from 1 to 9007199254740991, got "
                   "'9007199254740992'");
}

Test(config, inline_rules_report_lines_too)
{
    expect_refused("rules:\n"
                   "  - {name: a, match: ip, limit: 1, period: 1m}\n"
                   "  - {name: b, match: \"a b\", limit: 1, period: 1m}\n",
                   "<test>:3:22: rules[1].match (rule \"b\"): 'a b' is not a "
                   "valid attribute name (use letters, digits and _ . -)");
}

struct bad_file {
    const char *file;
    const char *message; /* after the path */
};

static const struct bad_file bad_files[] = {
    {"burst-times-period-too-large.yaml", ":5:12: rules[0].limit (rule \"per-tenant\"): burst 1000000000 (the bucket's capacity, limit unless set) over a period of 31536000000 ms is more than rl can count exactly: burst x period in ms must stay below 2^53; shorten the period or lower the burst"},
    {"unknown-scripts.yaml", ":3:12: store.scripts: unknown value 'lua' (choose one of: auto, function, eval)"},
    {"aggregator-same-urls.yaml", ":4:11: aggregator.totals: reports and totals need two different URLs, both are 'tcp://127.0.0.1:7301'"},
    {"aggregator-url.yaml", ":3:12: aggregator.reports: '127.0.0.1:7301' is not an nng URL such as tcp://127.0.0.1:7301 or ipc:///run/rl/reports"},
    {"burst-zero.yaml", ":7:12: rules[0].burst (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got '0'"},
    {"cluster-seed-no-port.yaml", ":5:7: store.cluster[1]: '127.0.0.1' is not host:port (IPv6 as [addr]:port)"},
    {"credentials-in-url.yaml", ":3:8: store.url: credentials are not accepted here (and not shown, to keep them out of logs): give them in store.username and store.password, password_file or password_env"},
    {"credentials-in-cluster-seed.yaml", ":3:29: store.cluster[1]: credentials are not accepted here (and not shown, to keep them out of logs): give them in store.username and store.password, password_file or password_env"},
    {"duplicate-field.yaml", ":6:13: rules[0].limit: field 'limit' is given twice"},
    {"duplicate-rule-name.yaml", ":7:11: rules[1].name (rule \"per-key\"): duplicate rule name: rules[0] has it already"},
    {"empty-file.yaml", ": the config is empty: it needs at least a rules list"},
    {"empty-rules.yaml", ":2:8: rules: the rules list is empty: give at least one rule (name, match, limit, period)"},
    {"key-prefix-with-space.yaml", ":7:17: rules[0].key_prefix (rule \"per-key\"): 'rl key:' is not a valid key prefix (no spaces or control characters, not empty)"},
    {"limit-fraction.yaml", ":5:12: rules[0].limit (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got '5.5'"},
    {"limit-negative.yaml", ":5:12: rules[0].limit (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got '-5'"},
    {"limit-not-integer.yaml", ":5:12: rules[0].limit (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got 'hundred'"},
    {"limit-zero.yaml", ":5:12: rules[0].limit (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got '0'"},
    {"match-repeated-attribute.yaml", ":4:29: rules[0].match[2] (rule \"per-key-route\"): attribute 'api_key' is named twice: a key part repeated adds nothing but length"},
    {"missing-limit.yaml", ":3:5: rules[0].limit: missing required field 'limit'"},
    {"missing-rules.yaml", ":2:1: rules: missing required field 'rules'"},
    {"name-too-long.yaml", ":3:11: rules[0].name: longer than 64 bytes"},
    {"name-with-space.yaml", ":3:11: rules[0].name: 'per key' is not a valid rule name (use letters, digits and _ . : -)"},
    {"not-yaml.yaml", ":2:8: not valid YAML: did not find expected node content"},
    {"nul-in-value.yaml", ":3:11: this value holds a NUL byte, which no rl field can carry"},
    {"period-no-unit.yaml", ":6:13: rules[0].period (rule \"per-key\"): '60' is not a period: write a positive count and a unit (ms, s, m, h, d), e.g. 500ms, 1s, 1m, 1h, 1d, at most 366d"},
    {"period-unparseable.yaml", ":6:13: rules[0].period (rule \"per-key\"): '1 minute' is not a period: write a positive count and a unit (ms, s, m, h, d), e.g. 500ms, 1s, 1m, 1h, 1d, at most 366d"},
    {"period-zero.yaml", ":6:13: rules[0].period (rule \"per-key\"): '0s' is not a period: write a positive count and a unit (ms, s, m, h, d), e.g. 500ms, 1s, 1m, 1h, 1d, at most 366d"},
    {"rules-not-a-list.yaml", ":2:8: rules: expected a list, got a plain value"},
    {"shared-key-prefix.yaml", ":7:5: rules[1] (rule \"per-ip-hour\"): key prefix 'rl:ip:' is also used by rule \"per-ip-minute\": the two would share buckets; give one of them its own key_prefix"},
    {"store-url-scheme.yaml", ":3:8: store.url: 'http://127.0.0.1:6379' is not redis://host[:port][/db] (credentials go in store.username and store.password)"},
    {"sync-interval-too-small.yaml", ":3:21: aggregator.sync_interval_ms: must be a whole number from 10 to 60000, got '5'"},
    {"timeout-zero.yaml", ":3:15: store.timeout_ms: must be a whole number from 1 to 60000, got '0'"},
    {"top-level-list.yaml", ": top level: expected a mapping (key: value lines), got a list"},
    {"unknown-algorithm.yaml", ":7:16: rules[0].algorithm (rule \"per-key\"): unknown value 'leaky_bucket' (choose one of: token_bucket, gcra)"},
    {"unknown-charge.yaml", ":2:9: charge: unknown value 'some' (choose one of: all, first_reject, refund)"},
    {"unknown-field.yaml", ":7:5: rules[0].limt: unknown field 'limt'"},
    {"unknown-mode.yaml", ":7:11: rules[0].mode (rule \"per-key\"): unknown value 'fast' (choose one of: exact, synced, local)"},
    {"tls-without-section.yaml", ":3:12: aggregator.reports: a tls+tcp:// URL needs aggregator.tls with at least ca, cert and key"},
    {"metrics-no-port.yaml", ":2:23: aggregator.metrics: 'localhost' is not host:port (an HTTP address such as 127.0.0.1:9464)"},
    {"local-max-keys-zero.yaml", ":2:19: local.max_keys: must be a whole number from 1 to 10000000, got '0'"},
    {"tenant-map-empty.yaml", ":2:23: gateway.tenant_map: the path is empty; leave the field out for no map"},
    {"unknown-on-error.yaml", ":7:15: rules[0].on_error (rule \"per-key\"): unknown value 'retry' (choose one of: allow, deny)"},
    {"unknown-section.yaml", ":2:1: stores: unknown field 'stores'"},
    {"url-and-cluster.yaml", ":4:12: store.cluster: give either store.url or store.cluster, not both"},
    {"username-without-password.yaml", ":3:13: store.username: a username needs a password (store.password, password_file or password_env)"},
};

Test(config, every_bad_file_is_refused_naming_the_culprit)
{
    cr_assert_geq(sizeof bad_files / sizeof bad_files[0], 15);
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        char path[512], expected[RL_ERROR_MAX];
        rl_config *cfg = (rl_config *)1;
        rl_error err;
        snprintf(path, sizeof path, "%s/bad/%s", test_env("RL_TEST_CONFIGS"),
                 bad_files[i].file);
        snprintf(expected, sizeof expected, "%s%s", path,
                 bad_files[i].message);
        int rc = rl_config_load(path, &cfg, &err);
        cr_expect_eq(rc, RL_ECONFIG, "%s: loaded (rc %d)", path, rc);
        cr_expect_null(cfg, "%s: out not cleared", path);
        cr_expect_str_eq(err.message, expected);
    }
}

Test(config, every_file_in_the_bad_folder_is_in_the_table)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/bad", test_env("RL_TEST_CONFIGS"));
    FILE *ls = popen(cmd, "r");
    cr_assert_not_null(ls);
    char name[256];
    size_t listed = 0;
    while (fgets(name, sizeof name, ls) != NULL) {
        name[strcspn(name, "\n")] = '\0';
        bool found = false;
        for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++)
            found = found || strcmp(bad_files[i].file, name) == 0;
        cr_expect(found, "%s has no expected message in the table", name);
        listed++;
    }
    pclose(ls);
    cr_assert_eq(listed, sizeof bad_files / sizeof bad_files[0]);
}

Test(config, unreadable_files_are_io_errors)
{
    rl_config *cfg = (rl_config *)1;
    rl_error err;
    cr_assert_eq(rl_config_load("/nonexistent/rl.yaml", &cfg, &err), RL_EIO);
    cr_assert_null(cfg);
    cr_assert_str_eq(err.message, "/nonexistent/rl.yaml: cannot open config: "
                     "No such file or directory");
    cr_assert_eq(rl_config_load("/tmp", &cfg, &err), RL_EIO);
    cr_assert_str_eq(err.message, "/tmp: not a regular file");
}

Test(config, files_over_four_mebibytes_are_refused)
{
    char path[] = "/tmp/rl-big-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (4 << 20) + 1), 0);
    close(fd);
    rl_config *cfg;
    rl_error err;
    int rc = rl_config_load(path, &cfg, &err);
    unlink(path);
    cr_assert_eq(rc, RL_EIO);
    cr_assert(strstr(err.message, "config is 4194305 bytes, over the "
                     "4194304-byte limit") != NULL, "%s", err.message);
}

Test(config, null_arguments_are_invalid_not_crashes)
{
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_load(NULL, &cfg, &err), RL_EINVAL);
    cr_assert_null(cfg);
    cr_assert_eq(rl_config_load("x", NULL, NULL), RL_EINVAL);
    cr_assert_eq(rl_config_parse(NULL, 0, "x", &cfg, &err), RL_EINVAL);
    cr_assert_eq(rl_config_parse("a", 1, NULL, &cfg, NULL), RL_EINVAL);
    rl_config_free(NULL);
}

static int run_rlctl(const char *config, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --config %s config",
             test_env("RL_TEST_RLCTL"), config);
    return test_run(cmd, out, cap);
}

Test(config, rlctl_exits_nonzero_naming_the_culprit)
{
    char out[4096], path[512];
    test_path(path, sizeof path, "RL_TEST_CONFIGS", "bad/limit-zero.yaml");
    cr_assert_eq(run_rlctl(path, out, sizeof out), 3);
    cr_assert(strstr(out, "limit-zero.yaml:5:12: rules[0].limit (rule "
                     "\"per-key\")") != NULL, "%s", out);
    test_path(path, sizeof path, "RL_TEST_EXAMPLES", "rules.example.yaml");
    cr_assert_eq(run_rlctl(path, out, sizeof out), 0);
    cr_assert(strstr(out, "per-key") != NULL, "%s", out);
}

#include <pthread.h>

static void *load_example(void *arg)
{
    const char *path = arg;
    for (int i = 0; i < 20; i++) {
        rl_config *cfg;
        rl_error err;
        if (rl_config_load(path, &cfg, &err) != RL_OK)
            return (void *)1;
        rl_config_free(cfg);
        if (rl_config_parse("rules: []\n", 10, "x", &cfg, &err) != RL_ECONFIG)
            return (void *)1;
    }
    return NULL;
}

Test(config, loads_from_many_threads_at_once)
{
    char path[512];
    test_path(path, sizeof path, "RL_TEST_EXAMPLES", "rules.example.yaml");
    pthread_t threads[8];
    for (int i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, load_example, path), 0);
    for (int i = 0; i < 8; i++) {
        void *failed;
        pthread_join(threads[i], &failed);
        cr_assert_null(failed, "thread %d could not load the config", i);
    }
}

Test(config, a_password_comes_from_a_file_or_the_environment)
{
    char path[] = "/tmp/rl-password-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "s3cret from a file\n", 19), 19);
    close(fd);
    char yaml[512];
    snprintf(yaml, sizeof yaml, "store: {password_file: %s}\nrules:\n"
             "  - {name: r, match: ip, limit: 1, period: 1s}\n", path);
    rl_config *cfg = load_ok(yaml);
    cr_assert_str_eq(cfg->store.password, "s3cret from a file");
    rl_config_free(cfg);

    setenv("RL_TEST_SECRET", "s3cret from env", 1);
    cfg = load_ok("store: {username: rl, password_env: RL_TEST_SECRET}\n"
                  "rules:\n  - {name: r, match: ip, limit: 1, period: 1s}\n");
    cr_assert_str_eq(cfg->store.password, "s3cret from env");
    cr_assert_str_eq(cfg->store.username, "rl");
    rl_config_free(cfg);
    unsetenv("RL_TEST_SECRET");

    expect_refused("store: {password_env: RL_TEST_SECRET}\nrules:\n"
                   "  - {name: r, match: ip, limit: 1, period: 1s}\n",
                   "<test>:1:23: store.password_env: the environment "
                   "variable RL_TEST_SECRET is not set");
    snprintf(yaml, sizeof yaml, "store: {password: x, password_file: %s}\n"
             "rules:\n  - {name: r, match: ip, limit: 1, period: 1s}\n",
             path);
    expect_refused(yaml, "<test>:1:19: store.password: give one of "
                   "password, password_file and password_env");
    unlink(path);
    snprintf(yaml, sizeof yaml, "store: {password_file: %s}\nrules:\n"
             "  - {name: r, match: ip, limit: 1, period: 1s}\n", path);
    char message[256];
    snprintf(message, sizeof message, "<test>:1:24: store.password_file: "
             "cannot read '%s': No such file or directory", path);
    expect_refused(yaml, message);
}
