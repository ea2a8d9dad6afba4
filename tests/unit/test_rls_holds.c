/*
 * rl-rls's table of holds (rls_holds.h), with no agent: a name's first
 * call opens, its next ends; a rejected name is kept for its stream-done
 * call and let go after the timeout; the table refuses past its bound,
 * logging; a check that has not answered when its stream-done call comes
 * is ended when it does. Holds themselves (rl_hold) are rls_holds::*'s,
 * through rl-rls.
 */
#include "rls_holds.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char logged[512];

static void keep_line(rl_log_level level, const char *line, void *arg)
{
    (void)level, (void)arg;
    snprintf(logged, sizeof logged, "%s", line);
}

static const rl_logger logger = {keep_line, NULL, RL_LOG_DEBUG};

static rls_holds_taken take(rls_holds *t, const char *key,
                            rls_hold_entry **e)
{
    return rls_holds_take(t, key, strlen(key), 500, 700, e);
}

Test(rls_holds_table, a_rejected_name_ends_its_stream_done_call_once)
{
    rls_holds *t = rls_holds_new(10, 60000, &logger);
    rls_hold_entry *e = NULL, *unused = NULL;
    cr_assert_eq(take(t, "a", &e), RLS_HOLDS_OPENED);
    rls_holds_decided(t, e, NULL);
    cr_assert_eq(take(t, "a", &unused), RLS_HOLDS_ENDED);
    /* Ended: the name is free again, a new request's. */
    cr_assert_eq(take(t, "a", &e), RLS_HOLDS_OPENED);
    rls_holds_decided(t, e, NULL);
    rls_holds_free(t);
}

Test(rls_holds_table, a_stream_done_call_before_the_answer_waits_for_it)
{
    rls_holds *t = rls_holds_new(10, 60000, &logger);
    rls_hold_entry *e = NULL, *unused = NULL;
    cr_assert_eq(take(t, "a", &e), RLS_HOLDS_OPENED);
    cr_assert_eq(take(t, "a", &unused), RLS_HOLDS_ENDED);
    /* Out of the table at once: the name is a new request's. */
    rls_hold_entry *next = NULL;
    cr_assert_eq(take(t, "a", &next), RLS_HOLDS_OPENED);
    rls_holds_decided(t, e, NULL); /* frees the ended one */
    rls_holds_decided(t, next, NULL);
    rls_holds_free(t);
}

Test(rls_holds_table, past_its_bound_a_name_is_refused_and_logged)
{
    rls_holds *t = rls_holds_new(2, 60000, &logger);
    rls_hold_entry *a = NULL, *b = NULL, *c = NULL;
    logged[0] = '\0';
    cr_assert_eq(take(t, "a", &a), RLS_HOLDS_OPENED);
    cr_assert_eq(take(t, "b", &b), RLS_HOLDS_OPENED);
    cr_assert_eq(take(t, "c", &c), RLS_HOLDS_FULL);
    cr_assert_null(c);
    cr_assert(strstr(logged, "event=rls_holds_full holds=2") != NULL,
              "%s", logged);
    rls_holds_decided(t, a, NULL);
    rls_holds_decided(t, b, NULL);
    /* a's stream-done call makes room. */
    cr_assert_eq(take(t, "a", &c), RLS_HOLDS_ENDED);
    cr_assert_eq(take(t, "c", &c), RLS_HOLDS_OPENED);
    rls_holds_decided(t, c, NULL);
    rls_holds_free(t);
}

Test(rls_holds_table, names_are_let_go_after_the_timeout)
{
    rls_holds *t = rls_holds_new(10, 50, &logger);
    rls_hold_entry *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(take(t, "a", &a), RLS_HOLDS_OPENED);
    rls_holds_decided(t, a, NULL);
    cr_assert_eq(take(t, "b", &b), RLS_HOLDS_OPENED); /* not answered */
    usleep(80 * 1000);
    /* a rejected and b unanswered past the timeout: both let go, so
     * their names open again (b's check, answering late, is ended). */
    cr_assert_eq(take(t, "a", &a), RLS_HOLDS_OPENED);
    cr_assert_eq(take(t, "b", &c), RLS_HOLDS_OPENED);
    rls_holds_decided(t, b, NULL);
    rls_holds_decided(t, a, NULL);
    rls_holds_decided(t, c, NULL);
    rls_holds_free(t);
}
