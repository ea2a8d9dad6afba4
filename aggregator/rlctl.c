/*
 * rlctl.c: the admin CLI. Each subcommand is one function; exit codes are
 * part of the interface (scripts test them), so they are listed in the
 * usage text and the README and never reused for something else.
 */
#include "config.h"
#include "duration.h"
#include "rl.h"

#include <stdio.h>
#include <string.h>

#define EXIT_OK 0
#define EXIT_USAGE 1
#define EXIT_BAD_CONFIG 3

#define DEFAULT_CONFIG "/etc/rl/rl.yaml"

static const char usage[] =
    "usage: rlctl [--config FILE] COMMAND\n"
    "\n"
    "commands:\n"
    "  config     validate the config and show the rules as rl reads them\n"
    "\n"
    "options:\n"
    "  --config FILE  the rules config (default " DEFAULT_CONFIG ")\n"
    "  --help         show this text\n"
    "  --version      show rl's version\n"
    "\n"
    "exit codes: 0 ok, 1 usage error, 3 invalid or unreadable config\n";

static void print_store(const rl_store_config *s)
{
    printf("store:       ");
    if (s->cluster) {
        printf("cluster of %zu seed%s:", s->n_nodes, s->n_nodes == 1 ? "" : "s");
        for (size_t i = 0; i < s->n_nodes; i++)
            printf(strchr(s->nodes[i].host, ':') ? " [%s]:%u" : " %s:%u",
                   s->nodes[i].host, s->nodes[i].port);
    } else {
        printf(strchr(s->nodes[0].host, ':') ? "redis://[%s]:%u/%u"
                                             : "redis://%s:%u/%u",
               s->nodes[0].host, s->nodes[0].port, s->db);
    }
    printf(", timeout %ums%s\n", s->timeout_ms,
           s->password != NULL ? ", with password" : "");
}

static void print_rules(const rl_config *cfg)
{
    printf("\n%-20s %-12s %10s %8s %10s %-7s %-13s %-8s %s\n", "RULE",
           "MATCH", "LIMIT", "PERIOD", "BURST", "MODE", "ALGORITHM",
           "ON_ERROR", "KEY_PREFIX");
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        char period[24];
        rl_duration_format(r->period_ms, period, sizeof period);
        printf("%-20s %-12s %10llu %8s %10llu %-7s %-13s %-8s %s\n", r->name,
               r->match, (unsigned long long)r->limit, period,
               (unsigned long long)r->burst, rl_mode_name(r->mode),
               rl_algorithm_name(r->algorithm), rl_on_error_name(r->on_error),
               r->key_prefix);
    }
}

static int cmd_config(const char *path)
{
    rl_config *cfg;
    rl_error err;
    if (rl_config_load(path, &cfg, &err) != RL_OK) {
        fprintf(stderr, "rlctl: %s\n", err.message);
        return EXIT_BAD_CONFIG;
    }
    printf("config:      %s (%zu rule%s, valid)\n", path, cfg->n_rules,
           cfg->n_rules == 1 ? "" : "s");
    print_store(&cfg->store);
    printf("aggregator:  reports %s, totals %s, sync every %ums\n",
           cfg->aggregator.reports, cfg->aggregator.totals,
           cfg->aggregator.sync_interval_ms);
    printf("charge:      %s\n", rl_charge_name(cfg->charge));
    print_rules(cfg);
    rl_config_free(cfg);
    return EXIT_OK;
}

int main(int argc, char **argv)
{
    const char *config = DEFAULT_CONFIG;
    const char *command = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return EXIT_OK;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("rlctl %s\n", rl_version());
            return EXIT_OK;
        } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            config = argv[i] + 9;
        } else if (argv[i][0] != '-' && command == NULL) {
            command = argv[i];
        } else {
            fprintf(stderr, "rlctl: unexpected argument '%s'\n\n%s", argv[i],
                    usage);
            return EXIT_USAGE;
        }
    }
    if (command == NULL) {
        fprintf(stderr, "rlctl: no command given\n\n%s", usage);
        return EXIT_USAGE;
    }
    if (strcmp(command, "config") == 0)
        return cmd_config(config);
    fprintf(stderr, "rlctl: unknown command '%s'\n\n%s", command, usage);
    return EXIT_USAGE;
}
