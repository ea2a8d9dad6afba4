/*
 * error.c: status codes into words, and the one place an rl_error's message
 * is written, so that every message is terminated and every cut is marked.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define RL_VERSION_STRING "0.1.0"

const char *rl_strerror(int code)
{
    switch (code) {
    case RL_OK:       return "ok";
    case RL_EINVAL:   return "invalid argument";
    case RL_ENOMEM:   return "out of memory";
    case RL_ECONFIG:  return "invalid config";
    case RL_EIO:      return "file could not be read";
    case RL_ETOOLONG: return "value too long";
    case RL_ECLOSED:  return "agent is shut down";
    case RL_EFORKED:  return "agent was opened in another process";
    case RL_ENOTSUP:  return "not supported by this build";
    case RL_ESYS:     return "system resource unavailable";
    case RL_EAGAIN:   return "deciding would wait for the store";
    default:          return "unknown error";
    }
}

const char *rl_version(void)
{
    return RL_VERSION_STRING;
}

int rl_error_set(rl_error *err, int code, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    if (n < 0) {
        snprintf(err->message, sizeof err->message, "%s", rl_strerror(code));
    } else if ((size_t)n >= sizeof err->message) {
        memcpy(err->message + sizeof err->message - 4, "...", 4);
    }
    return code;
}

void rl_error_clear(rl_error *err)
{
    if (err == NULL)
        return;
    err->code = RL_OK;
    err->message[0] = '\0';
}
