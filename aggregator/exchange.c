/*
 * exchange.c: see exchange.h. Each other region has an outbox, the counts
 * applied here since its last exchange was built, merged per (rule, value,
 * sub-window), and at most one exchange outstanding: built once, numbered,
 * and sent as the same bytes to every peer of that region every interval
 * until one of them acknowledges it (the receiving region's Redis applies
 * each number once), so a resent exchange is never counted twice, and one
 * number's counts never overtake another's. A peer's nng callbacks only
 * record what happened and wake the loop (agg->wakeup); the loop does the
 * rest.
 */
#include "exchange.h"

#include "agent_id.h"
#include "demand.h"
#include "nng_handoff.h"
#include "nng_tls.h"

#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counts one outbox holds, at most, merged per key and sub-window: past
 * it, counts are dropped (counted, logged) rather than memory grown
 * without bound through a long partition. */
#define OUTBOX_MAX RL_WIRE_ENTRIES_MAX
/* Slots an emptied table keeps (about 1.5 MB); a bigger one is freed. */
#define BOX_KEPT 4096
/* Senders whose last exchange number this aggregator keeps. */
#define SENDERS_MAX 128

enum { IDLE, SENDING, RECEIVING };

typedef struct out_entry {
    uint64_t hash;       /* 0: empty */
    uint64_t w, g;       /* its sub-window, of g ms */
    uint64_t count, back, refused;
    uint16_t rule_len, value_len;
    char rule[RL_NAME_MAX + 1];
    char value[RL_WIRE_VALUE_MAX];
} out_entry;

typedef struct outbox {
    out_entry *slots;    /* open addressing, cap a power of two */
    size_t cap, used;
    uint64_t w_min, w_max; /* the sub-windows held, while used > 0 */
    uint64_t oldest_ms;  /* loop ms of the oldest count in it; 0: none */
} outbox;

/* One peer address of another region. */
typedef struct peer {
    rl_aggregator *agg;
    nng_socket sock;
    nng_ctx ctx;
    nng_aio *aio;
    const char *url;
    int state;           /* loop: IDLE, else an exchange under way */
    /* The last exchange went unanswered: its connection may be one that
     * went silent without closing (a middlebox dropped it), on which nng
     * would wait forever. The next send dials afresh. */
    bool redial;
    int step;            /* nng side: SENDING, then RECEIVING */
    /* Under the exchange's lock: the aio ended, or the probe did. */
    bool done;
    int result;
    nng_msg *reply;
    bool probe_done;
    int probe_result;
    /* Why the peer cannot be reached: nng's dialer retries in the
     * background and keeps the reason (a certificate refused, either way)
     * to itself; a probe dials once after an unanswered exchange. */
    rl_nng_probe *probe;
    bool probing;        /* loop: a probe under way */
    int probe_logged;    /* the reason last logged; 0 after an answer */
} peer;

/* Another region. */
typedef struct region_link {
    size_t region;       /* its index in the config */
    peer peers[RL_AGGREGATORS_MAX];
    size_t n_peers;
    outbox box;
    /* The exchanges built since the last one that region's totals
     * surely carry, merged as the outbox is: with the outbox, what its
     * agents have not heard of this region's (rl_exchange_unheard). */
    outbox sent;
    /* Whether sent's last exchange was acknowledged, and that region's
     * Redis clock when it answered (after applying it; 0: not said). */
    bool sent_acked;
    uint64_t acked_at_ms;
    void *batch;         /* the exchange outstanding, or NULL */
    size_t batch_len;
    uint64_t batch_seq, batch_oldest_ms;
    /* The latest upto of its exchanges whose counts are in this
     * region's Redis (its Redis clock, ms); 0: none yet. */
    uint64_t upto;
    uint64_t seq;        /* the last number given */
    uint64_t heard_ms;   /* loop ms it was last heard; 0: never */
    uint64_t dropped;    /* counts the full outbox dropped */
    uint64_t untracked;  /* entries sent could not keep */
} region_link;

