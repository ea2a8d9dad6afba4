/*
 * config_check.c: rl_config_check, what rl_agent_open reads besides the
 * config itself. rl_config_load has read the rules file, its
 * overrides_files and store.password_file into memory; an agent opened
 * later still reads store.tls (for rediss://) and aggregator.tls (for
 * tls+tcp:// aggregators), and a host
 * whose workers open their agents after a fork, as another user, can have
 * those files checked with the workers' rights before it forks them.
 */
#include "config.h"
#include "error.h"
#include "nng_tls.h"
#include "redis_tls.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static bool is_tls(const char *url)
{
    return strncmp(url, "tls+tcp://", 10) == 0;
}

static bool dials_tls(const rl_aggregator_config *agg)
{
    for (size_t i = 0; i < agg->n_endpoints; i++) {
        if (is_tls(agg->endpoints[i].reports)
            || is_tls(agg->endpoints[i].totals))
            return true;
    }
    return false;
}

/* Opening first tells an unreadable file (RL_EIO, with errno's words) from
 * one whose contents the TLS library refuses (RL_ECONFIG). */
static int readable(const char *field, const char *path, rl_error *err)
{
    if (path[0] == '\0')
        return RL_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rl_error_set(err, RL_EIO, "%s: cannot read '%s': %s", field,
                            path, strerror(errno));
    close(fd);
    return RL_OK;
}

/* store.tls's files, read as rl_agent_open reads them. */
static int check_store_tls(const rl_store_tls_config *tls, rl_error *err)
{
    if (!tls->enabled)
        return RL_OK;
    int rc = readable("store.tls.ca", tls->ca, err);
    if (rc == RL_OK)
        rc = readable("store.tls.ca_dir", tls->ca_dir, err);
    if (rc == RL_OK)
        rc = readable("store.tls.cert", tls->cert, err);
    if (rc == RL_OK)
        rc = readable("store.tls.key", tls->key, err);
    if (rc != RL_OK)
        return rc;
    char why[RL_ERROR_MAX];
    rl_redis_tls *t = rl_redis_tls_new(tls, "store.tls", why, sizeof why);
    if (t == NULL)
        return rl_error_set(err, RL_ECONFIG, "%s", why);
    rl_redis_tls_free(t);
    return RL_OK;
}

int rl_config_check(const rl_config *config, rl_error *err)
{
    if (config == NULL)
        return rl_error_set(err, RL_EINVAL, "rl_config_check: config must "
                            "not be NULL");
    int rc = check_store_tls(&config->store.tls, err);
    if (rc != RL_OK)
        return rc;
    const rl_aggregator_config *agg = &config->aggregator;
    /* An agent dials its aggregators only for rules that need them, but a
     * reload may bring such rules: the files are checked whenever a
     * tls+tcp:// aggregator is configured. */
    if (!dials_tls(agg)) {
        rl_error_clear(err);
        return RL_OK;
    }
    const rl_tls_config *tls = &agg->tls;
    rc = readable("aggregator.tls.ca", tls->ca, err);
    if (rc == RL_OK)
        rc = readable("aggregator.tls.cert", tls->cert, err);
    if (rc == RL_OK)
        rc = readable("aggregator.tls.key", tls->key, err);
    if (rc != RL_OK)
        return rc;
    char why[RL_ERROR_MAX - 32];
    if (rl_nng_tls_check(tls, why, sizeof why) != 0)
        return rl_error_set(err, RL_ECONFIG, "aggregator.tls: %s", why);
    rl_error_clear(err);
    return RL_OK;
}
