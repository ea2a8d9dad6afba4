/*
 * cost.c: holds, a request's charge kept open for its upstream exchange
 * (rl_check_hold). With gateway.cost_header, the request holds
 * gateway.cost_estimate and its upstream's response says what it cost;
 * the hold is ended with that cost when the exchange ends. With an
 * in_flight rule, the hold is the request's slot, released at that end. An exchange
 * that ends without a usable value (no response, no header, a value that
 * is not a cost) is charged its estimate: never nothing, never forgotten.
 * The header and the estimate are those in force at the request's check:
 * a reload during its exchange does not change what it is charged by.
 */
#include "gateway.h"

#include "config_loader.h"

#include <stdio.h>

bool gw_holds(const gw_server *srv)
{
    return srv->config->gateway.cost_header[0] != '\0'
           || rl_config_has_in_flight(srv->config);
}

void gw_cost_of(const gw_server *srv, gw_cost *out)
{
    const rl_gateway_config *gw = &srv->config->gateway;
    out->estimate = gw->cost_header[0] != '\0' ? gw->cost_estimate : 1;
    snprintf(out->header, sizeof out->header, "%s", gw->cost_header);
}

/* The cost resp's header names, or the estimate, logged with why. */
static uint32_t actual_cost(gw_server *srv, const gw_message *resp,
                           const gw_cost *cost, const char *peer_ip)
{
    const char *name = cost->header;
    if (resp == NULL || name[0] == '\0')
        return cost->estimate;
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
           cost->estimate, why);
    return cost->estimate;
}

void gw_cost_end(gw_server *srv, rl_hold *hold, const gw_cost *cost,
                 const gw_message *resp, const char *peer_ip)
{
    rl_hold_end(hold, actual_cost(srv, resp, cost, peer_ip));
}