typedef struct seen {
    char id[RL_WIRE_ID_MAX];
    size_t len;
    uint64_t seq;
    uint64_t used;       /* the table's clock: the oldest goes first */
} seen;

struct rl_exchange {
    pthread_mutex_t lock;
    char sender[RL_WIRE_ID_MAX + 1];
    region_link links[RL_REGIONS_MAX];
    size_t n_links;
    uint64_t started_ms;
    seen senders[SENDERS_MAX];
    uint64_t clock;
};

/* FNV-1a over a key's rule and value: the state hash_at goes on from, so
 * that a key's sub-windows are looked up without hashing it again. */
static uint64_t hash_key(const char *rule, size_t rule_len,
                         const char *value, size_t value_len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < rule_len; i++)
        h = (h ^ (unsigned char)rule[i]) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
    for (size_t i = 0; i < value_len; i++)
        h = (h ^ (unsigned char)value[i]) * 1099511628211ULL;
    return h;
}

/* ... and on over the sub-window w: an outbox slot's hash (never 0). */
static uint64_t hash_at(uint64_t h, uint64_t w)
{
    for (int i = 0; i < 8; i++, w >>= 8)
        h = (h ^ (w & 0xff)) * 1099511628211ULL;
    return h | 1;
}

static bool box_grow(outbox *b)
{
    size_t cap = b->cap ? b->cap * 2 : 64;
    out_entry *slots = calloc(cap, sizeof *slots);
    if (slots == NULL)
        return false;
    for (size_t i = 0; i < b->cap; i++) {
        if (b->slots[i].hash == 0)
            continue;
        size_t j = b->slots[i].hash & (cap - 1);
        while (slots[j].hash != 0)
            j = (j + 1) & (cap - 1);
        slots[j] = b->slots[i];
    }
    free(b->slots);
    b->slots = slots;
    b->cap = cap;
    return true;
}

/* A key's slot in b: the one holding (rule, value, w) of hash h, or the
 * empty one it would take. b has a slot (cap > 0). */
static out_entry *box_slot(const outbox *b, uint64_t h, const char *rule,
                           size_t rule_len, const char *value,
                           size_t value_len, uint64_t w)
{
    for (size_t j = h & (b->cap - 1);; j = (j + 1) & (b->cap - 1)) {
        out_entry *o = &b->slots[j];
        if (o->hash == 0
            || (o->hash == h && o->w == w && o->rule_len == rule_len
                && o->value_len == value_len
                && memcmp(o->rule, rule, rule_len) == 0
                && memcmp(o->value, value, value_len) == 0))
            return o;
    }
}

/* b's entry of (rule, value, w), made if new; NULL when b holds max
 * entries (or no memory is left). */
static out_entry *box_entry(outbox *b, const char *rule, size_t rule_len,
                            const char *value, size_t value_len, uint64_t w,
                            size_t max)
{
    uint64_t h = hash_at(hash_key(rule, rule_len, value, value_len), w);
    /* An entry held takes counts even when b is full. */
    out_entry *o = b->cap > 0 ? box_slot(b, h, rule, rule_len, value,
                                         value_len, w) : NULL;
    if (o != NULL && o->hash != 0)
        return o;
    if (b->used * 2 >= b->cap) {
        if (b->used >= max || !box_grow(b))
            return NULL;
        o = box_slot(b, h, rule, rule_len, value, value_len, w);
    }
    *o = (out_entry){.hash = h, .w = w, .rule_len = (uint16_t)rule_len,
                     .value_len = (uint16_t)value_len};
    memcpy(o->rule, rule, rule_len);
    memcpy(o->value, value, value_len);
    b->w_min = b->used == 0 || w < b->w_min ? w : b->w_min;
    b->w_max = b->used == 0 || w > b->w_max ? w : b->w_max;
    b->used++;
    return o;
}

/* Empties b. A table a long cut grew is given back: the next exchanges
 * are an interval's counts again. */
