/*
 * resp.h: a command in Redis's wire format (RESP), written straight into a
 * caller's buffer. Private to rl.
 */
#ifndef RL_COMMON_RESP_H
#define RL_COMMON_RESP_H

#include <stddef.h>

/* rl_resp_length is the size of argc arguments of lens as one command. */
size_t rl_resp_length(int argc, const size_t *lens);

/* rl_resp_format writes the command into out, which holds at least
 * rl_resp_length(argc, lens) bytes; returns the bytes written. */
size_t rl_resp_format(char *out, int argc, const char *const *argv,
                      const size_t *lens);

/* rl_resp_decimal writes v in decimal into out (room for 21 bytes), NUL
 * terminated; returns its length. A check formats its cost with it on
 * every call, where snprintf was 2 % of the agent's time. */
size_t rl_resp_decimal(char *out, long long v);

/* rl_resp_unsigned: the same for an unsigned v (room for 21 bytes). */
size_t rl_resp_unsigned(char *out, unsigned long long v);

#endif
