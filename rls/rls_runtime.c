/*
 * rls_runtime.c: the runtime layout's config, loaded, swapped and watched
 * (rls_runtime.h).
 */
#include "rls_runtime.h"

#include "keys.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int rls_runtime_init(rls_runtime *rt, const rls_settings *s, char *err,
                     size_t cap)
{
    memset(rt, 0, sizeof *rt);
    pthread_mutex_init(&rt->lock, NULL);
    rt->ignore_dotfiles = s->runtime_ignoredotfiles;
    rt->merge = s->merge_domain_config;
    int n = snprintf(rt->dir, sizeof rt->dir, "%s/%s/%s", s->runtime_root,
                     s->runtime_subdirectory, s->runtime_appdirectory);
    int p = snprintf(rt->prefix, sizeof rt->prefix, "%s%s",
                     s->runtime_watch_root ? s->runtime_appdirectory : "",
                     s->runtime_watch_root ? "." : "");
    if (n < 0 || (size_t)n >= sizeof rt->dir || p < 0
        || (size_t)p >= sizeof rt->prefix) {
        snprintf(err, cap, "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/"
                 "RUNTIME_APPDIRECTORY is longer than %zu bytes",
                 sizeof rt->dir - 1);
        return -1;
    }
    return 0;
}

/* Mixes every file's path, size and modification time under dir into *h
 * (the walk follows symlinks, as the load does). */
static void fingerprint_dir(const char *dir, bool ignore_dot, uint64_t *h,
                            int depth)
{
    DIR *d = depth < 32 ? opendir(dir) : NULL;
    if (d == NULL) {
        *h = *h * 31 + 1;
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0
            || (ignore_dot && e->d_name[0] == '.'))
            continue;
        char path[PATH_MAX];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name)
                >= (int)sizeof path
            || stat(path, &st) != 0)
            continue;
        /* Order-free: readdir's order may change between two looks. */
        uint64_t f = rl_key_hash_value(path, strlen(path));
        f ^= (uint64_t)st.st_size * 0x9e3779b97f4a7c15ULL;
        f ^= ((uint64_t)st.st_mtim.tv_sec * 1000000000ULL
              + (uint64_t)st.st_mtim.tv_nsec) * 0xc2b2ae3d27d4eb4fULL;
        *h += rl_key_hash_value((const char *)&f, sizeof f);
        if (S_ISDIR(st.st_mode))
            fingerprint_dir(path, ignore_dot, h, depth + 1);
    }
    closedir(d);
}

static uint64_t fingerprint(const rls_runtime *rt)
{
    uint64_t h = 0;
    fingerprint_dir(rt->dir, rt->ignore_dotfiles, &h, 0);
    return h;
}

bool rls_runtime_changed(rls_runtime *rt)
{
    return fingerprint(rt) != rt->fingerprint;
}

int rls_runtime_load(rls_runtime *rt, char *err, size_t cap)
{
    rt->fingerprint = fingerprint(rt);
    rls_config *cfg;
    if (rls_config_load_dir(rt->dir, rt->prefix, rt->ignore_dotfiles,
                            rt->merge, rt->synced, &cfg, err, cap) != 0)
        return -1;
    rls_snapshot *s = malloc(sizeof *s);
    if (s == NULL) {
        rls_config_free(cfg);
        snprintf(err, cap, "out of memory");
        return -1;
    }
    s->cfg = cfg;
    atomic_init(&s->refs, 1);
    pthread_mutex_lock(&rt->lock);
    rls_snapshot *old = rt->current;
    rt->current = s;
    pthread_mutex_unlock(&rt->lock);
    if (old != NULL)
        rls_snapshot_put(old);
    return 0;
}

rls_snapshot *rls_runtime_get(rls_runtime *rt)
{
    pthread_mutex_lock(&rt->lock);
    rls_snapshot *s = rt->current;
    if (s != NULL)
        atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(&rt->lock);
    return s;
}

void rls_snapshot_put(rls_snapshot *s)
{
    if (s == NULL || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    rls_config_free(s->cfg);
    free(s);
}

void rls_runtime_fini(rls_runtime *rt)
{
    rls_snapshot_put(rt->current);
    rt->current = NULL;
    pthread_mutex_destroy(&rt->lock);
}
