/*
 * gRPC's framing as rl-rls reads and writes it: messages split across DATA
 * frames at every byte, the cap on a message, compression refused, a
 * second message in a unary call, grpc-timeout's grammar, grpc-message's
 * escapes.
 */
#include "rls_grpc.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static size_t frame(uint8_t *out, const char *body, size_t len)
{
    rls_grpc_prefix(out, (uint32_t)len);
    memcpy(out + 5, body, len);
    return len + 5;
}

Test(rls_grpc, a_message_split_at_every_byte_is_read_whole)
{
    uint8_t wire[64];
    size_t n = frame(wire, "hello world", 11);
    for (size_t cut = 0; cut <= n; cut++) {
        rls_grpc_reader r;
        rls_grpc_reader_init(&r, 1024);
        size_t used;
        rls_grpc_read rc = rls_grpc_reader_feed(&r, wire, cut, &used);
        cr_assert_eq(used, cut);
        if (cut < n) {
            cr_assert_eq(rc, RLS_GRPC_MORE, "cut %zu", cut);
            rc = rls_grpc_reader_feed(&r, wire + cut, n - cut, &used);
            cr_assert_eq(used, n - cut);
        }
        cr_assert_eq(rc, RLS_GRPC_MESSAGE, "cut %zu", cut);
        cr_assert_eq(r.length, 11);
        cr_assert_eq(memcmp(r.body, "hello world", 11), 0);
        rls_grpc_reader_free(&r);
    }
}

Test(rls_grpc, empty_large_compressed_and_second_messages)
{
    uint8_t wire[64];
    rls_grpc_reader r;
    size_t used;
    /* An empty message (a request with every field at its default). */
    rls_grpc_reader_init(&r, 16);
    size_t n = frame(wire, "", 0);
    cr_expect_eq(rls_grpc_reader_feed(&r, wire, n, &used), RLS_GRPC_MESSAGE);
    cr_expect_eq(r.length, 0);
    /* A second one: a unary call carries one. */
    cr_expect_eq(rls_grpc_reader_feed(&r, wire, n, &used), RLS_GRPC_SECOND);
    rls_grpc_reader_free(&r);
    /* One over the cap is refused from its prefix, nothing allocated. */
    rls_grpc_reader_init(&r, 16);
    uint8_t big[5];
    rls_grpc_prefix(big, 0xffffffffu);
    cr_expect_eq(rls_grpc_reader_feed(&r, big, 5, &used), RLS_GRPC_TOO_LARGE);
    cr_expect_null(r.body);
    rls_grpc_reader_free(&r);
    /* Exactly the cap is taken. */
    rls_grpc_reader_init(&r, 16);
    n = frame(wire, "0123456789abcdef", 16);
    cr_expect_eq(rls_grpc_reader_feed(&r, wire, n, &used), RLS_GRPC_MESSAGE);
    rls_grpc_reader_free(&r);
    /* The compressed flag: no grpc-encoding is accepted. */
    rls_grpc_reader_init(&r, 16);
    n = frame(wire, "x", 1);
    wire[0] = 1;
    cr_expect_eq(rls_grpc_reader_feed(&r, wire, n, &used),
                 RLS_GRPC_COMPRESSED);
    rls_grpc_reader_free(&r);
}

Test(rls_grpc, grpc_timeout_as_the_grammar_says)
{
    static const struct {
        const char *v;
        uint64_t ms;
    } ok[] = {{"20m", 20},      {"1S", 1000},  {"2M", 120000},
              {"1H", 3600000},  {"1500u", 2},  {"1000u", 1},
              {"1n", 1},        {"0m", 0},     {"99999999m", 99999999},
              {"99999999H", 99999999ULL * 3600000}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        uint64_t ms = 7;
        cr_expect_eq(rls_grpc_timeout_ms(ok[i].v, strlen(ok[i].v), &ms), 0,
                     "%s", ok[i].v);
        cr_expect_eq(ms, ok[i].ms, "%s: %llu", ok[i].v,
                     (unsigned long long)ms);
    }
    static const char *const bad[] = {"", "m", "20", "20s", "-1S", "1.5S",
                                      "123456789m", "20 m", "S1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint64_t ms;
        cr_expect_neq(rls_grpc_timeout_ms(bad[i], strlen(bad[i]), &ms), 0,
                      "'%s'", bad[i]);
    }
}

Test(rls_grpc, grpc_message_is_percent_encoded)
{
    char out[64];
    cr_expect_eq(rls_grpc_percent_encode("no domain", out, sizeof out), 9);
    cr_expect_str_eq(out, "no domain");
    rls_grpc_percent_encode("100% \xc3\xa9\n", out, sizeof out);
    cr_expect_str_eq(out, "100%25 %C3%A9%0A");
    /* Cut before an escape that does not fit, never inside it. */
    char small[5];
    cr_expect_eq(rls_grpc_percent_encode("ab\ncd", small, sizeof small), 2);
    cr_expect_str_eq(small, "ab");
}

Test(rls_grpc, a_claimed_length_is_not_allocated_before_its_bytes_come)
{
    enum { LEN = 3 << 20 };
    uint8_t *wire = malloc(LEN + 5);
    cr_assert_not_null(wire);
    rls_grpc_prefix(wire, LEN);
    for (size_t i = 0; i < LEN; i++)
        wire[5 + i] = (uint8_t)(i % 251);
    rls_grpc_reader r;
    rls_grpc_reader_init(&r, 4 << 20);
    size_t used;
    /* The prefix alone: a buffer for a small message, not for 3 MiB. */
    cr_assert_eq(rls_grpc_reader_feed(&r, wire, 5, &used), RLS_GRPC_MORE);
    cr_expect_leq(r.cap, 16385);
    /* Then the body in DATA-sized pieces, the buffer growing with it. */
    size_t at = 5;
    rls_grpc_read rc = RLS_GRPC_MORE;
    while (at < LEN + 5) {
        size_t n = LEN + 5 - at < 16384 ? LEN + 5 - at : 16384;
        rc = rls_grpc_reader_feed(&r, wire + at, n, &used);
        cr_assert_eq(used, n);
        cr_expect_leq(r.cap, 2 * (at + n) + 1);
        at += n;
    }
    cr_assert_eq(rc, RLS_GRPC_MESSAGE);
    cr_expect_eq(r.length, LEN);
    cr_expect_eq(memcmp(r.body, wire + 5, LEN), 0);
    rls_grpc_reader_free(&r);
    free(wire);
}
