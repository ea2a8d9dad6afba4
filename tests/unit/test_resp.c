/*
 * The store's own command formatting against hiredis's: byte for byte the
 * same, for empty, binary and long arguments and around the lengths where
 * a count gains a digit.
 */
#include "resp.h"

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void same_as_hiredis(int argc, const char *const *argv,
                            const size_t *lens)
{
    char *want;
    long long want_len = redisFormatCommandArgv(&want, argc,
                                                (const char **)argv, lens);
    cr_assert_gt(want_len, 0);
    size_t len = rl_resp_length(argc, lens);
    cr_assert_eq(len, (size_t)want_len, "length %zu, hiredis %lld", len,
                 want_len);
    char *got = malloc(len);
    cr_assert_eq(rl_resp_format(got, argc, argv, lens), len);
    cr_assert(memcmp(got, want, len) == 0, "differs from hiredis");
    free(got);
    redisFreeCommand(want);
}

Test(resp, formats_a_check_as_hiredis_does)
{
    const char *argv[] = {"FCALL", "rl_2_bucket", "1", "rl:key:ak_abc123",
                          "100", "100", "60000", "1"};
    size_t lens[8];
    for (int i = 0; i < 8; i++)
        lens[i] = strlen(argv[i]);
    same_as_hiredis(8, argv, lens);
}

Test(resp, empty_binary_and_long_arguments)
{
    static char big[100001];
    memset(big, 'x', sizeof big);
    const char *argv[] = {"SET", "", "a\r\nb\0c", big, big, big};
    size_t lens[] = {3, 0, 6, 9, 10, sizeof big};
    for (int n = 1; n <= 6; n++)
        same_as_hiredis(n, argv, lens);
    /* Ten and more arguments: the count gains a digit. */
    const char *many[12];
    size_t many_lens[12];
    for (int i = 0; i < 12; i++) {
        many[i] = big;
        many_lens[i] = (size_t)i * 11;
    }
    same_as_hiredis(12, many, many_lens);
}

/* The cost argument, as snprintf("%lld") writes it, at the edges. */
Test(resp, decimal_is_what_snprintf_writes)
{
    const long long values[] = {0, 1, 9, 10, 99, 100, -1, -9, -10, 12345,
                                -12345, 4294967296LL, LLONG_MAX, LLONG_MIN,
                                LLONG_MIN + 1};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        char want[32], got[32];
        int n = snprintf(want, sizeof want, "%lld", values[i]);
        memset(got, 'x', sizeof got);
        cr_assert_eq(rl_resp_decimal(got, values[i]), (size_t)n);
        cr_assert_str_eq(got, want);
    }
}

/* Rates and lengths, as snprintf("%llu") writes them, at the edges. */
Test(resp, unsigned_is_what_snprintf_writes)
{
    const unsigned long long values[] = {0, 1, 9, 10, 99, 100, 12345,
                                         9007199254740992ULL, LLONG_MAX,
                                         (unsigned long long)LLONG_MAX + 1,
                                         ULLONG_MAX - 1, ULLONG_MAX};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        char want[32], got[32];
        int n = snprintf(want, sizeof want, "%llu", values[i]);
        memset(got, 'x', sizeof got);
        cr_assert_eq(rl_resp_unsigned(got, values[i]), (size_t)n);
        cr_assert_str_eq(got, want);
    }
}
