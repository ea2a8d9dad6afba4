/* The example gateway of docs/design.md ("Using librl in a gateway"),
 * built against the installed header and the shared library, run against
 * the test Redis. */
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static int run(const char *config, const char *args, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s %s", test_env("RL_TEST_EXAMPLE"), config,
             args);
    return test_run(cmd, out, cap);
}

Test(example, check_request_allows_then_rejects_with_headers)
{
    char config[512], out[2048];
    snprintf(config, sizeof config, "%s/example.yaml",
             test_env("RL_TEST_TMPDIR"));
    FILE *f = fopen(config, "w");
    cr_assert_not_null(f);
    /* A generous deadline: a fresh process's first check connects and
     * loads the function, which a loaded machine can take past 50 ms over
     * (on_error would then allow it uncharged). */
    fprintf(f, "store: {url: \"redis://%s\", timeout_ms: 2000}\nrules:\n"
               "  - {name: per-key, match: api_key, limit: 2, period: 1m}\n",
            test_env("RL_TEST_REDIS"));
    fclose(f);
    const char *args = "api_key=example-key ip=203.0.113.42";
    cr_assert_eq(run(config, args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "allowed by rule per-key\n") != NULL, "%s", out);
    cr_assert_eq(run(config, args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(run(config, args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "rejected by rule per-key\n") != NULL, "%s", out);
    cr_assert(strstr(out, "Retry-After: ") != NULL, "%s", out);
    cr_assert_eq(run(config, "api_key=", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "invalid argument") != NULL, "%s", out);
}
