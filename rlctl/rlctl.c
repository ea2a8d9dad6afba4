/*
 * rlctl.c: the admin CLI. Each subcommand is one function; exit codes are
 * part of the interface (scripts test them), so they are listed in the
 * usage text and the README and never reused for something else. Every
 * read goes to the store directly, blocking (rlctl_store.c); only `check`
 * without --dry-run goes through librl, as a gateway would.
 */
#include "config.h"
#include "duration.h"
#include "rl.h"
#include "config_diff.h"
#include "rlctl_agents.h"
#include "rlctl_config.h"
#include "rlctl_explain.h"
#include "rlctl_json.h"
#include "rlctl_store.h"
#include "rlctl_totals.h"
#include "rlctl_watch.h"
#include "rlctl_view.h"
#include "rules.h"

#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_OK 0
#define EXIT_USAGE 1
#define EXIT_UNREACHABLE 2
#define EXIT_BAD_CONFIG 3
#define EXIT_REJECTED 4
#define EXIT_CHANGES 5 /* config --diff: a reload would change something */

#define DEFAULT_CONFIG "/etc/rl/rl.yaml"
#define ARGS_MAX 64

static const char usage[] =
    "usage: rlctl [--config FILE] [--json] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  config [--diff NEW]     validate the config and show the rules, their\n"
    "                          overrides and shadow rules; --diff: what a\n"
    "                          reload to NEW would change (exit 5 if any)\n"
    "  bucket RULE VALUE [--attr TAG=VALUE]\n"
    "                          a bucket's tokens (or a synced rule's window\n"
    "                          counts), time to full and TTL; spends nothing;\n"
    "                          --attr: the value of the rule's hash_tag\n"
    "  reset RULE VALUE [--attr TAG=VALUE] [--yes]\n"
    "                          forget a bucket or a client's window counts\n"
    "  check --attr NAME=VALUE... [--cost N] [--dry-run]\n"
    "                          what the rules decide for that request, rule\n"
    "                          by rule: the override that set each rate,\n"
    "                          why each rule applies or not (its when);\n"
    "                          --dry-run reads without spending\n"
    "  totals [--rule R] [--top N]\n"
    "                          clients of synced rules by their count in the\n"
    "                          current window (default top 20)\n"
    "  agents                  the agents the aggregator heard from in the\n"
    "                          last minute (from aggregator.metrics)\n"
    "  watch [--top N] [--interval S] [--count K]\n"
    "                          a live view of the top synced clients: their\n"
    "                          estimate against the limit, rate, LIMITED\n"
    "\n"
    "options:\n"
    "  --config FILE  the rules config (default " DEFAULT_CONFIG ")\n"
    "  --json         one JSON document on stdout instead of a table\n"
    "  --help         show this text (COMMAND --help: the same)\n"
    "  --version      show rl's version\n"
    "\n"
    "exit codes: 0 ok (config --diff: no change), 1 usage error (bad\n"
    "arguments, unknown rule, reset not confirmed), 2 store unreachable or\n"
    "refused, 3 invalid or unreadable config (--diff: either one), 4 check:\n"
    "the request is (or would be) rejected, 5 config --diff: a reload would\n"
    "change something\n";

typedef struct cli {
    const char *config_path;
    bool json, yes, dry_run;
    const char *command;
    const char *args[ARGS_MAX]; /* positionals after the command */
    int n_args;
    const char *attrs[RL_ATTRS_MAX];
    int n_attrs;
    const char *rule;
    const char *diff;           /* config --diff NEW */
    unsigned long top, cost, interval, count;
    rl_config *cfg;
} cli;