static void box_clear(outbox *b)
{
    if (b->cap > BOX_KEPT) {
        free(b->slots);
        b->slots = NULL;
        b->cap = 0;
    } else if (b->cap > 0) {
        memset(b->slots, 0, b->cap * sizeof *b->slots);
    }
    b->used = 0;
}

/* What b counts of a key (its hash h) in sub-windows from..to, give-backs
 * taken off: only those b holds are looked up (an interval's, mostly). */
static uint64_t box_net(const outbox *b, uint64_t h, const char *rule,
                        size_t rule_len, const char *value, size_t value_len,
                        uint64_t from, uint64_t to)
{
    uint64_t sum = 0;
    if (b->used == 0)
        return 0;
    for (uint64_t w = from > b->w_min ? from : b->w_min;
         w <= to && w <= b->w_max; w++) {
        const out_entry *o = box_slot(b, hash_at(h, w), rule, rule_len,
                                      value, value_len, w);
        if (o->hash != 0 && o->count > o->back)
            sum += o->count - o->back;
    }
    return sum;
}

void rl_exchange_count(rl_aggregator *agg, const rl_rule *rule,
                       const rl_wire_entry *e, uint64_t now_ms)
{
    rl_exchange *x = agg->exchange;
    if (x == NULL || !rule->global || e->value.len > RL_WIRE_VALUE_MAX)
        return;
    uint64_t g = rl_wire_subwindow_ms(rule->period_ms);
    uint64_t w = (e->at_ms > 0 ? e->at_ms : now_ms) / g;
    for (size_t i = 0; i < x->n_links; i++) {
        region_link *l = &x->links[i];
        out_entry *o = box_entry(&l->box, rule->name, strlen(rule->name),
                                 e->value.ptr, e->value.len, w, OUTBOX_MAX);
        if (o == NULL) {
            if (l->dropped++ == 0)
                rl_log(&agg->log, RL_LOG_WARN, "exchange_dropped",
                       "region=%s reason=\"the outbox is full (%d keys "
                       "and sub-windows): that region undercounts this "
                       "one's until the link is back\"",
                       agg->boot_config->regions.regions[l->region].name,
                       OUTBOX_MAX);
            continue;
        }
        o->g = g;
        o->count += e->count;
        o->back += e->back;
        o->refused += e->refused;
        if (l->box.oldest_ms == 0)
            l->box.oldest_ms = uv_now(agg->loop);
    }
}

/* The outbox, about to go out, into sent: that region's agents hear of it
 * only with its totals after the exchange is applied there. At a stop no
 * totals are published again: nothing is kept. */
static void keep_sent(rl_aggregator *agg, region_link *l)
{
    l->sent_acked = false;
    if (agg->stopping)
        return;
    for (size_t j = 0; j < l->box.cap; j++) {
        const out_entry *o = &l->box.slots[j];
        if (o->hash == 0)
            continue;
        out_entry *s = box_entry(&l->sent, o->rule, o->rule_len, o->value,
                                 o->value_len, o->w, 2 * OUTBOX_MAX);
        if (s == NULL) {
            if (l->untracked++ == 0)
                rl_log(&agg->log, RL_LOG_WARN, "exchange_untracked",
                       "region=%s reason=\"more counts sent there and "
                       "not in its totals yet than %d keys and "
                       "sub-windows, or no memory: those are not taken "
                       "off this region's room\"",
                       agg->boot_config->regions.regions[l->region].name,
                       2 * OUTBOX_MAX);
            continue;
        }
        s->count += o->count;
        s->back += o->back;
    }
}

/* The outbox as one EXCHANGE, emptied into l->batch. A count and a
 * give-back of one sub-window net out. */
