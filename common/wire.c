/*
 * wire.c: encoding with msgpack-c's packer, decoding with a strict reader
 * of our own. The reader accepts exactly the shapes in wire.h and nothing
 * else, and allocates one thing: the entries array, whose length it first
 * checks against both RL_WIRE_ENTRIES_MAX and the bytes actually left in
 * the message. A generic msgpack unpacker would allocate whatever an array
 * header claims before it finds the message too short; from a network peer
 * that is an allocation bomb.
 */
#include "wire.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

struct reader {
    const uint8_t *p, *end;
    const char *why;
};

static bool fail(struct reader *r, const char *why)
{
    if (r->why == NULL)
        r->why = why;
    return false;
}

static size_t left(const struct reader *r)
{
    return (size_t)(r->end - r->p);
}

/* A big-endian number of n bytes. */
static bool rd_be(struct reader *r, size_t n, uint64_t *v)
{
    if (left(r) < n)
        return fail(r, "message cut short");
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++)
        x = x << 8 | r->p[i];
    r->p += n;
    *v = x;
    return true;
}

static bool rd_array(struct reader *r, size_t *n)
{
    if (left(r) < 1)
        return fail(r, "message cut short");
    uint8_t b = *r->p++;
    uint64_t count;
    if ((b & 0xf0) == 0x90)
        count = b & 0x0f;
    else if (b == 0xdc) {
        if (!rd_be(r, 2, &count))
            return false;
    } else if (b == 0xdd) {
        if (!rd_be(r, 4, &count))
            return false;
    } else {
        return fail(r, "expected an array");
    }
    /* Each element takes at least one byte. */
    if (count > left(r))
        return fail(r, "array longer than the message");
    *n = (size_t)count;
    return true;
}

static bool rd_uint(struct reader *r, uint64_t *v)
{
    if (left(r) < 1)
        return fail(r, "message cut short");
    uint8_t b = *r->p++;
    if (b <= 0x7f) {
        *v = b;
        return true;
    }
    static const size_t widths[] = {1, 2, 4, 8};
    if (b >= 0xcc && b <= 0xcf)
        return rd_be(r, widths[b - 0xcc], v);
    return fail(r, "expected an unsigned integer");
}

static bool rd_bounded(struct reader *r, uint64_t max, uint64_t *v)
{
    if (!rd_uint(r, v))
        return false;
    return *v <= max || fail(r, "number out of range");
}

/* A str or a bin of 1 to max bytes. */
static bool rd_bytes(struct reader *r, size_t max, rl_wire_bytes *out)
{
    if (left(r) < 1)
        return fail(r, "message cut short");
    uint8_t b = *r->p++;
    uint64_t len;
    bool ok = true;
    if ((b & 0xe0) == 0xa0)
        len = b & 0x1f;
    else if (b == 0xd9 || b == 0xc4)
        ok = rd_be(r, 1, &len);
    else if (b == 0xda || b == 0xc5)
        ok = rd_be(r, 2, &len);
    else if (b == 0xdb || b == 0xc6)
        ok = rd_be(r, 4, &len);
    else
        return fail(r, "expected a string");
    if (!ok)
        return false;
    if (len == 0 || len > max)
        return fail(r, "string empty or too long");
    if (len > left(r))
        return fail(r, "message cut short");
    out->ptr = (const char *)r->p;
    out->len = (size_t)len;
    r->p += len;
    return true;
}

static bool rd_bool(struct reader *r, bool *v)
{
    if (left(r) < 1 || (*r->p != 0xc2 && *r->p != 0xc3))
        return fail(r, "expected a boolean");
    *v = *r->p++ == 0xc3;
    return true;
}

static bool rd_fields(struct reader *r, size_t want)
{
    size_t n;
    if (!rd_array(r, &n))
        return false;
    return n == want || fail(r, "wrong number of fields");
}

/* A negative integer's magnitude (msgpack's negative fixint, int 8 to
 * int 64), at most max. */