static int fail(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("rlctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* --- config ------------------------------------------------------------ */

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

static int cmd_diff(cli *c)
{
    rl_config *next;
    rl_error err;
    if (rl_config_load(c->diff, &next, &err) != RL_OK)
        return fail(EXIT_BAD_CONFIG, "%s", err.message);
    int changed = rlctl_config_diff(c->cfg, c->config_path, next, c->diff,
                                    c->json);
    rl_config_free(next);
    if (changed < 0)
        return EXIT_UNREACHABLE;
    return changed ? EXIT_CHANGES : EXIT_OK;
}

static int cmd_config(cli *c)
{
    const rl_config *cfg = c->cfg;
    if (c->diff != NULL)
        return cmd_diff(c);
    if (c->json) {
        printf("{\"config\":");
        rlctl_json_string(c->config_path);
        printf(",\"valid\":true,\"rules\":[");
        for (size_t i = 0; i < cfg->n_rules; i++) {
            const rl_rule *r = &cfg->rules[i];
            printf("%s{\"name\":", i ? "," : "");
            rlctl_json_string(r->name);
            printf(",\"match\":");
            rlctl_json_string(r->match);
            printf(",\"limit\":%llu,\"period_ms\":%llu,\"burst\":%llu,"
                   "\"mode\":\"%s\",\"algorithm\":\"%s\",\"on_error\":\"%s\","
                   "\"key_prefix\":", (unsigned long long)r->limit,
                   (unsigned long long)r->period_ms,
                   (unsigned long long)r->burst, rl_mode_name(r->mode),
                   rl_algorithm_name(r->algorithm),
                   rl_on_error_name(r->on_error));
            rlctl_json_string(r->key_prefix);
            /* 0: not given (on_error: local then divides by the
             * aggregator's count, else by 1). */
            if (r->fleet_size != 0)
                printf(",\"fleet_size\":%u", r->fleet_size);
            else
                printf(",\"fleet_size\":null");
            rlctl_config_json_overrides(cfg, r);
            printf("}");
        }
        printf("]}\n");
        return EXIT_OK;
    }
    printf("config:      %s (%zu rule%s, valid)\n", c->config_path,
           cfg->n_rules, cfg->n_rules == 1 ? "" : "s");
    print_store(&cfg->store);
    for (size_t i = 0; i < cfg->aggregator.n_endpoints; i++) {
        const rl_aggregator_endpoint *e = &cfg->aggregator.endpoints[i];
        char label[32] = "";
        if (cfg->aggregator.n_endpoints > 1)
            snprintf(label, sizeof label, "[%zu] ", i);
        printf("aggregator:  %sreports %s, totals %s, sync every %ums\n",
               label, e->reports, e->totals,
               cfg->aggregator.sync_interval_ms);
    }
    printf("charge:      %s\n", rl_charge_name(cfg->charge));
    printf("\n%-20s %-12s %10s %8s %10s %-7s %-13s %-8s %-6s %s\n", "RULE",
           "MATCH", "LIMIT", "PERIOD", "BURST", "MODE", "ALGORITHM",
           "ON_ERROR", "FLEET", "KEY_PREFIX");
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        char period[24], fleet[16] = "-";
        rl_duration_format(r->period_ms, period, sizeof period);
        if (r->fleet_size != 0)
            snprintf(fleet, sizeof fleet, "%u", r->fleet_size);
        printf("%-20s %-12s %10llu %8s %10llu %-7s %-13s %-8s %-6s %s\n",
               r->name, r->match, (unsigned long long)r->limit, period,
               (unsigned long long)r->burst, rl_mode_name(r->mode),
               rl_algorithm_name(r->algorithm), rl_on_error_name(r->on_error),
               fleet, r->key_prefix);
    }
    rlctl_config_print_overrides(cfg);
    return EXIT_OK;
}

/* --- the store ---------------------------------------------------------- */

static const rl_rule *find_rule(const rl_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_rules; i++) {
        if (strcmp(cfg->rules[i].name, name) == 0)
            return &cfg->rules[i];
    }
    return NULL;
}

/* The store of a rule's keys: a synced rule's are where the aggregators
 * keep them (aggregator.store, when given). */
static const rl_store_config *store_of(const cli *c, const rl_rule *rule)
{
    return rule != NULL && rule->mode == RL_MODE_SYNCED
               ? rl_config_aggregator_store(c->cfg)
               : &c->cfg->store;
}

static int open_store(const rl_store_config *store, rlctl_store *s,
                      unsigned long long *now)
{
    char err[512];
    if (rlctl_store_open(s, store, err, sizeof err) != 0)
        return fail(EXIT_UNREACHABLE, "%s", err);
    *now = rlctl_store_now_ms(s, err, sizeof err);
    if (*now == 0) {
        rlctl_store_close(s);
        return fail(EXIT_UNREACHABLE, "%s", err);
    }
    return EXIT_OK;
}

static int rule_and_value(cli *c, const rl_rule **rule, const char **value)
{
    if (c->n_args != 2)
        return fail(EXIT_USAGE, "%s needs RULE VALUE (see rlctl --help)",
                    c->command);
    *rule = find_rule(c->cfg, c->args[0]);
    *value = c->args[1];
    if (*rule == NULL)
        return fail(EXIT_USAGE, "no rule named \"%s\" in %s (rlctl config "
                    "lists them)", c->args[0], c->config_path);
    if (strlen(*value) == 0 || strlen(*value) > RL_VALUE_MAX)
        return fail(EXIT_USAGE, "a value is 1 to %d bytes", RL_VALUE_MAX);
    return EXIT_OK;
}

/* --- bucket -------------------------------------------------------------- */