static bool build_batch(rl_aggregator *agg, region_link *l, rl_wire_writer *w)
{
    const rl_regions_config *rc = &agg->boot_config->regions;
    rl_wire_writer_reset(w);
    /* Agents report at each multiple of the interval of Redis's clock:
     * what they counted before the last one is in (the batch is built
     * at rl_exchange_send, after it). */
    uint64_t interval = agg->boot_config->aggregator.sync_interval_ms;
    uint64_t upto = rl_store_now_ms(agg->store) / interval * interval;
    rl_wire_begin_exchange(w, rc->regions[rc->self].name,
                           agg->exchange->sender, l->seq + 1, upto,
                           l->box.used);
    for (size_t j = 0; j < l->box.cap; j++) {
        const out_entry *o = &l->box.slots[j];
        if (o->hash == 0)
            continue;
        uint64_t count = o->count > o->back ? o->count - o->back : 0;
        uint64_t back = o->back > o->count ? o->back - o->count : 0;
        rl_wire_put_demand_at(w, o->rule, o->value, o->value_len, count,
                              back, o->w * o->g + o->g / 2, o->refused);
    }
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    void *copy = malloc(len);
    if (copy == NULL)
        return false;
    memcpy(copy, data, len);
    l->batch = copy;
    l->batch_len = len;
    l->batch_seq = ++l->seq;
    keep_sent(agg, l);
    l->batch_oldest_ms = l->box.oldest_ms != 0 ? l->box.oldest_ms
                                               : uv_now(agg->loop);
    box_clear(&l->box);
    l->box.oldest_ms = 0;
    return true;
}

/* How long an exchange waits for its answer before its connection is
 * taken for one gone silent (a middlebox dropped it without a reset) and
 * dialled again: two intervals, and a second more for a round trip
 * between continents (an exchange waits for the last one's answer, so
 * they go once an interval or once a round trip, whichever is longer). */
static uint64_t answer_within_ms(const rl_aggregator *agg)
{
    return 2ULL * agg->boot_config->aggregator.sync_interval_ms + 1000;
}

static void finish(peer *p, int result, nng_msg *reply)
{
    rl_exchange *x = p->agg->exchange;
    pthread_mutex_lock(&x->lock);
    p->done = true;
    p->result = result;
    p->reply = reply;
    pthread_mutex_unlock(&x->lock);
    uv_async_send(&p->agg->wakeup);
}

static void on_probe(void *arg, int result)
{
    peer *p = arg;
    rl_nng_handoff(p);
    rl_exchange *x = p->agg->exchange;
    pthread_mutex_lock(&x->lock);
    p->probe_done = true;
    p->probe_result = result;
    pthread_mutex_unlock(&x->lock);
    uv_async_send(&p->agg->wakeup);
}

/* Logged once per reason, until the peer answers again. */
static void probe_finished(rl_aggregator *agg, const region_link *l,
                           peer *p, int result)
{
    p->probing = false;
    rl_nng_probe_reset(p->probe);
    if (result == 0 || result == p->probe_logged)
        return;
    p->probe_logged = result;
    bool tls = rl_nng_probe_tls_refused(result);
    rl_log(&agg->log, tls ? RL_LOG_ERROR : RL_LOG_WARN,
           "exchange_peer_unreachable", "region=%s peer=%s reason=\"%s\" "
           "hint=\"%s\"", agg->boot_config->regions.regions[l->region].name,
           p->url, nng_strerror(result), tls
               ? "TLS refused: check aggregator.tls in both regions (each "
                 "one's ca must have signed the other's aggregators' "
                 "certificates, server_name must be a name in them)"
               : "check that the region's rl-aggregator runs and listens "
                 "on this peer address");
}

static void on_peer(void *arg)
{
    peer *p = arg;
    rl_nng_handoff(p);
    int rv = nng_aio_result(p->aio);
    if (p->step == SENDING && rv == 0) {
        p->step = RECEIVING;
        /* Read before the hand-off: once the receive is started, a
         * redial may stop and free them. */
        nng_ctx ctx = p->ctx;
        nng_aio *aio = p->aio;
        rl_nng_handoff(p);
        nng_ctx_recv(ctx, aio);
        return;
    }
    if (p->step == SENDING)
        nng_msg_free(nng_aio_get_msg(p->aio));
    nng_msg *reply = p->step == RECEIVING && rv == 0
                         ? nng_aio_get_msg(p->aio) : NULL;
    finish(p, rv, reply);
    /* The last access: a stop (redial, rl_exchange_stop) may free the
     * aio, and the peer, once this callback has returned. */
    rl_nng_handoff(p);
}

