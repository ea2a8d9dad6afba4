/*
 * rl.h: the public interface of librl, fleet-wide rate limiting for API
 * gateways. This is the only header a gateway includes; every type not
 * defined here is private and may change.
 *
 * Conventions, for every function below:
 *   - Functions return RL_OK (0) or a negative RL_E* code; rl_strerror()
 *     turns a code into words. Results come back through out-parameters.
 *   - Where a user needs detail (a bad config line, say), the function takes
 *     an rl_error and fills in its message; an rl_error pointer may be NULL.
 *   - The library never aborts, exits or prints in its host process.
 */
#ifndef RL_H
#define RL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define RL_API __attribute__((visibility("default")))
#else
#define RL_API
#endif

/* Status codes. Their numbers are stable across releases. */
#define RL_OK        0
#define RL_EINVAL   -1 /* an argument is invalid (NULL, out of range) */
#define RL_ENOMEM   -2 /* out of memory */
#define RL_ECONFIG  -3 /* the config is invalid; rl_error says where */
#define RL_EIO      -4 /* a file could not be read */
#define RL_ETOOLONG -5 /* a value is longer than its limit */

/* The longest message an rl_error carries, including its terminating NUL.
 * A longer message is cut and ends in "..." so a cut is never silent. */
#define RL_ERROR_MAX 1024

/* Detail for a failed call: the same code the call returned, and a message
 * that names what to fix (for a config: file, line, field). Caller-owned;
 * functions that take one clear it on success. */
typedef struct rl_error {
    int code;
    char message[RL_ERROR_MAX];
} rl_error;

/* rl_strerror returns a short static description of a status code, or
 * "unknown error" for a code it does not know. Thread-safe. */
RL_API const char *rl_strerror(int code);

/* rl_version returns librl's version as "MAJOR.MINOR.PATCH". Thread-safe. */
RL_API const char *rl_version(void);

/* A parsed, validated rules config (store, aggregator, rules). Opaque;
 * immutable once loaded, so one config may be read by any number of threads
 * at once. */
typedef struct rl_config rl_config;

/* rl_config_load reads and validates the YAML config at path. On success
 * *out owns a new config, to be released with rl_config_free(). On failure
 * *out is NULL and the return is RL_EIO (unreadable file), RL_ECONFIG
 * (invalid content: err->message names the file, line and field), RL_EINVAL
 * (NULL argument) or RL_ENOMEM. Files over 4 MiB are refused. Thread-safe. */
RL_API int rl_config_load(const char *path, rl_config **out, rl_error *err);

/* rl_config_parse is rl_config_load for a config held in memory: yaml points
 * to len bytes (no terminating NUL needed) and name is what error messages
 * call the document (a file name, or something like "<inline>"). */
RL_API int rl_config_parse(const char *yaml, size_t len, const char *name,
                           rl_config **out, rl_error *err);

/* rl_config_free releases a config. rl_config_free(NULL) does nothing. The
 * caller must make sure no other thread still uses the config. */
RL_API void rl_config_free(rl_config *config);

#ifdef __cplusplus
}
#endif

#endif /* RL_H */
