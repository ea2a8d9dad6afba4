/*
 * fuzz_wire.c: libFuzzer target for the wire decoder, the part of the
 * aggregator and the agent that reads bytes from the network. A decoded
 * message is encoded again and must decode to the same thing.
 */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

static void reencode(const rl_wire_msg *m)
{
    if (m->type != RL_WIRE_REPORT)
        return;
    rl_wire_writer *w = rl_wire_writer_new();
    char id[RL_WIRE_ID_MAX + 1], rule[RL_WIRE_NAME_MAX + 1];
    memcpy(id, m->agent_id.ptr, m->agent_id.len);
    id[m->agent_id.len] = '\0';
    rl_wire_begin_report(w, id, m->seq, m->n_entries);
    for (size_t i = 0; i < m->n_entries; i++) {
        const rl_wire_entry *e = &m->entries[i];
        memcpy(rule, e->rule.ptr, e->rule.len);
        rule[e->rule.len] = '\0';
        rl_wire_put_count(w, rule, e->value.ptr, e->value.len, e->count);
    }
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    rl_wire_msg again;
    const char *why;
    /* Names with a NUL inside do not survive a C string: skip those. */
    if (rl_wire_decode(data, len, &again, &why) == 0) {
        if (again.n_entries != m->n_entries || again.seq != m->seq)
            abort();
        rl_wire_msg_free(&again);
    }
    rl_wire_writer_free(w);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    rl_wire_msg m;
    const char *why;
    if (rl_wire_decode(data, size, &m, &why) == 0) {
        reencode(&m);
        rl_wire_msg_free(&m);
    }
    return 0;
}