static void print_view_json(const rlctl_view *v)
{
    const rl_rule *r = v->rule;
    printf("{\"rule\":");
    rlctl_json_string(r->name);
    printf(",\"mode\":\"%s\",\"key\":", rl_mode_name(r->mode));
    rlctl_json_string(v->key);
    printf(",\"exists\":%s,\"ttl_ms\":%lld,\"limit\":%llu,\"period_ms\":%llu",
           v->exists ? "true" : "false", v->ttl_ms,
           (unsigned long long)r->limit, (unsigned long long)r->period_ms);
    if (r->mode == RL_MODE_IN_FLIGHT) {
        printf(",\"in_flight\":%llu,\"held\":%llu,\"agents\":[",
               (unsigned long long)r->limit, (unsigned long long)v->held);
        for (size_t i = 0; i < v->n_holders; i++) {
            printf("%s{\"agent\":", i > 0 ? "," : "");
            rlctl_json_string(v->holders[i].agent);
            printf(",\"slots\":%llu,\"expires_in_ms\":%lld}",
                   (unsigned long long)v->holders[i].slots,
                   v->holders[i].expires_in_ms);
        }
        printf("],\"agents_count\":%zu}", v->n_agents);
    } else if (r->algorithm == RL_ALGO_FIXED_WINDOW)
        printf(",\"algorithm\":\"fixed_window\",\"window\":%llu,"
               "\"count\":%llu,\"remaining\":%llu,\"window_ends_in_ms\":%llu}",
               (unsigned long long)v->window,
               (unsigned long long)v->current,
               (unsigned long long)v->tokens,
               (unsigned long long)v->full_in_ms);
    else if (r->mode == RL_MODE_SYNCED)
        printf(",\"window\":%llu,\"current\":%llu,\"previous\":%llu,"
               "\"estimate\":%llu,\"window_ends_in_ms\":%llu}",
               (unsigned long long)v->window,
               (unsigned long long)v->current,
               (unsigned long long)v->previous,
               (unsigned long long)v->estimate,
               (unsigned long long)v->full_in_ms);
    else
        printf(",\"algorithm\":\"%s\",\"burst\":%llu,\"tokens\":%llu,"
               "\"full_in_ms\":%llu,\"state\":",
               rl_algorithm_name(r->algorithm),
               (unsigned long long)r->burst, (unsigned long long)v->tokens,
               (unsigned long long)v->full_in_ms);
    if (r->mode != RL_MODE_SYNCED && r->algorithm != RL_ALGO_FIXED_WINDOW
        && r->mode != RL_MODE_IN_FLIGHT) {
        rlctl_json_string(v->state);
        /* The store cannot tell leased tokens apart from spent ones. */
        if (r->mode == RL_MODE_LEASED)
            printf(",\"leases\":\"counted as taken\"");
        printf("}");
    }
}

/* An in_flight key's slots, by agent. */
static void print_slots(const rlctl_view *v)
{
    printf("held:        %llu of %llu at once, %llu free\n",
           (unsigned long long)v->held, (unsigned long long)v->rule->limit,
           (unsigned long long)v->tokens);
    for (size_t i = 0; i < v->n_holders; i++) {
        const rlctl_holder *o = &v->holders[i];
        if (o->expires_in_ms > 0)
            printf("agent:       %s holds %llu, expires in %lld ms\n",
                   o->agent, (unsigned long long)o->slots,
                   o->expires_in_ms);
        else
            printf("agent:       %s held %llu, expired %lld ms ago (free)\n",
                   o->agent, (unsigned long long)o->slots,
                   -o->expires_in_ms);
    }
    if (v->n_agents > v->n_holders)
        printf("agents:      %zu more not shown\n",
               v->n_agents - v->n_holders);
}

static void print_view(const rlctl_view *v)
{
    const rl_rule *r = v->rule;
    if (r->mode == RL_MODE_IN_FLIGHT)
        printf("rule:        %s (in_flight, %llu at once)\n", r->name,
               (unsigned long long)r->limit);
    else
        printf("rule:        %s (%s, %llu per %llu ms)\n", r->name,
               rl_mode_name(r->mode), (unsigned long long)r->limit,
               (unsigned long long)r->period_ms);
    printf("key:         %s%s\n", v->key, v->exists ? "" : " (none)");
    if (r->mode == RL_MODE_IN_FLIGHT) {
        print_slots(v);
    } else if (r->algorithm == RL_ALGO_FIXED_WINDOW) {
        printf("window:      %llu, ends in %llu ms\n",
               (unsigned long long)v->window,
               (unsigned long long)v->full_in_ms);
        printf("count:       %llu of %llu (fixed_window), %llu left\n",
               (unsigned long long)v->current, (unsigned long long)r->limit,
               (unsigned long long)v->tokens);
    } else if (r->mode == RL_MODE_SYNCED) {
        printf("sub-window:  %llu, ends in %llu ms\n",
               (unsigned long long)v->window,
               (unsigned long long)v->full_in_ms);
        printf("counts:      recent %llu, oldest %llu, estimate over the "
               "period %llu of %llu\n", (unsigned long long)v->current,
               (unsigned long long)v->previous,
               (unsigned long long)v->estimate, (unsigned long long)r->limit);
    } else {
        printf("tokens:      %llu of %llu (%s)\n",
               (unsigned long long)v->tokens, (unsigned long long)r->burst,
               rl_algorithm_name(r->algorithm));
        printf("full in:     %llu ms\n", (unsigned long long)v->full_in_ms);
        printf("state:       %s\n", v->exists ? v->state : "-");
        if (r->mode == RL_MODE_LEASED)
            printf("leases:      counted as taken: tokens agents hold and "
                   "have not spent are not in the bucket (they come back "
                   "when a key is idle, on reload and at close)\n");
    }
    if (v->ttl_ms >= 0)
        printf("ttl:         %lld ms\n", v->ttl_ms);
    else
        printf("ttl:         %s\n", v->ttl_ms == -1 ? "none" : "-");
}