static void send_to(rl_aggregator *agg, region_link *l, peer *p)
{
    nng_msg *msg;
    if (nng_msg_alloc(&msg, 0) != 0
        || nng_msg_append(msg, l->batch, l->batch_len) != 0) {
        rl_log(&agg->log, RL_LOG_ERROR, "exchange_not_sent",
               "reason=\"out of memory\"");
        return;
    }
    p->state = SENDING;
    p->step = SENDING;
    nng_aio_set_timeout(p->aio, (int)answer_within_ms(agg));
    nng_aio_set_msg(p->aio, msg);
    rl_nng_handoff(p);
    nng_ctx_send(p->ctx, p->aio);
}

static int open_peer(rl_aggregator *agg, peer *p, char *err, size_t errlen)
{
    int rv = nng_req0_open(&p->sock);
    if (rv == 0)
        rv = nng_socket_set_size(p->sock, NNG_OPT_RECVMAXSZ,
                                 agg->boot_config->aggregator
                                     .max_message_bytes);
    /* nng resends an unanswered request on its own (and on a new
     * connection after a reconnect): each interval, as the loop would. */
    if (rv == 0)
        rv = nng_socket_set_ms(p->sock, NNG_OPT_REQ_RESENDTIME,
                               agg->boot_config->aggregator
                                   .sync_interval_ms);
    if (rv == 0)
        rv = nng_ctx_open(&p->ctx, p->sock);
    if (rv == 0)
        rv = nng_aio_alloc(&p->aio, on_peer, p);
    if (rv != 0) {
        snprintf(err, errlen, "cannot open an exchange socket: %s",
                 nng_strerror(rv));
        return -1;
    }
    return rl_nng_dial(p->sock, p->url, &agg->boot_config->aggregator.tls,
                       err, errlen);
}

/* Closes the peer's socket and dials again: its context and aio go with
 * the socket, so they are made again too. */
static void redial(rl_aggregator *agg, peer *p)
{
    char err[256];
    p->redial = false;
    nng_aio_stop(p->aio);
    rl_nng_handoff(p);
    nng_aio_free(p->aio);
    p->aio = NULL;
    nng_close(p->sock);
    if (open_peer(agg, p, err, sizeof err) != 0)
        rl_log(&agg->log, RL_LOG_WARN, "exchange_redial_failed",
               "peer=%s reason=\"%s\"", p->url, err);
}

static void send_all(rl_aggregator *agg, bool heartbeats)
{
    rl_exchange *x = agg->exchange;
    if (x == NULL)
        return;
    rl_wire_writer *w = rl_wire_writer_new();
    if (w == NULL)
        return;
    for (size_t i = 0; i < x->n_links; i++) {
        region_link *l = &x->links[i];
        if (l->batch == NULL && !heartbeats && l->box.used == 0)
            continue;
        if (l->batch == NULL && !build_batch(agg, l, w))
            continue;
        for (size_t k = 0; k < l->n_peers; k++) {
            peer *p = &l->peers[k];
            if (p->state != IDLE)
                continue;
            if (p->redial)
                redial(agg, p);
            if (p->aio != NULL)
                send_to(agg, l, p);
        }
    }
    rl_wire_writer_free(w);
}

void rl_exchange_send(rl_aggregator *agg)
{
    send_all(agg, true);
}

