/*
 * fuzz_wire.c: libFuzzer target for the wire decoder, the part of the
 * aggregator and the agent that reads bytes from the network. A decoded
 * message of any type is encoded again with the writer the programs use,
 * and must decode, to the same message, field by field.
 */
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_wire: %s\n", what);
    abort();
}

/* The writer takes agent ids and rule names as C strings (empty where
 * the type has none: ptr is NULL then). */
static void as_string(const rl_wire_bytes *b, char *buf)
{
    if (b->len > 0)
        memcpy(buf, b->ptr, b->len);
    buf[b->len] = '\0';
}

static bool has_nul(const rl_wire_bytes *b)
{
    return b->len > 0 && memchr(b->ptr, '\0', b->len) != NULL;
}

/* Whether the writer can say it: its C strings end at a NUL. */
static bool writable(const rl_wire_msg *m)
{
    if (has_nul(&m->agent_id) || has_nul(&m->rule))
        return false;
    for (size_t i = 0; i < m->n_entries; i++) {
        if (has_nul(&m->entries[i].rule))
            return false;
    }
    for (size_t i = 0; i < m->n_presence; i++) {
        if (has_nul(&m->presence[i]))
            return false;
    }
    return true;
}

/* The presence names as C strings (valid until the next call). */
static const char *const *presence_names(const rl_wire_msg *m)
{
    static char names[RL_WIRE_PRESENCE_MAX][RL_WIRE_NAME_MAX + 1];
    static const char *ptrs[RL_WIRE_PRESENCE_MAX];
    for (size_t i = 0; i < m->n_presence; i++) {
        as_string(&m->presence[i], names[i]);
        ptrs[i] = names[i];
    }
    return ptrs;
}

static void encode(const rl_wire_msg *m, rl_wire_writer *w)
{
    char id[RL_WIRE_ID_MAX + 1], rule[RL_WIRE_NAME_MAX + 1];
    if (m->type == RL_WIRE_FEATURES) {
        rl_wire_begin_features(w, m->features);
        return;
    }
    if (m->type == RL_WIRE_GOODBYE) {
        as_string(&m->agent_id, id);
        rl_wire_goodbye(w, id, presence_names(m), m->n_presence);
        return;
    }
    if (m->type == RL_WIRE_REPORT) {
        as_string(&m->agent_id, id);
        if (m->has_presence)
            rl_wire_begin_report_stream(w, id, m->seq, m->n_entries,
                                        m->stream);
        else
            rl_wire_begin_report(w, id, m->seq, m->n_entries);
    } else if (m->type == RL_WIRE_ACK) {
        rl_wire_begin_ack(w, m->seq, m->status, m->now_ms, m->n_entries);
    } else {
        as_string(&m->rule, rule);
        rl_wire_begin_totals(w, rule, m->now_ms, m->stale, m->agents,
                             m->n_entries);
    }
    for (size_t i = 0; i < m->n_entries; i++) {
        const rl_wire_entry *e = &m->entries[i];
        as_string(&e->rule, rule);
        if (m->type == RL_WIRE_REPORT && e->at_ms > 0)
            rl_wire_put_count_at(w, rule, e->value.ptr, e->value.len,
                                 e->count, e->at_ms);
        else if (m->type == RL_WIRE_REPORT)
            rl_wire_put_count(w, rule, e->value.ptr, e->value.len, e->count);
        else if (m->type == RL_WIRE_ACK)
            rl_wire_put_ack_total(w, rule, e->value.ptr, e->value.len,
                                  e->window, e->current, e->previous,
                                  e->agents);
        else
            rl_wire_put_total(w, e->value.ptr, e->value.len, e->window,
                              e->current, e->previous, e->agents);
    }
    if (m->has_presence)
        rl_wire_put_presence(w, presence_names(m), m->n_presence);
}

static bool same_bytes(const rl_wire_bytes *a, const rl_wire_bytes *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->ptr, b->ptr,
                                                      a->len) == 0);
}

/* Every field of every type: the decoder zeroes what a type lacks. */
static bool same(const rl_wire_msg *a, const rl_wire_msg *b)
{
    if (a->type != b->type || !same_bytes(&a->agent_id, &b->agent_id)
        || !same_bytes(&a->rule, &b->rule) || a->seq != b->seq
        || a->status != b->status || a->now_ms != b->now_ms
        || a->stale != b->stale || a->agents != b->agents
        || a->stream != b->stream || a->features != b->features
        || a->n_entries != b->n_entries
        || a->has_presence != b->has_presence
        || a->n_presence != b->n_presence)
        return false;
    for (size_t i = 0; i < a->n_presence; i++) {
        if (!same_bytes(&a->presence[i], &b->presence[i]))
            return false;
    }
    for (size_t i = 0; i < a->n_entries; i++) {
        const rl_wire_entry *x = &a->entries[i], *y = &b->entries[i];
        if (!same_bytes(&x->rule, &y->rule)
            || !same_bytes(&x->value, &y->value) || x->count != y->count
            || x->window != y->window || x->at_ms != y->at_ms
            || x->current != y->current
            || x->previous != y->previous || x->agents != y->agents)
            return false;
    }
    return true;
}

static void reencode(const rl_wire_msg *m)
{
    if (!writable(m))
        return;
    rl_wire_writer *w = rl_wire_writer_new();
    if (w == NULL)
        fail("out of memory");
    encode(m, w);
    size_t len;
    const char *data = rl_wire_writer_data(w, &len);
    /* Totals go out behind their topic (the rule and a NUL), features
     * behind theirs, which the subscriber strips before decoding. */
    size_t topic = m->type == RL_WIRE_TOTALS     ? m->rule.len + 1
                   : m->type == RL_WIRE_FEATURES ? RL_WIRE_FEATURES_TOPIC_LEN
                                                 : 0;
    data += topic;
    len -= topic;
    rl_wire_msg again;
    const char *why;
    if (rl_wire_decode(data, len, &again, &why) != 0)
        fail(why);
    if (!same(m, &again))
        fail("the message read back differs");
    rl_wire_msg_free(&again);
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
