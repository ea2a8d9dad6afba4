/*
 * duration.h: periods written as a count and a unit ("500ms", "1m", "7d"),
 * kept as whole milliseconds. Private to librl.
 */
#ifndef RL_COMMON_DURATION_H
#define RL_COMMON_DURATION_H

#include <stddef.h>
#include <stdint.h>

/* The longest period a rule may have: 366 days, in ms. */
#define RL_DURATION_MAX_MS (366ULL * 24 * 3600 * 1000)

/* rl_duration_parse reads "<digits><unit>", unit one of ms, s, m, h, d,
 * into *ms. Zero, a missing unit, signs, spaces, fractions and anything over
 * RL_DURATION_MAX_MS are RL_EINVAL; *ms is untouched then. */
int rl_duration_parse(const char *text, uint64_t *ms);

/* rl_duration_format writes ms in the largest unit that divides it exactly
 * ("60000" -> "1m", "1500" -> "1500ms"). buf needs at least 24 bytes. */
void rl_duration_format(uint64_t ms, char *buf, size_t len);

#endif