static bool rd_negative(struct reader *r, uint64_t max, uint64_t *v)
{
    uint8_t b = *r->p++;
    if (b >= 0xe0) {
        *v = 0x100u - b;
        return true;
    }
    static const size_t widths[] = {1, 2, 4, 8};
    uint64_t x;
    if (b < 0xd0 || b > 0xd3 || !rd_be(r, widths[b - 0xd0], &x))
        return fail(r, "expected an integer");
    size_t bits = 8 * widths[b - 0xd0];
    /* Two's complement of `bits` bits: its sign bit must be set. */
    if (!(x >> (bits - 1) & 1))
        return fail(r, "a signed integer that is not negative");
    *v = (bits < 64 ? (1ULL << bits) : 0) - x;
    return *v <= max || fail(r, "number out of range");
}

/* A report entry's count: a give-back's when negative (wire.h), whose
 * magnitude goes to back. */
static bool rd_count(struct reader *r, rl_wire_entry *e)
{
    if (left(r) < 1)
        return fail(r, "message cut short");
    if (*r->p >= 0xe0 || (*r->p >= 0xd0 && *r->p <= 0xd3))
        return rd_negative(r, RL_WIRE_COUNT_MAX, &e->back);
    return rd_bounded(r, RL_WIRE_COUNT_MAX, &e->count);
}

/* [rule, value, count] or, with a time in the sub-window the count was
 * made in, [rule, value, count, at] (at > 0), and with the requests
 * refused there, [rule, value, count, at, refused]; a give-back (a
 * negative count) always names its sub-window. */
static bool rd_report_entry(struct reader *r, rl_wire_entry *e)
{
    size_t n;
    if (!rd_array(r, &n))
        return false;
    return (n == 3 || n == 4 || n == 5 || fail(r, "wrong number of fields"))
           && rd_bytes(r, RL_WIRE_NAME_MAX, &e->rule)
           && rd_bytes(r, RL_WIRE_VALUE_MAX, &e->value) && rd_count(r, e)
           && (e->back == 0 || n >= 4
               || fail(r, "a give-back without its sub-window"))
           && (n == 3 || (rd_uint(r, &e->at_ms)
                          && (e->at_ms > 0 || fail(r, "at 0"))))
           && (n < 5 || rd_bounded(r, RL_WIRE_COUNT_MAX, &e->refused));
}

static bool rd_totals(struct reader *r, rl_wire_entry *e)
{
    return rd_bounded(r, UINT64_MAX, &e->window)
           && rd_bounded(r, RL_WIRE_COUNT_MAX, &e->current)
           && rd_bounded(r, RL_WIRE_COUNT_MAX, &e->previous)
           && rd_bounded(r, UINT32_MAX, &e->agents);
}

static bool rd_ack_entry(struct reader *r, rl_wire_entry *e)
{
    return rd_fields(r, 6) && rd_bytes(r, RL_WIRE_NAME_MAX, &e->rule)
           && rd_bytes(r, RL_WIRE_VALUE_MAX, &e->value) && rd_totals(r, e);
}

/* [value, window, current, previous, agents] or, for a global rule's
 * key, with the region's share of its room and whether a region is cut
 * off: [..., share, cut]. */
static bool rd_totals_entry(struct reader *r, rl_wire_entry *e)
{
    size_t n;
    e->share = RL_WIRE_SHARE_WHOLE;
    return rd_array(r, &n)
           && (n == 5 || n == 7 || fail(r, "wrong number of fields"))
           && rd_bytes(r, RL_WIRE_VALUE_MAX, &e->value) && rd_totals(r, e)
           && (n == 5
               || (rd_bounded(r, RL_WIRE_SHARE_WHOLE, &e->share)
                   && rd_bool(r, &e->cut)));
}

/* A LEAVING entry, [value, window, [count, ...]], its counts into the
 * place the message keeps for them. */
static bool rd_leaving_entry(struct reader *r, rl_wire_entry *e,
                             uint64_t *counts)
{
    size_t k;
    if (!rd_fields(r, 3) || !rd_bytes(r, RL_WIRE_VALUE_MAX, &e->value)
        || !rd_uint(r, &e->window) || !rd_array(r, &k))
        return false;
    if (k == 0 || k > RL_WIRE_LEAVING_MAX)
        return fail(r, "too many or no counts");
    for (size_t j = 0; j < k; j++) {
        if (!rd_bounded(r, RL_WIRE_COUNT_MAX, &counts[j]))
            return false;
    }
    e->leaving = counts;
    e->n_leaving = k;
    return true;
}