/* The value of the rule's hash_tag attribute among the --attr options,
 * when the rule co-locates its keys by one; NULL: the untagged key. */
static const char *tag_arg(const cli *c, const rl_rule *rule)
{
    size_t len = strlen(rule->tag_attr);
    for (int i = 0; i < c->n_attrs && len > 0; i++) {
        if (strncmp(c->attrs[i], rule->tag_attr, len) == 0
            && c->attrs[i][len] == '=')
            return c->attrs[i] + len + 1;
    }
    return NULL;
}

/* RULE VALUE's view, with the store left open for the caller (who closes
 * it); local rules have nothing in the store. */
static int open_view(cli *c, rlctl_store *s, rlctl_view *v)
{
    const rl_rule *rule = NULL;
    const char *value = NULL;
    int rc = rule_and_value(c, &rule, &value);
    if (rc != EXIT_OK)
        return rc;
    if (rule->mode == RL_MODE_LOCAL)
        return fail(EXIT_USAGE, "rule \"%s\" is local: its buckets live in "
                    "each gateway's memory, not in the store", rule->name);
    unsigned long long now;
    if ((rc = open_store(store_of(c, rule), s, &now)) != EXIT_OK)
        return rc;
    char err[512];
    if (rlctl_view_read(s, rule, tag_arg(c, rule), value, now, v, err,
                        sizeof err) != 0) {
        rlctl_store_close(s);
        return fail(EXIT_UNREACHABLE, "%s", err);
    }
    return EXIT_OK;
}

static int cmd_bucket(cli *c)
{
    rlctl_store s;
    rlctl_view v;
    int rc = open_view(c, &s, &v);
    if (rc != EXIT_OK)
        return rc;
    rlctl_store_close(&s);
    if (c->json) {
        print_view_json(&v);
        putchar('\n');
    } else {
        print_view(&v);
    }
    return EXIT_OK;
}

/* --- reset --------------------------------------------------------------- */

static bool confirmed(const rlctl_view *v)
{
    if (!isatty(STDIN_FILENO))
        return false;
    fprintf(stderr, "delete %s%s%s? [y/N] ", v->key,
            v->previous_key[0] ? " and " : "",
            v->previous_key);
    char answer[16];
    return fgets(answer, sizeof answer, stdin) != NULL
           && (answer[0] == 'y' || answer[0] == 'Y');
}

static int cmd_reset(cli *c)
{
    rlctl_store s;
    rlctl_view v;
    char err[512];
    int rc = open_view(c, &s, &v);
    if (rc != EXIT_OK)
        return rc;
    if (!c->yes && !confirmed(&v)) {
        rlctl_store_close(&s);
        return fail(EXIT_USAGE, "not deleted: confirm at the prompt, or "
                    "pass --yes");
    }
    long long removed = rlctl_view_forget(&s, &v, err, sizeof err);
    rlctl_store_close(&s);
    if (removed < 0)
        return fail(EXIT_UNREACHABLE, "%s", err);
    if (c->json) {
        printf("{\"rule\":");
        rlctl_json_string(v.rule->name);
        printf(",\"key\":");
        rlctl_json_string(v.key);
        printf(",\"deleted\":%lld}\n", removed);
    } else {
        printf("deleted %lld key%s for %s %s\n", removed,
               removed == 1 ? "" : "s", v.rule->name, c->args[1]);
    }
    return EXIT_OK;
}

/* --- check --------------------------------------------------------------- */

typedef struct attr_arg {
    char name[RL_RULE_NAME_MAX + 1];
    const char *value;
} attr_arg;

