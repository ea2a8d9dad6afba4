/*
 * cost.c: holds, a request's charge kept open for its upstream exchange
 * (rl_check_hold). With gateway.cost_header, the request holds
 * gateway.cost_estimate and its upstream's response says what it cost;
 * the hold is ended with that cost when the exchange ends. With an
 * in_flight rule, the hold is the request's slot, released at that end. An exchange
 * that ends without a usable value (no response, no header, a value that
 * is not a cost) is charged its estimate: never nothing, never forgotten.
 */
#include "gateway.h"

#include "config_loader.h"

#include <stdio.h>

bool gw_holds(const gw_server *srv)
{
    return srv->config->gateway.cost_header[0] != '\0'
           || rl_config_has_in_flight(srv->config);
}

uint32_t gw_cost_estimate(const gw_server *srv)
{
    const rl_gateway_config *gw = &srv->config->gateway;
    return gw->cost_header[0] != '\0' ? gw->cost_estimate : 1;
}

/* The cost resp's header names, or the estimate, logged with why. */
static uint32_t actual_cost(gw_server *srv, const gw_message *resp,
                           uint32_t estimate, const char *peer_ip)
{
    const char *name = srv->config->gateway.cost_header;
    if (resp == NULL || name[0] == '\0')
        return estimate;
    const char *value = gw_message_header(resp, name);
    char why[160];
    uint64_t n;
    if (value == NULL)
        snprintf(why, sizeof why, "the response has no %s header", name);
    else if (rl_config_parse_u64(value, 0, UINT32_MAX, &n, why, sizeof why))
        return (uint32_t)n;
    /* A value is the upstream's: only its start goes to the log. */
    rl_log(&srv->log, RL_LOG_WARN, "cost_estimate_charged",
           "peer=%s header=%s estimate=%u reason=\"%.120s\"", peer_ip, name,
           estimate, why);
    return estimate;
}

void gw_cost_end(gw_server *srv, rl_hold *hold, uint32_t estimate,
                 const gw_message *resp, const char *peer_ip)
{
    rl_hold_end(hold, actual_cost(srv, resp, estimate, peer_ip));
}
