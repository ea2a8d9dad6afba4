/*
 * check_request.c: the smallest complete gateway-side use of librl. It
 * opens an agent on a config, checks one request described on the command
 * line, and prints the decision and the headers a gateway would send.
 *
 *   check-request CONFIG [COST] NAME=VALUE...
 *   check-request configs/rules.example.yaml ip=203.0.113.42 api_key=ak_abc123
 *
 * Exit status: 0 allowed, 1 rejected (the gateway's 429), 2 error.
 */
#include <rl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s CONFIG [COST] NAME=VALUE...\n", argv[0]);
        return 2;
    }
    rl_agent *agent;
    rl_error err;
    rl_options options = {.config_path = argv[1]};
    if (rl_agent_open(&agent, &options, &err) != RL_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }

    int first = 2;
    uint32_t cost = 1;
    if (strchr(argv[2], '=') == NULL) {
        cost = (uint32_t)strtoul(argv[2], NULL, 10);
        first = 3;
    }
    rl_attr attrs[RL_ATTRS_MAX];
    size_t n = 0;
    for (int i = first; i < argc && n < RL_ATTRS_MAX; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq == NULL) {
            fprintf(stderr, "'%s' is not NAME=VALUE\n", argv[i]);
            rl_agent_close(agent);
            return 2;
        }
        *eq = '\0';
        attrs[n++] = (rl_attr){argv[i], eq + 1, strlen(eq + 1)};
    }

    /* Blocks for one round trip to Redis at most, and never past the
     * configured deadline: if Redis does not answer, on_error decides. */
    rl_decision d;
    int rc = rl_check(agent, attrs, n, cost, &d);
    if (rc != RL_OK) {
        /* Bad input (an over-long value, say): answer 400, not 429. */
        fprintf(stderr, "rl_check: %s\n", rl_strerror(rc));
        rl_agent_close(agent);
        return 2;
    }
    char headers[512];
    rl_format_headers(&d, headers, sizeof headers);
    printf("%s%s%s\n%s", d.allowed ? "allowed" : "rejected",
           d.rule[0] ? " by rule " : "", d.rule,
           d.degraded ? "(degraded: the store did not answer)\n" : "");
    fputs(headers, stdout);
    rl_agent_close(agent);
    return d.allowed ? 0 : 1;
}