bool rl_exchange_flushed(rl_aggregator *agg, uint64_t since_ms)
{
    rl_exchange *x = agg->exchange;
    size_t left = 0;
    for (size_t i = 0; x != NULL && i < x->n_links; i++)
        left += x->links[i].batch != NULL || x->links[i].box.used > 0;
    if (left == 0)
        return true;
    uint64_t waited = uv_now(agg->loop) - since_ms;
    if (waited > 3ULL * agg->boot_config->aggregator.sync_interval_ms) {
        rl_log(&agg->log, RL_LOG_WARN, "exchange_unsent", "regions=%zu "
               "waited_ms=%llu reason=\"no answer: those regions miss "
               "this one's last counts\"", left,
               (unsigned long long)waited);
        return true;
    }
    send_all(agg, false);
    return false;
}

/* An answer from one of l's peers: the batch is in that region once any
 * peer says it applied it or had. */
static void answered(rl_aggregator *agg, region_link *l, nng_msg *reply)
{
    rl_wire_msg ack;
    const char *why = NULL;
    if (rl_wire_decode(nng_msg_body(reply), nng_msg_len(reply), &ack, &why)
        != 0 || ack.type != RL_WIRE_ACK) {
        rl_log(&agg->log, RL_LOG_WARN, "exchange_answer_refused",
               "region=%s reason=\"%s\"",
               agg->boot_config->regions.regions[l->region].name,
               why != NULL ? why : "not an ACK");
        return;
    }
    if (l->batch != NULL && ack.seq == l->batch_seq
        && ack.status != RL_ACK_RETRY) {
        l->sent_acked = true;
        l->acked_at_ms = ack.now_ms;
        free(l->batch);
        l->batch = NULL;
    }
    rl_wire_msg_free(&ack);
}

void rl_exchange_drain(rl_aggregator *agg)
{
    rl_exchange *x = agg->exchange;
    if (x == NULL)
        return;
    for (size_t i = 0; i < x->n_links; i++) {
        region_link *l = &x->links[i];
        for (size_t k = 0; k < l->n_peers; k++) {
            peer *p = &l->peers[k];
            pthread_mutex_lock(&x->lock);
            bool done = p->done, probe_done = p->probe_done;
            nng_msg *reply = p->reply;
            int result = p->result, probe_result = p->probe_result;
            p->done = p->probe_done = false;
            p->reply = NULL;
            pthread_mutex_unlock(&x->lock);
            if (probe_done)
                probe_finished(agg, l, p, probe_result);
            if (!done)
                continue;
            p->state = IDLE;
            p->redial = result == NNG_ETIMEDOUT;
            /* Unanswered: find out why (a TLS handshake gets at least a
             * second). */
            if (p->redial && p->probe != NULL && !p->probing) {
                uint64_t wait = answer_within_ms(agg);
                p->probing = true;
                rl_nng_handoff(p);
                rl_nng_probe_start(p->probe, (int)wait);
            }
            if (reply != NULL) {
                p->probe_logged = 0;
                answered(agg, l, reply);
                nng_msg_free(reply);
            }
        }
    }
}

int rl_exchange_start(rl_aggregator *agg, char *err, size_t errlen)
{
    const rl_regions_config *rc = &agg->boot_config->regions;
    if (rc->n == 0)
        return 0;
    rl_exchange *x = calloc(1, sizeof *x);
    if (x == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&x->lock, NULL);
    agg->exchange = x;
    x->started_ms = uv_now(agg->loop);
    /* Named as an agent is, unique per start: each start numbers its
     * exchanges from 1. */
    rl_agent_id_make(x->sender, sizeof x->sender);
    for (size_t r = 0; r < rc->n; r++) {
        if (r == rc->self)
            continue;
        region_link *l = &x->links[x->n_links++];
        l->region = r;
        for (size_t k = 0; k < rc->regions[r].n_peers; k++) {
            peer *p = &l->peers[l->n_peers++];
            p->agg = agg;
            p->url = rc->regions[r].peers[k];
            if (open_peer(agg, p, err, errlen) != 0)
                return -1;
            /* None for inproc://, which has no stream to probe. */
            char why[256];
            p->probe = rl_nng_probe_new(p->url,
                                        &agg->boot_config->aggregator.tls,
                                        on_probe, p, why, sizeof why);
        }
    }
    return 0;
}

