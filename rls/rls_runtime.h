/*
 * rls_runtime.h: the loaded config of envoyproxy/ratelimit's runtime
 * layout, and its reloads. The files are read from RUNTIME_ROOT /
 * RUNTIME_SUBDIRECTORY / RUNTIME_APPDIRECTORY, named as upstream's runtime
 * names them ("config.limits.yaml" with RUNTIME_WATCH_ROOT, the default;
 * "limits.yaml" without), and loaded whole: a load that fails keeps the
 * config before it. A change is seen by a fingerprint of the files (path,
 * size, modification time), taken every second by the caller's timer, as
 * upstream's watcher sees a write or a swapped symlink.
 *
 * Threads: loads run on one thread (the main loop's); rls_runtime_get and
 * rls_snapshot_put on any: a snapshot stays valid while its holder keeps
 * a reference, whatever loads meanwhile.
 */
#ifndef RL_RLS_RUNTIME_H
#define RL_RLS_RUNTIME_H

#include "rls_config.h"
#include "rls_settings.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct rls_snapshot {
    rls_config *cfg;
    atomic_int refs;
} rls_snapshot;

typedef struct rls_runtime {
    pthread_mutex_t lock;
    rls_snapshot *current;    /* NULL until a load succeeds */
    char dir[PATH_MAX];
    char prefix[256];
    bool ignore_dotfiles;
    bool merge;
    bool synced;              /* mode: synced can be served (set by the
                               * caller: rl-rls has an aggregator) */
    uint64_t fingerprint;     /* of the files the last load read */
} rls_runtime;

/* rls_runtime_init takes the layout from the settings; nothing is read
 * yet. -1 with err when the path is too long. */
int rls_runtime_init(rls_runtime *rt, const rls_settings *s, char *err,
                     size_t cap);

/* rls_runtime_load reads every file and makes them the current config. 0;
 * -1 with upstream's message in err, the current config kept. */
int rls_runtime_load(rls_runtime *rt, char *err, size_t cap);

/* Whether the files differ from those the last load read (or tried to:
 * a bad file is not read again until it changes). */
bool rls_runtime_changed(rls_runtime *rt);

/* The current config, referenced (NULL when none has loaded); the holder
 * gives it back with rls_snapshot_put. */
rls_snapshot *rls_runtime_get(rls_runtime *rt);
void rls_snapshot_put(rls_snapshot *s);

void rls_runtime_fini(rls_runtime *rt);

#endif
