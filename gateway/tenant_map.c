/*
 * tenant_map.c: which tenant (and plan) an API key belongs to, for gateways
 * whose clients do not send X-Tenant, and for rules whose `when` names a
 * plan. The file has one "api_key tenant [plan]" line per key (blanks and
 * tabs between); '#' starts a comment. Read at start and on SIGHUP.
 */
#include "gateway.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAP_ENTRIES_MAX 1000000
#define MAP_LINE_MAX 1024

typedef struct gw_tenant_entry {
    char *api_key, *tenant, *plan; /* plan NULL on a two-word line */
} gw_tenant_entry;

struct gw_tenant_map {
    gw_tenant_entry *entries; /* sorted by api_key */
    size_t n;
};

static int by_key(const void *a, const void *b)
{
    return strcmp(((const gw_tenant_entry *)a)->api_key,
                  ((const gw_tenant_entry *)b)->api_key);
}

/* One line into key, tenant and plan (NULL if not given); 0 for a blank
 * or comment line, 1 for an entry, -1 for anything else. */
static int split(char *line, char **key, char **tenant, char **plan)
{
    static const char space[] = " \t\r\n";
    line[strcspn(line, "#")] = '\0';
    *key = strtok(line, space);
    if (*key == NULL)
        return 0;
    *tenant = strtok(NULL, space);
    *plan = *tenant != NULL ? strtok(NULL, space) : NULL;
    if (*tenant == NULL || (*plan != NULL && strtok(NULL, space) != NULL))
        return -1;
    return strlen(*key) <= RL_VALUE_MAX && strlen(*tenant) <= RL_VALUE_MAX
                   && (*plan == NULL || strlen(*plan) <= RL_VALUE_MAX)
               ? 1 : -1;
}

static int add(gw_tenant_map *map, size_t *cap, const char *key,
               const char *tenant, const char *plan)
{
    if (map->n == *cap) {
        size_t grown = *cap ? *cap * 2 : 64;
        gw_tenant_entry *e = realloc(map->entries, grown * sizeof *e);
        if (e == NULL)
            return -1;
        map->entries = e;
        *cap = grown;
    }
    gw_tenant_entry *e = &map->entries[map->n];
    e->api_key = strdup(key);
    e->tenant = strdup(tenant);
    e->plan = plan != NULL ? strdup(plan) : NULL;
    if (e->api_key == NULL || e->tenant == NULL
        || (plan != NULL && e->plan == NULL)) {
        free(e->api_key);
        free(e->tenant);
        free(e->plan);
        return -1;
    }
    map->n++;
    return 0;
}

static int read_lines(FILE *f, const char *path, gw_tenant_map *map,
                      char *err, size_t errlen)
{
    char line[MAP_LINE_MAX + 2];
    size_t cap = 0;
    for (unsigned no = 1; fgets(line, sizeof line, f) != NULL; no++) {
        if (strchr(line, '\n') == NULL && !feof(f)) {
            snprintf(err, errlen, "%s:%u: line over %d bytes", path, no,
                     MAP_LINE_MAX);
            return -1;
        }
        char *key, *tenant, *plan;
        int kind = split(line, &key, &tenant, &plan);
        if (kind < 0) {
            snprintf(err, errlen, "%s:%u: expected 'api_key tenant [plan]' "
                     "(two or three words of at most %d bytes)", path, no,
                     RL_VALUE_MAX);
            return -1;
        }
        if (kind == 0)
            continue;
        if (map->n == MAP_ENTRIES_MAX) {
            snprintf(err, errlen, "%s: more than %d entries", path,
                     MAP_ENTRIES_MAX);
            return -1;
        }
        if (add(map, &cap, key, tenant, plan) != 0) {
            snprintf(err, errlen, "%s: out of memory", path);
            return -1;
        }
    }
    return 0;
}

int gw_tenant_map_load(const char *path, gw_tenant_map **out, char *err,
                       size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "cannot read the tenant map %s: %s", path,
                 strerror(errno));
        return -1;
    }
    gw_tenant_map *map = calloc(1, sizeof *map);
    int rc = map != NULL ? read_lines(f, path, map, err, errlen) : -1;
    fclose(f);
    if (map == NULL)
        snprintf(err, errlen, "%s: out of memory", path);
    if (rc != 0) {
        gw_tenant_map_free(map);
        return -1;
    }
    qsort(map->entries, map->n, sizeof *map->entries, by_key);
    for (size_t i = 1; i < map->n; i++) {
        if (strcmp(map->entries[i - 1].api_key, map->entries[i].api_key)
            == 0) {
            snprintf(err, errlen, "%s: api key '%s' is listed twice", path,
                     map->entries[i].api_key);
            gw_tenant_map_free(map);
            return -1;
        }
    }
    *out = map;
    return 0;
}

bool gw_tenant_map_find(const gw_tenant_map *map, const char *api_key,
                        const char **tenant, const char **plan)
{
    *tenant = *plan = NULL;
    if (map == NULL)
        return false;
    gw_tenant_entry key = {.api_key = (char *)api_key};
    const gw_tenant_entry *e = bsearch(&key, map->entries, map->n,
                                       sizeof *map->entries, by_key);
    if (e == NULL)
        return false;
    *tenant = e->tenant;
    *plan = e->plan;
    return true;
}

size_t gw_tenant_map_size(const gw_tenant_map *map)
{
    return map != NULL ? map->n : 0;
}

void gw_tenant_map_free(gw_tenant_map *map)
{
    if (map == NULL)
        return;
    for (size_t i = 0; i < map->n; i++) {
        free(map->entries[i].api_key);
        free(map->entries[i].tenant);
        free(map->entries[i].plan);
    }
    free(map->entries);
    free(map);
}