/* The entries array, each read by entry, or for LEAVING (entry NULL) by
 * rd_leaving_entry, their counts in one array the message owns. */
static bool rd_entries(struct reader *r, rl_wire_msg *m,
                       bool (*entry)(struct reader *, rl_wire_entry *))
{
    size_t n;
    if (!rd_array(r, &n))
        return false;
    if (n > RL_WIRE_ENTRIES_MAX)
        return fail(r, "too many entries");
    if (n == 0)
        return true;
    m->entries = calloc(n, sizeof *m->entries);
    if (entry == NULL)
        m->leaving = calloc(n * RL_WIRE_LEAVING_MAX, sizeof *m->leaving);
    if (m->entries == NULL || (entry == NULL && m->leaving == NULL))
        return fail(r, "out of memory");
    m->n_entries = n;
    for (size_t i = 0; i < n; i++) {
        bool ok = entry != NULL
                      ? entry(r, &m->entries[i])
                      : rd_leaving_entry(r, &m->entries[i],
                                         m->leaving + i * RL_WIRE_LEAVING_MAX);
        if (!ok)
            return false;
    }
    return true;
}

/* The presence field: rule names, bounded like entries. */
static bool rd_presence(struct reader *r, rl_wire_msg *m)
{
    size_t n;
    m->has_presence = true;
    if (!rd_array(r, &n))
        return false;
    if (n > RL_WIRE_PRESENCE_MAX)
        return fail(r, "too many rule names");
    if (n == 0)
        return true;
    m->presence = calloc(n, sizeof *m->presence);
    if (m->presence == NULL)
        return fail(r, "out of memory");
    m->n_presence = n;
    for (size_t i = 0; i < n; i++) {
        if (!rd_bytes(r, RL_WIRE_NAME_MAX, &m->presence[i]))
            return false;
    }
    return true;
}

static bool rd_body(struct reader *r, size_t fields, rl_wire_msg *m)
{
    switch (m->type) {
    case RL_WIRE_REPORT:
        return (fields == 5 || fields == 6 || fields == 7
                || fail(r, "wrong number of fields"))
               && rd_bytes(r, RL_WIRE_ID_MAX, &m->agent_id)
               && rd_uint(r, &m->seq) && rd_entries(r, m, rd_report_entry)
               && (fields == 5 || rd_presence(r, m))
               && (fields < 7
                   || rd_bounded(r, RL_WIRE_STREAMS_MAX - 1, &m->stream));
    case RL_WIRE_ACK:
        return (fields == 6 || fail(r, "wrong number of fields"))
               && rd_uint(r, &m->seq)
               && rd_bounded(r, RL_ACK_RETRY, &m->status)
               && rd_uint(r, &m->now_ms) && rd_entries(r, m, rd_ack_entry);
    case RL_WIRE_TOTALS:
        return (fields == 7 || fail(r, "wrong number of fields"))
               && rd_bytes(r, RL_WIRE_NAME_MAX, &m->rule)
               && rd_uint(r, &m->now_ms) && rd_bool(r, &m->stale)
               && rd_bounded(r, UINT32_MAX, &m->agents)
               && rd_entries(r, m, rd_totals_entry);
    case RL_WIRE_FEATURES:
        return (fields == 3 || fail(r, "wrong number of fields"))
               && rd_uint(r, &m->features);
    case RL_WIRE_GOODBYE:
        return (fields == 4 || fail(r, "wrong number of fields"))
               && rd_bytes(r, RL_WIRE_ID_MAX, &m->agent_id)
               && rd_presence(r, m);
    case RL_WIRE_LEAVING:
        return (fields == 5 || fail(r, "wrong number of fields"))
               && rd_bytes(r, RL_WIRE_NAME_MAX, &m->rule)
               && rd_uint(r, &m->now_ms) && rd_entries(r, m, NULL);
    case RL_WIRE_EXCHANGE:
        return (fields == 7 || fail(r, "wrong number of fields"))
               && rd_bytes(r, RL_WIRE_REGION_MAX, &m->region)
               && rd_bytes(r, RL_WIRE_ID_MAX, &m->agent_id)
               && rd_uint(r, &m->seq) && rd_uint(r, &m->now_ms)
               && rd_entries(r, m, rd_report_entry);
    default:
        return fail(r, "unknown message type");
    }
}

