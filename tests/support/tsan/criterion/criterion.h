/*
 * A stand-in for <criterion/criterion.h>, used only by `make tsan`.
 *
 * Why: Criterion's sandbox (BoxFort) maps its shared arena at random fixed
 * addresses that ThreadSanitizer's memory layout does not allow, so a
 * Criterion binary built with -fsanitize=thread aborts before running a
 * test ("Could not initialize inheritable arena", Criterion issue #274).
 * To run the same test files under TSan, this header gives them the part of
 * Criterion's API they use, with the same meaning: Test(suite, name)
 * registers a test, cr_assert* stop it on failure, cr_expect* record the
 * failure and go on. runner.c runs each test in its own process, as
 * Criterion does. A test that needs more of Criterion (fixtures, options,
 * parameters) will not compile here: extend this file, do not skip it.
 */
#ifndef RL_TSAN_CRITERION_H
#define RL_TSAN_CRITERION_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

void tsan_test_register(const char *suite, const char *name, void (*fn)(void));
/* No format attribute: the message is often empty (""), which GCC's format
 * check rejects; the normal Criterion build checks the same formats. */
void tsan_test_check(bool ok, bool fatal, const char *file, int line,
                     const char *what, const char *fmt, ...);

/* TestSuite(suite, .fini = f): f runs after each of the suite's tests,
 * also after one that failed an assertion, as Criterion runs it. */
struct tsan_suite_options {
    void (*fini)(void);
};
void tsan_suite_register(const char *suite, struct tsan_suite_options o);

#define TestSuite(suite, ...)                                               \
    __attribute__((constructor)) static void suite##_suite_add(void)        \
    {                                                                       \
        tsan_suite_register(#suite,                                         \
                            (struct tsan_suite_options){__VA_ARGS__});      \
    }

/* Test(suite, name, .timeout = s): the options are Criterion's; this
 * runner does without them. */
#define Test(suite, name, ...)                                              \
    static void suite##_##name##_test(void);                                \
    __attribute__((constructor)) static void suite##_##name##_add(void)     \
    {                                                                       \
        tsan_test_register(#suite, #name, suite##_##name##_test);           \
    }                                                                       \
    static void suite##_##name##_test(void)

#define TSAN_CHECK(fatal, ok, what, ...) \
    tsan_test_check((ok), (fatal), __FILE__, __LINE__, what, "" __VA_ARGS__)

#define cr_assert(c, ...) TSAN_CHECK(true, !!(c), #c, __VA_ARGS__)
#define cr_expect(c, ...) TSAN_CHECK(false, !!(c), #c, __VA_ARGS__)
#define cr_assert_not(c, ...) TSAN_CHECK(true, !(c), "!(" #c ")", __VA_ARGS__)
#define cr_assert_fail(...) TSAN_CHECK(true, false, "failed", __VA_ARGS__)
#define cr_assert_eq(a, b, ...) \
    TSAN_CHECK(true, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) \
    TSAN_CHECK(false, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) \
    TSAN_CHECK(true, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) \
    TSAN_CHECK(false, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) \
    TSAN_CHECK(true, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...) \
    TSAN_CHECK(true, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) \
    TSAN_CHECK(true, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) \
    TSAN_CHECK(false, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) \
    TSAN_CHECK(false, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) \
    TSAN_CHECK(false, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...) \
    TSAN_CHECK(true, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...) \
    TSAN_CHECK(false, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_assert_null(p, ...) \
    TSAN_CHECK(true, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_expect_null(p, ...) \
    TSAN_CHECK(false, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) \
    TSAN_CHECK(true, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) \
    TSAN_CHECK(true, strcmp((a), (b)) == 0, #a " equals " #b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) \
    TSAN_CHECK(false, strcmp((a), (b)) == 0, #a " equals " #b, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...) \
    TSAN_CHECK(true, strcmp((a), (b)) != 0, #a " differs from " #b, \
               __VA_ARGS__)
#define cr_assert_str_empty(s, ...) \
    TSAN_CHECK(true, (s)[0] == '\0', #s " is empty", __VA_ARGS__)

#endif