static int parse_attrs(cli *c, attr_arg *out, rl_attr *attrs)
{
    if (c->n_attrs == 0)
        return fail(EXIT_USAGE, "check needs at least one --attr "
                    "NAME=VALUE");
    for (int i = 0; i < c->n_attrs; i++) {
        const char *eq = strchr(c->attrs[i], '=');
        size_t len = eq != NULL ? (size_t)(eq - c->attrs[i]) : 0;
        if (eq == NULL || len == 0 || len > RL_RULE_NAME_MAX)
            return fail(EXIT_USAGE, "--attr '%s' is not NAME=VALUE",
                        c->attrs[i]);
        memcpy(out[i].name, c->attrs[i], len);
        out[i].name[len] = '\0';
        out[i].value = eq + 1;
        attrs[i] = (rl_attr){out[i].name, out[i].value, strlen(eq + 1)};
    }
    return EXIT_OK;
}

/* What each rule holds and would decide, before anything is spent: why
 * it applies (or not) and at which rate (ex), and its bucket at that
 * rate (view). */
typedef struct verdict {
    rlctl_explain ex;
    rlctl_view view;
    bool applies, unlimited, readable, allowed;
    long long retry_ms;
} verdict;

static int read_verdicts(cli *c, const rl_attr *attrs, verdict *v)
{
    rlctl_store s;
    unsigned long long now;
    int rc = open_store(&c->cfg->store, &s, &now);
    if (rc != EXIT_OK)
        return rc;
    for (size_t i = 0; i < c->cfg->n_rules; i++) {
        const rl_rule *r = &c->cfg->rules[i];
        v[i] = (verdict){0};
        rlctl_explain_rule(c->cfg, r, attrs, (size_t)c->n_attrs, &v[i].ex);
        v[i].applies = v[i].ex.applies;
        v[i].unlimited = v[i].ex.applies && v[i].ex.effective.unlimited;
        v[i].view.rule = &v[i].ex.effective;
        if (!v[i].applies || v[i].unlimited || r->mode == RL_MODE_LOCAL)
            continue;
        char err[512];
        const rl_attr *tag = r->tag_attr[0] != '\0'
                                 ? rl_attr_find(attrs, (size_t)c->n_attrs,
                                                r->tag_attr)
                                 : NULL;
        if (rlctl_view_read(&s, &v[i].ex.effective,
                            tag != NULL ? tag->value : NULL, v[i].ex.value,
                            now,
                            &v[i].view, err, sizeof err)
            != 0) {
            rlctl_store_close(&s);
            return fail(EXIT_UNREACHABLE, "%s", err);
        }
        v[i].readable = true;
        v[i].allowed = rlctl_view_allows(&v[i].view, (uint32_t)c->cost,
                                         &v[i].retry_ms);
    }
    rlctl_store_close(&s);
    return EXIT_OK;
}

/* The verdict's word: a shadow rule's reject is "reject (shadow)", it
 * never decides. */
static const char *verdict_word(const verdict *v)
{
    if (v->unlimited)
        return "unlimited";
    if (!v->readable)
        return "in each gateway";
    if (v->allowed)
        return "allow";
    return v->ex.shadow ? "reject (shadow)" : "reject";
}

static void print_verdicts(const cli *c, const rl_attr *attrs,
                           const verdict *v)
{
    if (!c->json)
        printf("%-20s %-7s %-16s %-40s %12s  %s\n", "RULE", "MODE",
               "OVERRIDE", "KEY", "LEFT", "VERDICT");
    bool first = true;
    for (size_t i = 0; i < c->cfg->n_rules; i++) {
        const rl_rule *r = v[i].view.rule;
        if (!v[i].applies)
            continue;
        uint64_t left = v[i].unlimited ? 0
                        : r->mode == RL_MODE_SYNCED
                            ? (v[i].view.estimate < r->limit
                                   ? r->limit - v[i].view.estimate : 0)
                            : v[i].view.tokens;
        const char *word = verdict_word(&v[i]);
        if (c->json) {
            printf("%s{\"rule\":", first ? "" : ",");
            rlctl_json_string(r->name);
            printf(",\"mode\":\"%s\",\"override\":", rl_mode_name(r->mode));
            rlctl_json_string(v[i].ex.label);
            printf(",\"limit\":%llu,\"period_ms\":%llu,\"key\":",
                   (unsigned long long)r->limit,
                   (unsigned long long)r->period_ms);
            rlctl_json_string(v[i].view.key);
            printf(",\"left\":%llu,\"verdict\":\"%s\",\"retry_after_ms\":"
                   "%lld}", (unsigned long long)left, word,
                   v[i].retry_ms);
        } else {
            char retry[48] = "";
            if (v[i].readable && !v[i].allowed)
                snprintf(retry, sizeof retry, v[i].retry_ms < 0
                         ? " (never: cost over the burst)"
                         : " (retry in %lld ms)", v[i].retry_ms);
            printf("%-20s %-7s %-16s %-40s %12llu  %s%s\n", r->name,
                   rl_mode_name(r->mode), v[i].ex.label,
                   v[i].readable ? v[i].view.key : "-",
                   (unsigned long long)left, word, retry);
        }
        first = false;
    }
    /* Why each rule applies or not: every rule, in config order. */
    if (c->json) {
        printf("],\"why\":[");
        for (size_t i = 0; i < c->cfg->n_rules; i++) {
            printf("%s{\"rule\":", i ? "," : "");
            rlctl_json_string(c->cfg->rules[i].name);
            putchar(',');
            rlctl_explain_json(&v[i].ex, attrs, (size_t)c->n_attrs);
            putchar('}');
        }
        return;
    }
    printf("\nwhy:\n");
    char why[1024];
    for (size_t i = 0; i < c->cfg->n_rules; i++) {
        rlctl_explain_why(&v[i].ex, attrs, (size_t)c->n_attrs, why,
                          sizeof why);
        printf("  %-20s %s\n", c->cfg->rules[i].name, why);
    }
}

