/*
 * graves.c: retired table memory, freed once the checks that might hold
 * it have left (see graves.h).
 */
#include "graves.h"

#include <stdlib.h>

struct rl_grave {
    rl_grave *next;
    void *table;
    void *entry;
    bool marked;
    rl_calls_mark retired_at;
};

void rl_graves_init(rl_graves *g, rl_calls *calls)
{
    *g = (rl_graves){NULL, calls};
}

void rl_graves_add(rl_graves *g, void *table, void *entry)
{
    rl_grave *r = malloc(sizeof *r);
    if (r == NULL)
        return;
    *r = (rl_grave){.next = g->head, .table = table, .entry = entry};
    g->head = r;
}

void rl_graves_mark(rl_graves *g)
{
    for (rl_grave *r = g->head; r != NULL && !r->marked; r = r->next) {
        rl_calls_mark_now(g->calls, &r->retired_at);
        r->marked = true;
    }
}

void rl_graves_free(rl_graves *g, bool all, rl_grave_free_fn *fn,
                    void *owner)
{
    rl_grave **link = &g->head;
    while (*link != NULL) {
        rl_grave *r = *link;
        if (!all && (!r->marked
                     || !rl_calls_passed(g->calls, &r->retired_at))) {
            link = &r->next;
            continue;
        }
        *link = r->next;
        fn(owner, r->table, r->entry, all);
        free(r);
    }
}
