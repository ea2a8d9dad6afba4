/*
 * yaml_locate.h: finds the line of a field in a YAML document, so that an
 * error found after parsing (a zero limit, a duplicate name) can still name
 * the line to fix; and walks the document's nodes for the fields libcyaml
 * cannot read (a value that is a string or a list, a mapping with keys of
 * the user's choosing). Private to librl.
 */
#ifndef RL_COMMON_YAML_LOCATE_H
#define RL_COMMON_YAML_LOCATE_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

/* rl_yaml_locate finds the node at path in the YAML text and writes its
 * 1-based line and column. path is a dot-separated list of mapping keys and
 * sequence indexes, e.g. "rules.2.limit" or "store.cluster.0". With at_key,
 * the last step's key is located instead of its value (for an unknown key).
 * Returns false when the text does not parse or the path is not there. */
bool rl_yaml_locate(const char *yaml, size_t len, const char *path,
                    bool at_key, unsigned *line, unsigned *column);

/* rl_yaml_doc_load parses the text into doc (to be freed with
 * yaml_document_delete). Returns false if it does not parse. */
bool rl_yaml_doc_load(const char *yaml, size_t len, yaml_document_t *doc);

/* rl_yaml_at follows path (as rl_yaml_locate takes it) from node, or from
 * the root when node is NULL; NULL when the path is not there. */
yaml_node_t *rl_yaml_at(yaml_document_t *doc, yaml_node_t *node,
                        const char *path, bool at_key);

/* rl_yaml_find_nul finds the first scalar holding a NUL byte (written as an
 * escape such as "\0" in a double-quoted string): C strings would silently
 * cut it short. Writes its line and column and returns true if there is one. */
bool rl_yaml_find_nul(const char *yaml, size_t len, unsigned *line,
                      unsigned *column);

#endif
