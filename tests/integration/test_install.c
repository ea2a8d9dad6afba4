/*
 * make install: librl (static, shared with its soname, rl.h, rl.pc), the
 * programs, the unit and the example config land under DESTDIR/PREFIX, and
 * a gateway builds against the installed library with pkg-config.
 */
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The build tree the tests run from: .../lib/librl.so -> ... */
static void build_dir(char *out, size_t cap)
{
    snprintf(out, cap, "%s", test_env("RL_TEST_LIBRL_SO"));
    char *lib = strstr(out, "/lib/librl.so");
    cr_assert_not_null(lib);
    *lib = '\0';
}

static void expect_file(const char *root, const char *path)
{
    char full[1200];
    struct stat st;
    snprintf(full, sizeof full, "%s%s", root, path);
    cr_assert_eq(lstat(full, &st), 0, "%s was not installed", path);
}

Test(install, puts_everything_under_destdir_and_pkg_config_finds_it)
{
    char build[600], dest[600], cmd[4096], out[8192];
    build_dir(build, sizeof build);
    snprintf(dest, sizeof dest, "%s/destdir-%d", test_env("RL_TEST_TMPDIR"),
             (int)getpid());
    snprintf(cmd, sizeof cmd, "make -s --no-print-directory install-built "
             "BUILD=%s DESTDIR=%s PREFIX=/usr", build, dest);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    static const char *const files[] = {
        "/usr/bin/rlctl", "/usr/bin/rl-aggregator", "/usr/bin/rl-gateway",
        "/usr/lib/librl.a", "/usr/lib/librl.so", "/usr/lib/librl.so.1",
        "/usr/lib/librl.so.1.0.0", "/usr/include/rl.h",
        "/usr/lib/pkgconfig/rl.pc",
        "/usr/lib/systemd/system/rl-aggregator.service",
        "/usr/lib/systemd/system/rl-rls.service", "/usr/bin/rl-rls",
        "/etc/rl/rl.yaml",
        "/usr/lib/nginx/modules/ngx_http_rl_module.so",
        "/usr/share/nginx/modules-available/mod-http-rl.conf",
        "/etc/rl/nginx-rl.conf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        expect_file(dest, files[i]);
    snprintf(cmd, sizeof cmd, "grep -c '^ExecStart=/usr/bin/rl-aggregator "
             "--config /etc/rl/rl.yaml$' %s/usr/lib/systemd/system/"
             "rl-aggregator.service", dest);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "ExecStart: %s", out);
    snprintf(cmd, sizeof cmd, "grep -c '^ExecStart=/usr/bin/rl-rls$' "
             "%s/usr/lib/systemd/system/rl-rls.service", dest);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "rl-rls's ExecStart: %s",
                 out);
    snprintf(cmd, sizeof cmd, "readelf -d %s/usr/lib/librl.so.1.0.0 | grep "
             "SONAME", dest);
    test_run(cmd, out, sizeof out);
    cr_assert(strstr(out, "[librl.so.1]") != NULL, "soname: %s", out);
    /* The build's archive carries LTO bytecode; the installed one must
     * not, so that any compiler links it. */
    snprintf(cmd, sizeof cmd, "readelf -S %s/usr/lib/librl.a | grep -c "
             "'gnu.lto_' || true", dest);
    test_run(cmd, out, sizeof out);
    cr_assert_str_eq(out, "0\n", "LTO sections installed: %s", out);
    /* A gateway built the way docs/operations.md says, against the install. */
    snprintf(cmd, sizeof cmd,
             "PKG_CONFIG_SYSROOT_DIR=%s PKG_CONFIG_LIBDIR=%s/usr/lib/pkgconfig "
             "sh -c 'cc -o %s/check-request %s/check_request.c "
             "$(pkg-config --cflags --libs rl)' && readelf -d "
             "%s/check-request | grep NEEDED", dest, dest, dest,
             "examples", dest);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "[librl.so.1]") != NULL, "NEEDED: %s", out);
    /* A second install keeps an operator's config. */
    snprintf(cmd, sizeof cmd, "echo '# mine' > %s/etc/rl/rl.yaml && make -s "
             "--no-print-directory install-built BUILD=%s DESTDIR=%s "
             "PREFIX=/usr", dest, build, dest);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "cat %s/etc/rl/rl.yaml", dest);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "# mine\n", "the config was overwritten");
}
