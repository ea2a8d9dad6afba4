/*
 * log.c: formatting of log lines, in one place so that every line has the
 * same shape and a cut line is marked.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define LINE_MAX_BYTES 512

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void rl_log(const rl_logger *log, rl_log_level level, const char *event,
            const char *fmt, ...)
{
    if (log == NULL || log->fn == NULL || level < log->level)
        return;
    char line[LINE_MAX_BYTES];
    int n = snprintf(line, sizeof line, "event=%s", event);
    if (n > 0 && (size_t)n < sizeof line - 1 && fmt[0] != '\0') {
        line[n++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        va_end(ap);
        if (m > 0 && (size_t)(n + m) >= sizeof line)
            memcpy(line + sizeof line - 4, "...", 4);
    }
    log->fn(level, line, log->arg);
}

void rl_log_to_stderr(rl_log_level level, const char *line, void *arg)
{
    (void)arg;
    fprintf(stderr, "level=%s %s\n", level_names[level], line);
}

int rl_log_level_parse(const char *name, rl_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (rl_log_level)i;
            return 0;
        }
    }
    return -1;
}
