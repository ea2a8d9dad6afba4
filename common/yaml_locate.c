/*
 * yaml_locate.c: line numbers for errors found after libcyaml has done its
 * work. libcyaml reports where its own errors are but keeps no positions in
 * the data it returns, so this walks libyaml's node tree of the same text.
 * Only called on the error path: the cost of a second parse does not matter.
 */
#include "yaml_locate.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* The value (or, with at_key, the key) named step in a mapping or sequence. */
static yaml_node_t *child(yaml_document_t *doc, yaml_node_t *node,
                          const char *step, size_t step_len, bool at_key)
{
    if (node->type == YAML_SEQUENCE_NODE) {
        char *end;
        unsigned long i = strtoul(step, &end, 10);
        yaml_node_item_t *items = node->data.sequence.items.start;
        size_t n = (size_t)(node->data.sequence.items.top - items);
        if (end != step + step_len || i >= n)
            return NULL;
        return yaml_document_get_node(doc, items[i]);
    }
    if (node->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *pair = node->data.mapping.pairs.start;
         pair < node->data.mapping.pairs.top; pair++) {
        yaml_node_t *key = yaml_document_get_node(doc, pair->key);
        if (key != NULL && key->type == YAML_SCALAR_NODE
            && key->data.scalar.length == step_len
            && memcmp(key->data.scalar.value, step, step_len) == 0)
            return at_key ? key : yaml_document_get_node(doc, pair->value);
    }
    return NULL;
}

bool rl_yaml_doc_load(const char *yaml, size_t len, yaml_document_t *doc)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return false;
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    bool ok = yaml_parser_load(&parser, doc) != 0;
    yaml_parser_delete(&parser);
    return ok;
}

yaml_node_t *rl_yaml_at(yaml_document_t *doc, yaml_node_t *node,
                        const char *path, bool at_key)
{
    if (node == NULL)
        node = yaml_document_get_root_node(doc);
    const char *step = path;
    while (node != NULL && *step != '\0') {
        const char *dot = strchr(step, '.');
        size_t step_len = dot != NULL ? (size_t)(dot - step) : strlen(step);
        node = child(doc, node, step, step_len, at_key && dot == NULL);
        step = dot != NULL ? dot + 1 : step + step_len;
    }
    return node;
}

bool rl_yaml_locate(const char *yaml, size_t len, const char *path,
                    bool at_key, unsigned *line, unsigned *column)
{
    yaml_document_t doc;
    bool found = false;
    if (!rl_yaml_doc_load(yaml, len, &doc))
        return false;
    yaml_node_t *node = rl_yaml_at(&doc, NULL, path, at_key);
    if (node != NULL) {
        *line = (unsigned)node->start_mark.line + 1;
        *column = (unsigned)node->start_mark.column + 1;
        found = true;
    }
    yaml_document_delete(&doc);
    return found;
}

bool rl_yaml_find_nul(const char *yaml, size_t len, unsigned *line,
                      unsigned *column)
{
    yaml_parser_t parser;
    yaml_event_t event;
    bool found = false, done = false;
    if (!yaml_parser_initialize(&parser))
        return false;
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    while (!found && !done && yaml_parser_parse(&parser, &event)) {
        if (event.type == YAML_SCALAR_EVENT
            && memchr(event.data.scalar.value, '\0',
                      event.data.scalar.length) != NULL) {
            *line = (unsigned)event.start_mark.line + 1;
            *column = (unsigned)event.start_mark.column + 1;
            found = true;
        }
        done = event.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&event);
    }
    yaml_parser_delete(&parser);
    return found;
}
