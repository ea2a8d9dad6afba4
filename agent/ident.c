/*
 * ident.c: the agent's rule identities, a short list searched only when a
 * config is taken (at open and at each reload): checks reach an identity
 * through their generation, by rule index, never by search.
 */
#include "ident.h"

#include <stdlib.h>
#include <string.h>

static bool same(const rl_ident *id, const rl_rule *r)
{
    return id->mode == r->mode && strcmp(id->name, r->name) == 0
           && strcmp(id->key_prefix, r->key_prefix) == 0;
}

rl_ident *rl_idents_take(rl_ident **head, const rl_rule *rule)
{
    for (rl_ident *id = *head; id != NULL; id = id->next) {
        if (same(id, rule)) {
            rl_ident_ref(id);
            return id;
        }
    }
    rl_ident *id = calloc(1, sizeof *id);
    if (id == NULL)
        return NULL;
    memcpy(id->name, rule->name, sizeof id->name);
    memcpy(id->key_prefix, rule->key_prefix, sizeof id->key_prefix);
    id->mode = rule->mode;
    atomic_init(&id->refs, 1);
    atomic_init(&id->agents, 0);
    id->next = *head;
    *head = id;
    return id;
}

void rl_idents_sweep(rl_ident **head, bool all)
{
    rl_ident **link = head;
    while (*link != NULL) {
        rl_ident *id = *link;
        /* Acquire: whatever the last holder did with it is done. */
        if (all || atomic_load_explicit(&id->refs, memory_order_acquire)
                       == 0) {
            *link = id->next;
            free(id);
        } else {
            link = &id->next;
        }
    }
}

size_t rl_idents_count(rl_ident *const *head)
{
    size_t n = 0;
    for (const rl_ident *id = *head; id != NULL; id = id->next)
        n++;
    return n;
}
