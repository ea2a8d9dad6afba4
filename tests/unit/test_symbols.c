/* librl.so is linked into other people's processes: it must export its own
 * rl_ functions and nothing else. */
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

Test(symbols, shared_library_exports_only_rl_functions)
{
    char cmd[600], line[512];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only %s",
             test_env("RL_TEST_LIBRL_SO"));
    FILE *nm = popen(cmd, "r");
    cr_assert_not_null(nm);
    int exported = 0;
    bool has_load = false;
    while (fgets(line, sizeof line, nm) != NULL) {
        char addr[64], type[8], name[256];
        if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3)
            continue;
        cr_expect(strncmp(name, "rl_", 3) == 0, "exported: %s", name);
        has_load = has_load || strcmp(name, "rl_config_load") == 0;
        exported++;
    }
    cr_assert_eq(pclose(nm), 0, "nm failed");
    cr_assert(has_load, "rl_config_load is not exported");
    cr_assert_geq(exported, 5);
}