void rl_exchange_stop(rl_aggregator *agg)
{
    rl_exchange *x = agg->exchange;
    if (x == NULL)
        return;
    for (size_t i = 0; i < x->n_links; i++) {
        region_link *l = &x->links[i];
        for (size_t k = 0; k < l->n_peers; k++) {
            peer *p = &l->peers[k];
            rl_nng_probe_free(p->probe);
            rl_nng_handoff(p);
            if (p->aio != NULL)
                nng_aio_stop(p->aio);
            rl_nng_handoff(p);
            nng_close(p->sock);
            if (p->aio != NULL)
                nng_aio_free(p->aio);
            /* An answer the loop did not take: written under the lock on
             * an nng thread. */
            pthread_mutex_lock(&x->lock);
            nng_msg_free(p->reply);
            p->reply = NULL;
            pthread_mutex_unlock(&x->lock);
        }
        free(l->batch);
        free(l->box.slots);
        free(l->sent.slots);
    }
    pthread_mutex_destroy(&x->lock);
    free(x);
    agg->exchange = NULL;
}

int rl_exchange_region(const rl_aggregator *agg, rl_wire_bytes name)
{
    const rl_regions_config *rc = &agg->boot_config->regions;
    for (size_t r = 0; r < rc->n; r++) {
        if (r != rc->self && strlen(rc->regions[r].name) == name.len
            && memcmp(rc->regions[r].name, name.ptr, name.len) == 0)
            return (int)r;
    }
    return -1;
}

static region_link *link_of(rl_exchange *x, size_t r)
{
    for (size_t i = 0; i < x->n_links; i++)
        if (x->links[i].region == r)
            return &x->links[i];
    return NULL;
}

bool rl_exchange_heard(rl_aggregator *agg, size_t r, rl_wire_bytes sender,
                       uint64_t seq)
{
    rl_exchange *x = agg->exchange;
    region_link *l = x != NULL ? link_of(x, r) : NULL;
    if (l == NULL)
        return false;
    l->heard_ms = uv_now(agg->loop);
    seen *s = &x->senders[0];
    for (size_t i = 0; i < SENDERS_MAX; i++) {
        seen *t = &x->senders[i];
        if (t->len == sender.len && memcmp(t->id, sender.ptr, t->len) == 0) {
            s = t;
            break;
        }
        if (t->used < s->used)
            s = t;
    }
    if (s->len != sender.len || memcmp(s->id, sender.ptr, s->len) != 0) {
        memcpy(s->id, sender.ptr, sender.len);
        s->len = sender.len;
        s->seq = 0;
    }
    s->used = ++x->clock;
    if (seq <= s->seq)
        return false;
    s->seq = seq;
    return true;
}

bool rl_exchange_cut(const rl_aggregator *agg)
{
    const rl_exchange *x = agg->exchange;
    if (x == NULL)
        return false;
    uint64_t now = uv_now(agg->loop);
    /* Not before an exchange could have been answered, resent and come
     * again: a slow link is not a cut. */
    uint64_t stale = agg->boot_config->aggregator.stale_after_ms;
    uint64_t resent = answer_within_ms(agg)
                      + agg->boot_config->aggregator.sync_interval_ms;
    stale = stale > resent ? stale : resent;
    for (size_t i = 0; i < x->n_links; i++)
        if (x->links[i].heard_ms == 0 || now - x->links[i].heard_ms > stale)
            return true;
    return false;
}

void rl_exchange_applied(rl_aggregator *agg, size_t r, uint64_t upto)
{
    region_link *l = agg->exchange != NULL ? link_of(agg->exchange, r)
                                           : NULL;
    if (l != NULL && upto > l->upto)
        l->upto = upto;
}

