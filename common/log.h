/*
 * log.h: one line per event, key=value, with a stable event name first
 * ("event=store_connected addr=127.0.0.1:6379"). The library hands lines to
 * the host's callback and never prints; a daemon passes a callback that
 * writes to stderr. Private to rl.
 */
#ifndef RL_COMMON_LOG_H
#define RL_COMMON_LOG_H

#include "rl.h"

typedef struct rl_logger {
    rl_log_fn fn;       /* NULL: log nothing */
    void *arg;
    rl_log_level level; /* lines below it are not even formatted */
} rl_logger;

/* rl_log formats "event=EVENT " followed by fmt and hands the line to the
 * logger. Lines longer than 512 bytes are cut and end in "...". */
void rl_log(const rl_logger *log, rl_log_level level, const char *event,
            const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* For rl's daemons: writes "level=LEVEL " and the line to stderr (the
 * journal, under systemd). */
void rl_log_to_stderr(rl_log_level level, const char *line, void *arg);

/* Reads a level's name (debug, info, warn, error); -1 for anything else. */
int rl_log_level_parse(const char *name, rl_log_level *out);

#endif
