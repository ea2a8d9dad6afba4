/*
 * reload.c: SIGHUP. The config file and its tenant map are read again;
 * only when both are valid does the agent get the new rules
 * (rl_agent_reload_config), and only when it took them do the gateway's
 * own tables (tenant map, header attributes, routes) switch: so a refused
 * reload leaves everything as it was. Runs on the loop thread, between two
 * callbacks, so no request is half-way through the gateway's tables; the
 * agent lets checks in flight finish under their old rules. Connections
 * are never touched.
 */
#include "gateway.h"

#include "config_diff.h"

#include <stdio.h>
#include <string.h>

/* A relative tenant map path is relative to the config file's folder. */
int gw_load_tenants(const rl_config *cfg, const char *config_path,
                    gw_tenant_map **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *map = cfg->gateway.tenant_map;
    if (map[0] == '\0')
        return 0;
    char path[RL_PATH_MAX * 2 + 2];
    const char *slash = strrchr(config_path, '/');
    if (map[0] == '/' || slash == NULL)
        snprintf(path, sizeof path, "%s", map);
    else
        snprintf(path, sizeof path, "%.*s/%s", (int)(slash - config_path),
                 config_path, map);
    return gw_tenant_map_load(path, out, err, errlen);
}

static void refused(gw_server *srv, const char *why)
{
    srv->reloads_failed++;
    rl_log(&srv->log, RL_LOG_ERROR, "reload_failed", "reason=\"%s\" "
           "kept=old rules=%zu", why, srv->config->n_rules);
}

/* One line per change, then the summary. */
static void log_changes(gw_server *srv, const rl_config_diff *d,
                        const rl_config *fresh, size_t tenants)
{
    for (size_t i = 0; i < d->n; i++)
        rl_log(&srv->log, RL_LOG_INFO, "reload_change", "change=\"%s\"",
               d->lines[i]);
    rl_log(&srv->log, RL_LOG_INFO, "reloaded", "rules=%zu added=%zu "
           "removed=%zu changed=%zu overrides=%zu overrides_before=%zu "
           "tenants=%zu", fresh->n_rules, d->rules_added, d->rules_removed,
           d->rules_changed, d->overrides_after, d->overrides_before,
           tenants);
}

void gw_reload(gw_server *srv)
{
    rl_config *fresh;
    rl_error err;
    rl_log(&srv->log, RL_LOG_INFO, "reloading", "config=%s",
           srv->config_path);
    if (rl_config_load(srv->config_path, &fresh, &err) != RL_OK) {
        refused(srv, err.message);
        return;
    }
    gw_tenant_map *tenants;
    char why[512];
    if (gw_load_tenants(fresh, srv->config_path, &tenants, why, sizeof why)
        != 0) {
        rl_config_free(fresh);
        refused(srv, why);
        return;
    }
    rl_config_diff diff;
    bool have_diff = rl_config_diff_make(srv->config, fresh, &diff) == RL_OK;
    if (rl_agent_reload_config(srv->agent, fresh, &err) != RL_OK) {
        if (have_diff)
            rl_config_diff_fini(&diff);
        gw_tenant_map_free(tenants);
        rl_config_free(fresh);
        refused(srv, err.message);
        return;
    }
    /* The agent owns fresh now. The previous config stays readable until
     * this reload returned (the agent's promise); the one the agent was
     * opened with is ours and is freed at exit. */
    srv->config = fresh;
    gw_attrs_collect(srv);
    gw_tenant_map_free(srv->tenants);
    srv->tenants = tenants;
    srv->reloads++;
    if (have_diff) {
        log_changes(srv, &diff, fresh, gw_tenant_map_size(tenants));
        rl_config_diff_fini(&diff);
    } else {
        rl_log(&srv->log, RL_LOG_INFO, "reloaded", "rules=%zu tenants=%zu "
               "changes=unknown (out of memory)", fresh->n_rules,
               gw_tenant_map_size(tenants));
    }
}