/* The decision a dry run predicts: the seed's rule (reject if any rule
 * rejects; the longest retry decides). */
static bool predicted(const cli *c, const verdict *v, const rl_rule **rule,
                      long long *retry)
{
    bool allowed = true;
    *rule = NULL;
    *retry = 0;
    for (size_t i = 0; i < c->cfg->n_rules; i++) {
        if (!v[i].readable || v[i].allowed || v[i].ex.shadow)
            continue;
        bool longer = allowed || v[i].retry_ms < 0
                      || (*retry >= 0 && v[i].retry_ms > *retry);
        allowed = false;
        if (longer) {
            *rule = v[i].view.rule;
            *retry = v[i].retry_ms;
        }
    }
    return allowed;
}

/* The decision, the override that set its rule's rate (the decision's
 * own "" is the rule's: "default") and the shadow rules that would have
 * rejected. */
static int report_decision(const cli *c, const rl_decision *d, bool dry)
{
    const char *rule = d->rule;
    const char *override = d->override[0] ? d->override : "default";
    unsigned named = d->shadow_rejected < RL_SHADOW_NAMES_MAX
                         ? d->shadow_rejected : RL_SHADOW_NAMES_MAX;
    long long retry = d->retry_after_ms;
    if (c->json) {
        printf("],\"dry_run\":%s,\"allowed\":%s,\"rule\":",
               dry ? "true" : "false", d->allowed ? "true" : "false");
        rlctl_json_string(rule);
        printf(",\"override\":");
        rlctl_json_string(rule[0] ? override : "");
        printf(",\"retry_after_ms\":%lld,\"degraded\":%s,"
               "\"shadow_rejected\":%u,\"shadow_rules\":[", retry,
               d->degraded ? "true" : "false", d->shadow_rejected);
        for (unsigned i = 0; i < named; i++) {
            printf("%s", i ? "," : "");
            rlctl_json_string(d->shadow_rules[i]);
        }
        printf("]}\n");
    } else {
        printf("\ndecision:    %s%s", dry ? "would be " : "",
               d->allowed ? "allowed" : "rejected");
        if (rule[0] != '\0' && d->override[0] != '\0')
            printf(" (rule %s, override %s)", rule, override);
        else if (rule[0] != '\0')
            printf(" (rule %s)", rule);
        printf("\n");
        if (!d->allowed && retry >= 0)
            printf("retry after: %lld ms\n", retry);
        if (d->degraded)
            printf("degraded:    the store did not answer; on_error "
                   "decided\n");
        if (d->shadow_rejected > 0) {
            printf("shadow:      %u shadow rule%s would have rejected:",
                   d->shadow_rejected, d->shadow_rejected == 1 ? "" : "s");
            for (unsigned i = 0; i < named; i++)
                printf(" %s", d->shadow_rules[i]);
            printf("\n");
        }
    }
    return d->allowed ? EXIT_OK : EXIT_REJECTED;
}

/* The dry run's decision, as rl_decision says it. */
static void predicted_decision(const cli *c, const verdict *v,
                               rl_decision *d)
{
    const rl_rule *rule;
    long long retry;
    *d = (rl_decision){.allowed = predicted(c, v, &rule, &retry)};
    d->retry_after_ms = retry;
    for (size_t i = 0; i < c->cfg->n_rules; i++) {
        if (rule != NULL && v[i].view.rule == rule) {
            snprintf(d->rule, sizeof d->rule, "%s", rule->name);
            if (v[i].ex.override != NULL)
                snprintf(d->override, sizeof d->override, "%s",
                         v[i].ex.label);
        }
        if (v[i].readable && !v[i].allowed && v[i].ex.shadow) {
            if (d->shadow_rejected < RL_SHADOW_NAMES_MAX)
                snprintf(d->shadow_rules[d->shadow_rejected],
                         sizeof d->shadow_rules[0], "%s",
                         v[i].ex.rule->name);
            d->shadow_rejected++;
        }
    }
}