int rl_wire_decode(const void *buf, size_t len, rl_wire_msg *out,
                   const char **why)
{
    struct reader r = {buf, (const uint8_t *)buf + len, NULL};
    memset(out, 0, sizeof *out);
    size_t fields;
    uint64_t version, type;
    bool ok = len <= RL_WIRE_MESSAGE_MAX || fail(&r, "message too large");
    ok = ok && rd_array(&r, &fields)
         && (fields >= 2 || fail(&r, "wrong number of fields"))
         && rd_uint(&r, &version)
         && (version == RL_WIRE_VERSION || fail(&r, "unknown version"))
         && rd_uint(&r, &type);
    if (ok) {
        out->type = type <= RL_WIRE_LEAVING ? (int)type : -1;
        ok = rd_body(&r, fields, out)
             && (left(&r) == 0 || fail(&r, "bytes after the message"));
    }
    if (!ok) {
        rl_wire_msg_free(out);
        *why = r.why;
        return -1;
    }
    return 0;
}

void rl_wire_msg_free(rl_wire_msg *m)
{
    free(m->entries);
    m->entries = NULL;
    m->n_entries = 0;
    free(m->presence);
    m->presence = NULL;
    m->n_presence = 0;
    free(m->leaving);
    m->leaving = NULL;
}

struct rl_wire_writer {
    msgpack_sbuffer buf;
    msgpack_packer pk;
    uint64_t stream;    /* the REPORT's, written after its presence */
};

rl_wire_writer *rl_wire_writer_new(void)
{
    rl_wire_writer *w = malloc(sizeof *w);
    if (w == NULL)
        return NULL;
    msgpack_sbuffer_init(&w->buf);
    w->stream = 0;
    msgpack_packer_init(&w->pk, &w->buf, msgpack_sbuffer_write);
    return w;
}

void rl_wire_writer_free(rl_wire_writer *w)
{
    if (w == NULL)
        return;
    msgpack_sbuffer_destroy(&w->buf);
    free(w);
}

const void *rl_wire_writer_data(const rl_wire_writer *w, size_t *len)
{
    *len = w->buf.size;
    return w->buf.data;
}

void rl_wire_writer_reset(rl_wire_writer *w)
{
    msgpack_sbuffer_clear(&w->buf);
}

static void put_str(rl_wire_writer *w, const char *s, size_t len)
{
    msgpack_pack_str(&w->pk, len);
    msgpack_pack_str_body(&w->pk, s, len);
}

/* Values are bytes, not text: bin keeps them exact. */
static void put_bin(rl_wire_writer *w, const char *s, size_t len)
{
    msgpack_pack_bin(&w->pk, len);
    msgpack_pack_bin_body(&w->pk, s, len);
}

static void put_header(rl_wire_writer *w, size_t fields, int type)
{
    msgpack_pack_array(&w->pk, fields);
    msgpack_pack_uint64(&w->pk, RL_WIRE_VERSION);
    msgpack_pack_uint64(&w->pk, (uint64_t)type);
}

void rl_wire_begin_report(rl_wire_writer *w, const char *agent_id,
                          uint64_t seq, size_t n_entries)
{
    put_header(w, 5, RL_WIRE_REPORT);
    put_str(w, agent_id, strlen(agent_id));
    msgpack_pack_uint64(&w->pk, seq);
    msgpack_pack_array(&w->pk, n_entries);
}

void rl_wire_begin_report_presence(rl_wire_writer *w, const char *agent_id,
                                   uint64_t seq, size_t n_entries)
{
    rl_wire_begin_report_stream(w, agent_id, seq, n_entries, 0);
}

