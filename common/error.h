/*
 * error.h: status codes into words, and the one place an rl_error's message
 * is written. Private to librl.
 */
#ifndef RL_COMMON_ERROR_H
#define RL_COMMON_ERROR_H

#include "rl.h"

/* rl_error_set fills err (if not NULL) with code and a printf-style message
 * and returns code, so that a failure can be reported in one statement. A
 * message longer than RL_ERROR_MAX is cut and ends in "...". */
int rl_error_set(rl_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* rl_error_clear marks err (if not NULL) as no error. */
void rl_error_clear(rl_error *err);

#endif
