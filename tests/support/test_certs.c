/*
 * test_certs.c: see test_certs.h.
 */
#include "test_certs.h"

#include "test_env.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void sh(const char *fmt, ...)
{
    char cmd[4096], out[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s\n%s", cmd, out);
}

void test_certs_dir(char *dir, size_t cap, const char *stem)
{
    snprintf(dir, cap, "%s/%s-%d", test_env("RL_TEST_TMPDIR"), stem,
             (int)getpid());
    cr_assert_eq(mkdir(dir, 0700), 0, "cannot make %s", dir);
}

void test_certs_ca(const char *dir, const char *name)
{
    sh("cd %s && openssl req -x509 -newkey rsa:2048 -nodes -days 2 "
       "-subj /CN=%s -keyout %s.key -out %s.pem 2>&1", dir, name, name, name);
}

/* x509 is the signing command's prefix (a faketime for an expired one). */
static void make_cert(const char *dir, const char *ca, const char *name,
                      const char *x509, int days)
{
    sh("cd %s && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' "
       "> %s.ext && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost "
       "-keyout %s.key -out %s.csr 2>&1 && %sopenssl x509 -req -in %s.csr "
       "-CA %s.pem -CAkey %s.key -CAcreateserial -days %d -extfile %s.ext "
       "-out %s.pem 2>&1", dir, name, name, name, x509, name, ca, ca, days,
       name, name);
}

void test_certs_cert(const char *dir, const char *ca, const char *name)
{
    make_cert(dir, ca, name, "", 2);
}

void test_certs_expired_cert(const char *dir, const char *ca,
                             const char *name)
{
    make_cert(dir, ca, name, "faketime '-3 days' ", 1);
}
