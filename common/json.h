/*
 * json.h: JSON string literals, for the bodies librl formats and
 * rl-gateway writes. Private to librl and rl-gateway.
 */
#ifndef RL_COMMON_JSON_H
#define RL_COMMON_JSON_H

#include <stddef.h>

/* rl_json_quote writes s as a quoted JSON string into out (cap bytes, NUL
 * included; out may be NULL when cap is 0) and returns the length the
 * whole literal needs without its NUL, as snprintf does: a return of cap
 * or more means out holds a cut, still NUL-terminated, prefix. Quotes,
 * backslashes and control bytes are escaped; other bytes (UTF-8
 * included) pass as they are. */
size_t rl_json_quote(char *out, size_t cap, const char *s);

#endif