void rl_wire_begin_report_stream(rl_wire_writer *w, const char *agent_id,
                                 uint64_t seq, size_t n_entries,
                                 uint64_t stream)
{
    w->stream = stream;
    put_header(w, stream > 0 ? 7 : 6, RL_WIRE_REPORT);
    put_str(w, agent_id, strlen(agent_id));
    msgpack_pack_uint64(&w->pk, seq);
    msgpack_pack_array(&w->pk, n_entries);
}

static void put_names(rl_wire_writer *w, const char *const *rules,
                      size_t n)
{
    msgpack_pack_array(&w->pk, n);
    for (size_t i = 0; i < n; i++)
        put_str(w, rules[i], strlen(rules[i]));
}

void rl_wire_put_presence(rl_wire_writer *w, const char *const *rules,
                          size_t n)
{
    put_names(w, rules, n);
    if (w->stream > 0)
        msgpack_pack_uint64(&w->pk, w->stream);
}

/* A report entry of n fields, up to its count. */
static void begin_entry(rl_wire_writer *w, size_t n, const char *rule,
                        const char *value, size_t value_len)
{
    msgpack_pack_array(&w->pk, n);
    put_str(w, rule, strlen(rule));
    put_bin(w, value, value_len);
}

void rl_wire_put_count(rl_wire_writer *w, const char *rule, const char *value,
                       size_t value_len, uint64_t count)
{
    begin_entry(w, 3, rule, value, value_len);
    msgpack_pack_uint64(&w->pk, count);
}

void rl_wire_put_count_at(rl_wire_writer *w, const char *rule,
                          const char *value, size_t value_len,
                          uint64_t count, uint64_t at_ms)
{
    begin_entry(w, 4, rule, value, value_len);
    msgpack_pack_uint64(&w->pk, count);
    msgpack_pack_uint64(&w->pk, at_ms);
}

void rl_wire_put_demand_at(rl_wire_writer *w, const char *rule,
                           const char *value, size_t value_len,
                           uint64_t count, uint64_t back, uint64_t at_ms,
                           uint64_t refused)
{
    begin_entry(w, 5, rule, value, value_len);
    if (back > 0)
        msgpack_pack_int64(&w->pk, -(int64_t)back);
    else
        msgpack_pack_uint64(&w->pk, count);
    msgpack_pack_uint64(&w->pk, at_ms);
    msgpack_pack_uint64(&w->pk, refused);
}

void rl_wire_begin_exchange(rl_wire_writer *w, const char *region,
                            const char *sender, uint64_t seq, uint64_t upto,
                            size_t n_entries)
{
    put_header(w, 7, RL_WIRE_EXCHANGE);
    put_str(w, region, strlen(region));
    put_str(w, sender, strlen(sender));
    msgpack_pack_uint64(&w->pk, seq);
    msgpack_pack_uint64(&w->pk, upto);
    msgpack_pack_array(&w->pk, n_entries);
}

void rl_wire_put_giveback_at(rl_wire_writer *w, const char *rule,
                             const char *value, size_t value_len,
                             uint64_t back, uint64_t at_ms)
{
    begin_entry(w, 4, rule, value, value_len);
    msgpack_pack_int64(&w->pk, -(int64_t)back);
    msgpack_pack_uint64(&w->pk, at_ms);
}

void rl_wire_begin_ack(rl_wire_writer *w, uint64_t seq, uint64_t status,
                       uint64_t now_ms, size_t n_entries)
{
    put_header(w, 6, RL_WIRE_ACK);
    msgpack_pack_uint64(&w->pk, seq);
    msgpack_pack_uint64(&w->pk, status);
    msgpack_pack_uint64(&w->pk, now_ms);
    msgpack_pack_array(&w->pk, n_entries);
}

static void put_totals(rl_wire_writer *w, uint64_t window, uint64_t current,
                       uint64_t previous, uint64_t agents)
{
    msgpack_pack_uint64(&w->pk, window);
    msgpack_pack_uint64(&w->pk, current);
    msgpack_pack_uint64(&w->pk, previous);
    msgpack_pack_uint64(&w->pk, agents);
}