static int spend(cli *c, const rl_attr *attrs, rl_decision *d)
{
    rl_options o = {.config = c->cfg};
    rl_agent *agent;
    rl_error err;
    if (rl_agent_open(&agent, &o, &err) != RL_OK)
        return fail(EXIT_UNREACHABLE, "%s", err.message);
    int rc = rl_check(agent, attrs, (size_t)c->n_attrs, (uint32_t)c->cost,
                      d);
    rl_agent_close(agent);
    if (rc != RL_OK)
        return fail(rc == RL_EINVAL || rc == RL_ETOOLONG ? EXIT_USAGE
                                                          : EXIT_UNREACHABLE,
                    "the check failed: %s", rl_strerror(rc));
    return EXIT_OK;
}

static int cmd_check(cli *c)
{
    attr_arg a[RL_ATTRS_MAX];
    rl_attr attrs[RL_ATTRS_MAX];
    int rc = parse_attrs(c, a, attrs);
    if (rc != EXIT_OK)
        return rc;
    verdict *v = calloc(c->cfg->n_rules + 1, sizeof *v);
    if (v == NULL)
        return fail(EXIT_UNREACHABLE, "out of memory");
    if ((rc = read_verdicts(c, attrs, v)) != EXIT_OK) {
        free(v);
        return rc;
    }
    rl_decision d = {0};
    if (!c->dry_run && (rc = spend(c, attrs, &d)) != EXIT_OK) {
        free(v);
        return rc;
    }
    if (c->json)
        printf("{\"rules\":[");
    print_verdicts(c, attrs, v);
    if (c->dry_run)
        predicted_decision(c, v, &d);
    rc = report_decision(c, &d, c->dry_run);
    free(v);
    return rc;
}

/* --- totals -------------------------------------------------------------- */

static int cmd_totals(cli *c)
{
    if (c->rule != NULL) {
        const rl_rule *r = find_rule(c->cfg, c->rule);
        if (r == NULL)
            return fail(EXIT_USAGE, "no rule named \"%s\" in %s", c->rule,
                        c->config_path);
        if (r->mode != RL_MODE_SYNCED)
            return fail(EXIT_USAGE, "rule \"%s\" is %s: totals are kept for "
                        "synced rules (see rlctl bucket)", c->rule,
                        rl_mode_name(r->mode));
    }
    rlctl_store s;
    unsigned long long now;
    int rc = open_store(rl_config_aggregator_store(c->cfg), &s, &now);
    if (rc != EXIT_OK)
        return rc;
    rc = rlctl_totals_print(c->cfg, &s, now, c->rule, c->top, c->json);
    rlctl_store_close(&s);
    return rc;
}

/* --- agents -------------------------------------------------------------- */

static int cmd_agents(cli *c)
{
    return rlctl_agents_print(c->cfg, c->json);
}

static int cmd_watch(cli *c)
{
    return rlctl_watch(c->cfg, c->top, c->interval, c->count, c->json);
}

/* --- arguments ----------------------------------------------------------- */

static int number(const char *text, const char *what, unsigned long max,
                  unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long n = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || text[0] == '-' || n == 0 || n > max)
        return fail(EXIT_USAGE, "%s must be a whole number from 1 to %lu, "
                    "got '%s'", what, max, text);
    *out = n;
    return EXIT_OK;
}

static int parse(int argc, char **argv, cli *c, bool *help)
{
    *c = (cli){.config_path = DEFAULT_CONFIG, .top = 20, .cost = 1,
               .interval = 2};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool more = i + 1 < argc;
        int rc = EXIT_OK;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            *help = true;
        else if (strcmp(a, "--json") == 0)
            c->json = true;
        else if (strcmp(a, "--yes") == 0)
            c->yes = true;
        else if (strcmp(a, "--dry-run") == 0)
            c->dry_run = true;
        else if (strcmp(a, "--config") == 0 && more)
            c->config_path = argv[++i];
        else if (strncmp(a, "--config=", 9) == 0)
            c->config_path = a + 9;
        else if (strcmp(a, "--rule") == 0 && more)
            c->rule = argv[++i];
        else if (strcmp(a, "--diff") == 0 && more)
            c->diff = argv[++i];
        else if (strcmp(a, "--top") == 0 && more)
            rc = number(argv[++i], "--top", 100000, &c->top);
        else if (strcmp(a, "--cost") == 0 && more)
            rc = number(argv[++i], "--cost", UINT32_MAX, &c->cost);
        else if (strcmp(a, "--interval") == 0 && more)
            rc = number(argv[++i], "--interval", 3600, &c->interval);
        else if (strcmp(a, "--count") == 0 && more)
            rc = number(argv[++i], "--count", 1000000, &c->count);
        else if (strcmp(a, "--attr") == 0 && more
                 && c->n_attrs < RL_ATTRS_MAX)
            c->attrs[c->n_attrs++] = argv[++i];
        else if (a[0] != '-' && c->command == NULL)
            c->command = a;
        else if (a[0] != '-' && c->n_args < ARGS_MAX)
            c->args[c->n_args++] = a;
        else
            rc = fail(EXIT_USAGE, "unexpected argument '%s' (rlctl --help "
                      "lists the options)", a);
        if (rc != EXIT_OK)
            return rc;
    }
    return EXIT_OK;
}

