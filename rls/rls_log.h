/*
 * rls_log.h: LOG_FORMAT=json, rl's log lines as upstream writes its own
 * (logrus's JSONFormatter): one JSON object a line, with `level` (logrus's
 * names: debug, info, warning, error), `msg` (the event's name), `time`
 * (RFC 3339 with nanoseconds, UTC) and each of the line's key=value pairs
 * as a string field ("event" among them). A key logrus keeps for itself
 * is written "fields.<key>", as logrus does; words that are no pair are
 * added to msg; bytes that are not UTF-8 become U+FFFD.
 */
#ifndef RL_RLS_LOG_H
#define RL_RLS_LOG_H

#include "rl.h"

#include <stddef.h>
#include <time.h>

/* The JSON object of one of rl_log's lines (its "event=NAME k=v ..."
 * text) at level and time now, without a newline, into out (cap bytes;
 * RLS_LOG_JSON_MAX is enough for any line rl_log makes). Returns its
 * length, or 0 when it did not fit. */
#define RLS_LOG_JSON_MAX 8192
size_t rls_log_json_format(rl_log_level level, const char *line,
                           const struct timespec *now, char *out,
                           size_t cap);

/* An rl_log_fn: the line as JSON to stderr, one write. Thread-safe. */
void rls_log_json(rl_log_level level, const char *line, void *arg);

#endif