uint64_t rl_exchange_snapshot_ms(const rl_aggregator *agg)
{
    const rl_exchange *x = agg->exchange;
    uint64_t at = UINT64_MAX;
    for (size_t i = 0; x != NULL && i < x->n_links; i++)
        if (x->links[i].upto < at)
            at = x->links[i].upto;
    return at == UINT64_MAX ? 0 : at;
}

void rl_exchange_publishing(rl_aggregator *agg, uint64_t at_ms)
{
    rl_exchange *x = agg->exchange;
    for (size_t i = 0; x != NULL && i < x->n_links; i++) {
        region_link *l = &x->links[i];
        /* Applied there before at_ms by its clock: in the totals it
         * publishes at that moment of its interval too, however late
         * either loop runs them. */
        if (l->sent_acked && l->sent.used > 0
            && (l->acked_at_ms == 0 || l->acked_at_ms < at_ms))
            box_clear(&l->sent);
    }
}

uint64_t rl_exchange_unheard(const rl_aggregator *agg, size_t r,
                             const rl_rule *rule, const char *value,
                             size_t value_len, uint64_t now_ms)
{
    const region_link *l = agg->exchange != NULL
                               ? link_of(agg->exchange, r) : NULL;
    if (l == NULL || value_len > RL_WIRE_VALUE_MAX)
        return 0;
    size_t rule_len = strlen(rule->name);
    uint64_t h = hash_key(rule->name, rule_len, value, value_len);
    /* The span's sub-windows, and one ahead: an agent's clock may run a
     * little ahead of this Redis's. */
    uint64_t g = rl_wire_subwindow_ms(rule->period_ms), to = now_ms / g + 1;
    uint64_t from = to > RL_WIRE_SUBWINDOWS + 1 ? to - RL_WIRE_SUBWINDOWS - 1
                                                : 0;
    return box_net(&l->box, h, rule->name, rule_len, value, value_len, from,
                   to)
           + box_net(&l->sent, h, rule->name, rule_len, value, value_len,
                     from, to);
}

void rl_exchange_render(const rl_aggregator *agg,
                        void (*put)(void *, const char *, ...), void *arg)
{
    const rl_exchange *x = agg->exchange;
    if (x == NULL)
        return;
    uint64_t now = uv_now(agg->loop);
    const rl_regions_config *rc = &agg->boot_config->regions;
    put(arg, "# HELP rl_agg_region_heard_seconds Time since an exchange "
             "last came from the region (since the start: never).\n"
             "# TYPE rl_agg_region_heard_seconds gauge\n");
    for (size_t i = 0; i < x->n_links; i++) {
        const region_link *l = &x->links[i];
        uint64_t since = now - (l->heard_ms ? l->heard_ms : x->started_ms);
        put(arg, "rl_agg_region_heard_seconds{region=\"%s\"} %.3f\n",
            rc->regions[l->region].name, (double)since / 1000);
    }
    put(arg, "# HELP rl_agg_region_exchange_lag_seconds Age of the oldest "
             "count the region has not acknowledged (0: none).\n"
             "# TYPE rl_agg_region_exchange_lag_seconds gauge\n");
    for (size_t i = 0; i < x->n_links; i++) {
        const region_link *l = &x->links[i];
        uint64_t oldest = l->batch != NULL ? l->batch_oldest_ms
                                           : l->box.oldest_ms;
        put(arg, "rl_agg_region_exchange_lag_seconds{region=\"%s\"} %.3f\n",
            rc->regions[l->region].name,
            oldest ? (double)(now - oldest) / 1000 : 0.0);
    }
    put(arg, "# HELP rl_agg_region_exchange_dropped_total Counts not sent "
             "to the region: its outbox was full.\n"
             "# TYPE rl_agg_region_exchange_dropped_total counter\n");
    for (size_t i = 0; i < x->n_links; i++)
        put(arg, "rl_agg_region_exchange_dropped_total{region=\"%s\"} "
                 "%llu\n",
            rc->regions[x->links[i].region].name,
            (unsigned long long)x->links[i].dropped);
}