/* `rlctl COMMAND --help`: that command's lines of the usage text. */
static void command_help(const char *command)
{
    static const struct {
        const char *name, *text;
    } helps[] = {
        {"config", "usage: rlctl [--config FILE] [--json] config [--diff "
                   "NEW]\n"
                   "Validates the config and shows the rules as rl reads "
                   "them, their\noverrides (an overrides_file as its count) "
                   "and the shadow rules.\n--diff NEW: what a reload from "
                   "FILE to NEW would change, one line\neach; exit 0 when "
                   "nothing, 5 when something would.\n"},
        {"bucket", "usage: rlctl [--config FILE] [--json] bucket RULE VALUE "
                   "[--attr TAG=VALUE]\n"
                   "An exact rule's bucket (tokens, time to full, TTL, "
                   "state) or a synced\nrule's window counts, read without "
                   "spending anything. A rule whose\nhash_tag names another "
                   "attribute keys on its value too: give it\nwith --attr "
                   "(without it, the untagged key).\n"},
        {"reset", "usage: rlctl [--config FILE] [--json] reset RULE VALUE "
                  "[--attr TAG=VALUE] [--yes]\nDeletes the bucket (or both "
                  "windows); asks first unless --yes.\n--attr: the value of "
                  "the rule's hash_tag, as for bucket.\n"},
        {"check", "usage: rlctl [--config FILE] [--json] check --attr "
                  "NAME=VALUE... [--cost N]\n                   [--dry-run]\n"
                  "What each rule would decide and the request's decision; "
                  "spends unless\n--dry-run. Exit 4 when rejected.\n"},
        {"totals", "usage: rlctl [--config FILE] [--json] totals [--rule R] "
                   "[--top N]\nClients of synced rules by their sliding "
                   "estimate (default top 20).\n"},
        {"agents", "usage: rlctl [--config FILE] [--json] agents\nThe agents "
                   "the aggregator heard from in the last minute (needs\n"
                   "aggregator.metrics in the config).\n"},
        {"watch", "usage: rlctl [--config FILE] [--json] watch [--top N] "
                  "[--interval S]\n                   [--count K]\nThe top "
                  "synced clients, redrawn every S seconds (default 2).\n"},
    };
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        if (command != NULL && strcmp(command, helps[i].name) == 0) {
            fputs(helps[i].text, stdout);
            fputs("\nexit codes: 0 ok, 1 usage, 2 store or aggregator "
                  "unreachable, 3 invalid\nconfig, 4 check: rejected, 5 "
                  "config --diff: changes\n", stdout);
            return;
        }
    }
    fputs(usage, stdout);
}

int main(int argc, char **argv)
{
    /* A peer gone while libuv writes to it is an error to handle (EPIPE),
     * not a reason to die: libuv leaves SIGPIPE to the program. */
    signal(SIGPIPE, SIG_IGN);
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("rlctl %s\n", rl_version());
        return EXIT_OK;
    }
    cli c;
    bool help = false;
    int rc = parse(argc, argv, &c, &help);
    if (help) {
        command_help(c.command);
        return EXIT_OK;
    }
    if (rc != EXIT_OK)
        return rc;
    if (c.command == NULL) {
        fprintf(stderr, "rlctl: no command given\n\n%s", usage);
        return EXIT_USAGE;
    }
    static const struct {
        const char *name;
        int (*fn)(cli *);
    } commands[] = {{"config", cmd_config}, {"bucket", cmd_bucket},
                    {"reset", cmd_reset},   {"check", cmd_check},
                    {"totals", cmd_totals}, {"agents", cmd_agents},
                    {"watch", cmd_watch}};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(c.command, commands[i].name) != 0)
            continue;
        if ((commands[i].fn == cmd_check || commands[i].fn == cmd_totals
             || commands[i].fn == cmd_config || commands[i].fn == cmd_agents
             || commands[i].fn == cmd_watch)
            && c.n_args > 0)
            return fail(EXIT_USAGE, "%s takes no '%s' (rlctl --help)",
                        c.command, c.args[0]);
        rl_error err;
        if (rl_config_load(c.config_path, &c.cfg, &err) != RL_OK)
            return fail(EXIT_BAD_CONFIG, "%s", err.message);
        rc = commands[i].fn(&c);
        rl_config_free(c.cfg);
        return rc;
    }
    fprintf(stderr, "rlctl: unknown command '%s'\n\n%s", c.command, usage);
    return EXIT_USAGE;
}
