/*
 * in_flight_holder: a gateway that holds in_flight slots and is then
 * killed (test_in_flight.c): it opens an agent on Redis ADDR (a
 * cluster's seeds when it lists several, separated by commas) with one
 * rule, in_flight: N on api_key, and in_flight_lease_ms LEASE, takes
 * COUNT holds of api_key VALUE (of each, when it lists several separated
 * by commas), says "held" and how many it holds on stderr and waits to be
 * killed, renewing its slots meanwhile.
 *
 *     in-flight-holder ADDR VALUE N COUNT LEASE
 */
#include "rl.h"

#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static sem_t decided;
static int held;

static void on_hold(const rl_decision *d, rl_hold *hold, void *arg)
{
    (void)arg;
    held += d->allowed && hold != NULL;
    sem_post(&decided);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: in-flight-holder ADDR VALUE N COUNT LEASE\n");
        return 2;
    }
    char yaml[1024];
    int n = snprintf(yaml, sizeof yaml,
                     strchr(argv[1], ',') != NULL
                         ? "store: {cluster: [%s], timeout_ms: 1000}\n"
                         : "store:\n  url: redis://%s\n  timeout_ms: 1000\n",
                     argv[1]);
    n += snprintf(yaml + n, sizeof yaml - (size_t)n,
                  "in_flight_lease_ms: %s\n"
                  "rules:\n  - {name: f, match: api_key, in_flight: %s}\n",
                  argv[5], argv[3]);
    rl_config *cfg;
    rl_agent *a;
    rl_error err;
    rl_options o = {0};
    if (rl_config_parse(yaml, (size_t)n, "<holder>", &cfg, &err) != RL_OK
        || (o.config = cfg, rl_agent_open(&a, &o, &err)) != RL_OK) {
        fprintf(stderr, "in-flight-holder: %s\n", err.message);
        return 1;
    }
    sem_init(&decided, 0, 0);
    int count = atoi(argv[4]);
    for (char *value = strtok(argv[2], ","); value != NULL;
         value = strtok(NULL, ",")) {
        rl_attr attr = {"api_key", value, strlen(value)};
        for (int i = 0; i < count; i++) {
            if (rl_check_hold(a, &attr, 1, 1, on_hold, NULL) != RL_OK)
                return 1;
            while (sem_wait(&decided) != 0)
                ;
        }
    }
    fprintf(stderr, "held %d\n", held);
    for (;;)
        pause();
}
