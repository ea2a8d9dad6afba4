/*
 * test_certs.h: CAs and certificates made with openssl for the TLS tests,
 * in a directory of the test's own.
 */
#ifndef RL_TEST_CERTS_H
#define RL_TEST_CERTS_H

#include <stddef.h>

/* A fresh directory under RL_TEST_TMPDIR named after stem and the test's
 * process, into dir. */
void test_certs_dir(char *dir, size_t cap, const char *stem);

/* A CA: dir/name.pem and dir/name.key. */
void test_certs_ca(const char *dir, const char *name);

/* A certificate ca signs for 127.0.0.1 and localhost (CN localhost):
 * dir/name.pem and dir/name.key. */
void test_certs_cert(const char *dir, const char *ca, const char *name);

/* The same, valid for a day that ended two days ago (made under
 * faketime). */
void test_certs_expired_cert(const char *dir, const char *ca,
                             const char *name);

#endif