void rl_wire_put_ack_total(rl_wire_writer *w, const char *rule,
                           const char *value, size_t value_len,
                           uint64_t window, uint64_t current,
                           uint64_t previous, uint64_t agents)
{
    msgpack_pack_array(&w->pk, 6);
    put_str(w, rule, strlen(rule));
    put_bin(w, value, value_len);
    put_totals(w, window, current, previous, agents);
}

size_t rl_wire_topic(const char *rule, char *buf, size_t cap)
{
    size_t n = strlen(rule) + 1;
    if (n > cap)
        return 0;
    memcpy(buf, rule, n); /* the terminating NUL ends the topic */
    return n;
}

void rl_wire_begin_totals(rl_wire_writer *w, const char *rule,
                          uint64_t now_ms, bool stale, uint64_t agents,
                          size_t n_entries)
{
    msgpack_sbuffer_write(&w->buf, rule, strlen(rule) + 1);
    put_header(w, 7, RL_WIRE_TOTALS);
    put_str(w, rule, strlen(rule));
    msgpack_pack_uint64(&w->pk, now_ms);
    if (stale)
        msgpack_pack_true(&w->pk);
    else
        msgpack_pack_false(&w->pk);
    msgpack_pack_uint64(&w->pk, agents);
    msgpack_pack_array(&w->pk, n_entries);
}

void rl_wire_put_total(rl_wire_writer *w, const char *value,
                       size_t value_len, uint64_t window, uint64_t current,
                       uint64_t previous, uint64_t agents)
{
    msgpack_pack_array(&w->pk, 5);
    put_bin(w, value, value_len);
    put_totals(w, window, current, previous, agents);
}

void rl_wire_put_total_share(rl_wire_writer *w, const char *value,
                             size_t value_len, uint64_t window,
                             uint64_t current, uint64_t previous,
                             uint64_t agents, uint64_t share, bool cut)
{
    msgpack_pack_array(&w->pk, 7);
    put_bin(w, value, value_len);
    put_totals(w, window, current, previous, agents);
    msgpack_pack_uint64(&w->pk, share);
    if (cut)
        msgpack_pack_true(&w->pk);
    else
        msgpack_pack_false(&w->pk);
}

size_t rl_wire_leaving_topic(const char *rule, char *buf, size_t cap)
{
    size_t n = strlen(rule) + 2;
    if (n > cap)
        return 0;
    buf[0] = RL_WIRE_LEAVING_TOPIC;
    memcpy(buf + 1, rule, n - 1);
    return n;
}

void rl_wire_begin_leaving(rl_wire_writer *w, const char *rule,
                           uint64_t now_ms, size_t n_entries)
{
    char topic = RL_WIRE_LEAVING_TOPIC;
    msgpack_sbuffer_write(&w->buf, &topic, 1);
    msgpack_sbuffer_write(&w->buf, rule, strlen(rule) + 1);
    put_header(w, 5, RL_WIRE_LEAVING);
    put_str(w, rule, strlen(rule));
    msgpack_pack_uint64(&w->pk, now_ms);
    msgpack_pack_array(&w->pk, n_entries);
}

void rl_wire_put_leaving(rl_wire_writer *w, const char *value,
                         size_t value_len, uint64_t window,
                         const uint64_t *counts, size_t n)
{
    msgpack_pack_array(&w->pk, 3);
    put_bin(w, value, value_len);
    msgpack_pack_uint64(&w->pk, window);
    msgpack_pack_array(&w->pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&w->pk, counts[i]);
}

void rl_wire_goodbye(rl_wire_writer *w, const char *agent_id,
                     const char *const *rules, size_t n)
{
    put_header(w, 4, RL_WIRE_GOODBYE);
    put_str(w, agent_id, strlen(agent_id));
    put_names(w, rules, n);
}

void rl_wire_begin_features(rl_wire_writer *w, uint64_t features)
{
    msgpack_sbuffer_write(&w->buf, RL_WIRE_FEATURES_TOPIC,
                          RL_WIRE_FEATURES_TOPIC_LEN);
    put_header(w, 3, RL_WIRE_FEATURES);
    msgpack_pack_uint64(&w->pk, features);
}
