/*
 * config_regions.c: `region` (this config's) and `regions` (a mapping of
 * every region's name to where its aggregators take the others'
 * exchanges). libcyaml has no type for a mapping of the user's names, so
 * `regions` is read from the YAML document, as `when` is.
 *
 *   region: eu
 *   regions:
 *     eu: {peers: "tcp://10.1.0.5:7303,tcp://10.1.0.6:7303"}
 *     us: {peers: [tcp://10.2.0.5:7303, tcp://10.2.0.6:7303]}
 */
#include "config_loader.h"
#include "yaml_locate.h"

#include <stdio.h>
#include <string.h>

static const char *scalar(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* A region's name goes into metrics' labels and exchange ids: plain. */
static bool is_region_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > RL_REGION_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') && c != '-'
            && c != '_')
            return false;
    }
    return true;
}

static int add_peer(struct loader *ld, const char *path, const char *url,
                    size_t len, rl_region *r)
{
    char text[RL_NNG_URL_MAX];
    if (len == 0 || len >= sizeof text)
        return bad(ld, path, "a peer URL is empty or over %d bytes",
                   RL_NNG_URL_MAX - 1);
    memcpy(text, url, len);
    text[len] = '\0';
    if (!rl_config_nng_url(text))
        return bad(ld, path, "'%s' is not an nng URL such as "
                   "tcp://10.1.0.5:7303", text);
    if (r->n_peers == RL_AGGREGATORS_MAX)
        return bad(ld, path, "more than %d peers: a region has at most as "
                   "many as aggregators", RL_AGGREGATORS_MAX);
    for (size_t i = 0; i < r->n_peers; i++)
        if (strcmp(r->peers[i], text) == 0)
            return bad(ld, path, "'%s' is given twice", text);
    snprintf(r->peers[r->n_peers++], RL_NNG_URL_MAX, "%s", text);
    return RL_OK;
}

/* peers: one string of URLs joined by commas, or a list of URLs. */
static int load_peers(struct loader *ld, const char *path,
                      const yaml_node_t *node, rl_region *r)
{
    int rc;
    if (node->type == YAML_SCALAR_NODE) {
        const char *s = scalar(node);
        for (;;) {
            const char *comma = strchr(s, ',');
            size_t len = comma != NULL ? (size_t)(comma - s) : strlen(s);
            if ((rc = add_peer(ld, path, s, len, r)) != RL_OK)
                return rc;
            if (comma == NULL)
                return RL_OK;
            s = comma + 1;
        }
    }
    if (node->type != YAML_SEQUENCE_NODE)
        return bad_node(ld, node, path, "peers is a URL, URLs joined by "
                        "commas, or a list of URLs");
    for (yaml_node_item_t *it = node->data.sequence.items.start;
         it < node->data.sequence.items.top; it++) {
        yaml_node_t *u = yaml_document_get_node(&ld->doc, *it);
        if (u == NULL || u->type != YAML_SCALAR_NODE)
            return bad_node(ld, u, path, "each peer is a URL");
        if ((rc = add_peer(ld, path, scalar(u), strlen(scalar(u)), r))
            != RL_OK)
            return rc;
    }
    return RL_OK;
}

static int load_region(struct loader *ld, const yaml_node_t *key,
                       const yaml_node_t *value, rl_region *r)
{
    char path[96];
    if (key->type != YAML_SCALAR_NODE || !is_region_name(scalar(key)))
        return bad_node(ld, key, "regions", "a region's name is 1 to %d "
                        "letters a-z, digits, - and _",
                        RL_REGION_NAME_MAX);
    snprintf(r->name, sizeof r->name, "%s", scalar(key));
    snprintf(path, sizeof path, "regions.%s", r->name);
    if (value == NULL || value->type != YAML_MAPPING_NODE)
        return bad_node(ld, value, path, "a region is a mapping: "
                        "{peers: tcp://...}");
    const yaml_node_t *peers = NULL;
    for (yaml_node_pair_t *p = value->data.mapping.pairs.start;
         p < value->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(&ld->doc, p->key);
        if (k == NULL || k->type != YAML_SCALAR_NODE
            || strcmp(scalar(k), "peers") != 0)
            return bad_node(ld, k, path, "unknown field (a region has "
                            "peers)");
        if (peers != NULL)
            return bad_node(ld, k, path, "field 'peers' is given twice");
        peers = yaml_document_get_node(&ld->doc, p->value);
    }
    snprintf(path, sizeof path, "regions.%s.peers", r->name);
    if (peers == NULL)
        return bad_node(ld, value, path, "missing: where this region's "
                        "aggregators take the other regions' exchanges");
    return load_peers(ld, path, peers, r);
}

static int find_region(const rl_regions_config *rc, const char *name)
{
    for (size_t i = 0; i < rc->n; i++)
        if (strcmp(rc->regions[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int load_all(struct loader *ld, const yaml_node_t *map,
                    rl_regions_config *out)
{
    int rc;
    if (map->type != YAML_MAPPING_NODE)
        return bad_node(ld, map, "regions", "a mapping of each region's "
                        "name to {peers: ...}");
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(&ld->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&ld->doc, p->value);
        if (out->n == RL_REGIONS_MAX)
            return bad_node(ld, k, "regions", "more than %d regions",
                            RL_REGIONS_MAX);
        if (k == NULL)
            return bad(ld, "regions", "a region has no name");
        rl_region *r = &out->regions[out->n];
        if ((rc = load_region(ld, k, v, r)) != RL_OK)
            return rc;
        if (find_region(out, r->name) >= 0)
            return bad_node(ld, k, "regions", "region '%s' is given twice",
                            r->name);
        out->n++;
    }
    return RL_OK;
}

int rl_config_load_regions(struct loader *ld, const rl_raw_config *raw,
                           rl_config *cfg)
{
    rl_regions_config *out = &cfg->regions;
    yaml_node_t *map = rl_yaml_at(&ld->doc, NULL, "regions", false);
    if (map == NULL && raw->region == NULL)
        return RL_OK;
    if (map == NULL)
        return bad(ld, "region", "set, but regions is not: list every "
                   "region with its peers");
    if (raw->region == NULL)
        return bad(ld, "regions", "set, but region is not: name the region "
                   "this config is of");
    int rc = load_all(ld, map, out);
    if (rc != RL_OK)
        return rc;
    int self = find_region(out, raw->region);
    if (self < 0)
        return bad(ld, "region", "'%s' is not one of regions", raw->region);
    out->self = (size_t)self;
    /* Each aggregator takes exchanges on its own peer address. */
    const rl_region *own = &out->regions[self];
    if (own->n_peers != cfg->aggregator.n_endpoints) {
        char path[96];
        snprintf(path, sizeof path, "regions.%s.peers", own->name);
        return bad(ld, path, "%zu peers for %zu aggregators: give this "
                   "region one peer address per aggregator, in the "
                   "aggregators' order", own->n_peers,
                   cfg->aggregator.n_endpoints);
    }
    return RL_OK;
}
