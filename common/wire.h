/*
 * wire.h: the messages between agents and aggregators, msgpack over nng.
 * Every message is a msgpack array that starts with the format version and
 * the message type. Private to rl.
 *
 *   REPORT  agent -> aggregator (REQ)
 *           [1, 1, agent_id, seq, [[rule, value, count (, at)], ...]
 *            (, [rule, ...] (, stream))]
 *           The optional presence field names the agent's rules that
 *           need a fleet size (every synced rule, every rule with
 *           on_error: local), counts or not: the aggregator counts the
 *           agent in them (presence). A count of 0 asks for the key's
 *           totals without adding to them. stream (0 when absent) is
 *           which of the agent's report streams this is, one per
 *           aggregator in its config: each stream is numbered 1, 2, 3...
 *           on its own, and applied once per (agent_id, stream).
 *           Sequence number 0 is a ping: never applied, it is answered
 *           as a duplicate, with Redis's clock. An entry's at, when
 *           there, is a time (Redis's clock in ms, as the agent knows it)
 *           in the sub-window (below) its count was made in: the count goes
 *           to the aggregator's sub-window of that time, or to none once it
 *           has left every span it could matter to (held reports weigh
 *           what they weighed when their requests were admitted). A time,
 *           not a sub-window's number: an agent and an aggregator that a
 *           rolling reload has given different periods number sub-windows
 *           differently. Without it (an older agent), the count goes to the
 *           sub-window it arrives in. Agents send it only to aggregators
 *           that said they read it (FEATURES): an older aggregator refuses
 *           an entry of four fields.
 *           A negative count (with its at, always) is a give-back: a
 *           hold's estimate counted in that sub-window and already
 *           reported, less its actual cost. It is taken off that
 *           sub-window's count, never below 0, and dropped once the
 *           sub-window has left every span. Agents send one only to
 *           aggregators that said they read it (FEATURES): an older one
 *           refuses the whole report.
 *   ACK     aggregator -> agent (REP), once the report is in Redis
 *           [1, 2, seq, status, now_ms, [[rule, value, window, current,
 *            previous, agents], ...]]
 *           One entry per report entry, in order. window 0 (no sub-window
 *           has it) says the entry's count was refused, not counted: the
 *           aggregator has no such synced rule (a reload removed it).
 *           An entry of five fields, [rule, value, count, at, refused],
 *           also says how many requests of the key its agent refused in
 *           that sub-window: a global rule's (scope: global), for its
 *           region's demand. Agents send it only to aggregators that said
 *           they read it (FEATURES).
 *   TOTALS  aggregator -> agents (PUB), one per rule and interval, after a
 *           topic prefix "rule\0"
 *           [1, 3, rule, now_ms, stale, agents, [[value, window, current,
 *            previous, agents], ...]]
 *           A global rule's entries have two more fields, [..., share,
 *           cut]: the region's part of the key's room, in millionths
 *           (RL_WIRE_SHARE_WHOLE is all of it), which the region's agents
 *           split among them; and whether a region has not been heard
 *           for a while (its last demand keeps its part: decisions on the
 *           key are marked degraded).
 *
 *   FEATURES aggregator -> agents (PUB), once per interval, after a topic
 *           of one NUL byte (no rule's topic starts so: agents that do not
 *           know this message never subscribe to it)
 *           [1, 4, features]: the RL_WIRE_FEATURE_* bits this aggregator
 *           reads.
 *   GOODBYE agent -> aggregator (REQ), once, at the agent's close, after
 *           its last reports, to aggregators that said they read it
 *           (FEATURES; an older one would refuse it as malformed)
 *           [1, 5, agent_id, [rule, ...]]: the agent leaves the agent
 *           counts of those rules (its presence names) at once, rather
 *           than when it has not reported for a while. Answered with an
 *           ACK of seq 0 and no entries.
 *   LEAVING aggregator -> agents (PUB), after each TOTALS message of a
 *           rule whose sub-windows are shorter than the sync interval
 *           (rl_wire_leaving_count > 0), under the topic "\1rule\0"
 *           (RL_WIRE_LEAVING_TOPIC, then the rule's: no rule's topic
 *           starts so, and agents that do not know the message never
 *           subscribe to it)
 *           [1, 7, rule, now_ms, [[value, window, [count, ...]], ...]]
 *           For each key of that TOTALS message read so (window, and the
 *           read's now_ms), the counts of the sub-windows w - N + 1,
 *           w - N + 2, ... that recent holds and that leave the span
 *           before the next totals come: an agent frees each at the edge
 *           it leaves at, as it frees oldest at the first (agent/synced.c).
 *           Without it (an older aggregator), their room waits for the
 *           next totals.
 *   EXCHANGE aggregator -> another region's aggregators (REQ, on that
 *           region's peers), every interval
 *           [1, 6, region, sender, seq, upto, [[rule, value, count, at,
 *            refused], ...]]
 *           What the sending region's agents counted (and refused) of
 *           its global rules' keys since the sender's last exchange that
 *           was acknowledged, per sub-window of the sender's Redis clock
 *           (at); a negative count is a give-back. upto (the sender's
 *           Redis clock, ms) is the tick by which the agents' reports it
 *           holds were made: what they counted before it is in this
 *           exchange or an earlier one. sender names the
 *           sending aggregator and its start, as an agent id does: each
 *           sender numbers its exchanges 1, 2, 3..., and resends one
 *           whole until acknowledged (an ACK with no entries); the
 *           receiving region applies each (sender, seq) once.
 *
 * agents is how many agents are live in the rule: they reported it
 * (counts or presence) within the last RL_WIRE_LIVE_INTERVALS sync
 * intervals, by Redis's clock, and did not say goodbye since; 0 in TOTALS
 * means not known (an
 * aggregator that has applied nothing since it started has read no count
 * from Redis yet), and agents keep the count they had.
 *
 * Counts are kept per sub-window of g = rl_wire_subwindow_ms(period) ms,
 * RL_WIRE_SUBWINDOWS to a period. In ACK and TOTALS, window is the
 * sub-window w the totals were read in, current ("recent") the sum of the
 * sub-windows w - N + 1 .. w, and previous ("oldest") the count of
 * sub-window w - N, N = RL_WIRE_SUBWINDOWS: recent + oldest is never less
 * than what was counted in the period up to now.
 *
 * now_ms is Redis's clock as the aggregator knows it; windows are numbered
 * by it (window = now_ms / g), never by an agent's clock. g is the
 * aggregator's period's: a window number read against now_ms says which
 * period numbered it (agent/synced.c), so no field names it.
 */
#ifndef RL_COMMON_WIRE_H
#define RL_COMMON_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RL_WIRE_VERSION 1
#define RL_WIRE_REPORT 1
#define RL_WIRE_ACK 2
#define RL_WIRE_TOTALS 3
#define RL_WIRE_FEATURES 4
#define RL_WIRE_GOODBYE 5
#define RL_WIRE_EXCHANGE 6
#define RL_WIRE_LEAVING 7

/* FEATURES bits. */
#define RL_WIRE_FEATURE_WINDOWS 1u   /* REPORT entries' at */
#define RL_WIRE_FEATURE_GOODBYE 2u   /* GOODBYE */
#define RL_WIRE_FEATURE_GIVEBACK 4u  /* REPORT entries' negative counts */
#define RL_WIRE_FEATURE_DEMAND 8u    /* REPORT entries' refused */
/* The topic FEATURES messages come under, and its length. */
#define RL_WIRE_FEATURES_TOPIC ""
#define RL_WIRE_FEATURES_TOPIC_LEN 1

/* The byte LEAVING's topic starts with, before the rule's topic. */
#define RL_WIRE_LEAVING_TOPIC '\1'

/* Decoders refuse anything larger or longer than these. */
#define RL_WIRE_MESSAGE_MAX (4u << 20)
#define RL_WIRE_ENTRIES_MAX 65536
#define RL_WIRE_ID_MAX 64
#define RL_WIRE_NAME_MAX 64
#define RL_WIRE_VALUE_MAX 256
#define RL_WIRE_COUNT_MAX ((1ULL << 53) - 1)
#define RL_WIRE_PRESENCE_MAX 4096   /* rule names in one REPORT */
#define RL_WIRE_STREAMS_MAX 16      /* report streams of one agent */
#define RL_WIRE_REGION_MAX 32       /* a region's name */
/* A TOTALS entry's share when the region has all of the key's room. */
#define RL_WIRE_SHARE_WHOLE 1000000u

/* An agent that has not reported for this many sync intervals leaves its
 * rules' agent counts: a few, so that a report late by an interval or two
 * (a loaded host, a resend) does not shrink the fleet, and far less than
 * a period, so that a dead agent does not shrink every share for long. */
#define RL_WIRE_LIVE_INTERVALS 5

/* Sub-windows per period: the trailing estimate over-counts by at most one
 * sub-window's requests, and room freed comes back one sub-window late. */
#define RL_WIRE_SUBWINDOWS 20

/* The length of a rule's sub-windows: ceil(period / RL_WIRE_SUBWINDOWS),
 * so that RL_WIRE_SUBWINDOWS of them cover at least a period. */
static inline uint64_t rl_wire_subwindow_ms(uint64_t period_ms)
{
    uint64_t g = (period_ms + RL_WIRE_SUBWINDOWS - 1) / RL_WIRE_SUBWINDOWS;
    return g > 0 ? g : 1;
}

/* The most counts a LEAVING entry carries: all an interval needs for a
 * period of two intervals or more; a shorter period's others leave with
 * the next totals, as before LEAVING. */
#define RL_WIRE_LEAVING_MAX (RL_WIRE_SUBWINDOWS / 2)

/* How many sub-windows after the oldest a rule's totals name in LEAVING:
 * those that leave the span before the next totals, when an interval
 * holds more than one edge, and one more for totals that come late;
 * 0 when every interval holds at most one edge (the oldest covers it). */
static inline size_t rl_wire_leaving_count(uint64_t period_ms,
                                           uint64_t interval_ms)
{
    uint64_t g = rl_wire_subwindow_ms(period_ms);
    if (interval_ms <= g)
        return 0;
    uint64_t k = (interval_ms + g - 1) / g;
    return k < RL_WIRE_LEAVING_MAX ? (size_t)k : RL_WIRE_LEAVING_MAX;
}

/* ACK status. */
#define RL_ACK_APPLIED 0
#define RL_ACK_DUPLICATE 1   /* applied before: not counted again */
#define RL_ACK_RETRY 2       /* the store is away: send the same report again */

/* Byte strings point into the decoded message's buffer. */
typedef struct rl_wire_bytes {
    const char *ptr;
    size_t len;
} rl_wire_bytes;

typedef struct rl_wire_entry {
    rl_wire_bytes rule;   /* REPORT, ACK */
    rl_wire_bytes value;
    uint64_t count;       /* REPORT */
    uint64_t back;        /* REPORT: a give-back's (a negative count's)
                           * magnitude; count is 0 then */
    uint64_t at_ms;       /* REPORT: a time in its count's sub-window, 0
                           * when the entry has none (count it now) */
    uint64_t refused;     /* REPORT, EXCHANGE: requests refused there */
    uint64_t window;      /* ACK, TOTALS */
    uint64_t current;     /* recent: fleet total of sub-windows w-N+1..w */
    uint64_t previous;    /* oldest: fleet total of sub-window w-N */
    uint64_t agents;      /* agents that reported the rule lately */
    uint64_t share;       /* TOTALS: the region's millionths of the room
                           * (RL_WIRE_SHARE_WHOLE unless a global rule's) */
    bool cut;             /* TOTALS: a region has not been heard */
    const uint64_t *leaving; /* LEAVING: counts of w-N+1, w-N+2, ... */
    size_t n_leaving;
} rl_wire_entry;

typedef struct rl_wire_msg {
    int type;
    rl_wire_bytes agent_id; /* REPORT, GOODBYE; EXCHANGE: its sender */
    rl_wire_bytes region;   /* EXCHANGE: the sending region */
    rl_wire_bytes rule;     /* TOTALS, LEAVING */
    uint64_t seq;           /* REPORT, ACK, EXCHANGE */
    uint64_t stream;        /* REPORT: 0 when the field is absent */
    uint64_t status;        /* ACK */
    uint64_t now_ms;        /* ACK, TOTALS, LEAVING; EXCHANGE: its upto */
    bool stale;             /* TOTALS: the aggregator cannot reach Redis */
    uint64_t agents;        /* TOTALS: agents reporting the rule */
    uint64_t features;      /* FEATURES: RL_WIRE_FEATURE_* bits */
    rl_wire_entry *entries; /* owned: free with rl_wire_msg_free */
    size_t n_entries;
    bool has_presence;      /* REPORT: the presence field was there */
    rl_wire_bytes *presence; /* REPORT, GOODBYE: owned, like entries */
    size_t n_presence;
    uint64_t *leaving;      /* LEAVING: the entries' counts, owned */
} rl_wire_msg;

/* rl_wire_decode parses one message of len bytes (for TOTALS, after its
 * topic). It checks everything: version, type, field types, lengths, counts,
 * that nothing is left over. On failure it returns -1 and writes why
 * (static text) into *why; nothing is allocated then. */
int rl_wire_decode(const void *buf, size_t len, rl_wire_msg *out,
                   const char **why);

void rl_wire_msg_free(rl_wire_msg *msg);

/* An encoder over a growing buffer (msgpack-c's). */
typedef struct rl_wire_writer rl_wire_writer;

rl_wire_writer *rl_wire_writer_new(void);
void rl_wire_writer_free(rl_wire_writer *w);
/* The bytes written so far (valid until the next write or reset). */
const void *rl_wire_writer_data(const rl_wire_writer *w, size_t *len);
void rl_wire_writer_reset(rl_wire_writer *w);

void rl_wire_begin_report(rl_wire_writer *w, const char *agent_id,
                          uint64_t seq, size_t n_entries);
void rl_wire_put_count(rl_wire_writer *w, const char *rule, const char *value,
                       size_t value_len, uint64_t count);
/* The same with a time in the sub-window the count was made in (at_ms >
 * 0, Redis's clock), for an aggregator that reads it
 * (RL_WIRE_FEATURE_WINDOWS). */
void rl_wire_put_count_at(rl_wire_writer *w, const char *rule,
                          const char *value, size_t value_len,
                          uint64_t count, uint64_t at_ms);
/* A give-back of back (> 0) in the sub-window of at_ms (> 0), written as
 * a negative count, for an aggregator that reads it
 * (RL_WIRE_FEATURE_GIVEBACK). */
void rl_wire_put_giveback_at(rl_wire_writer *w, const char *rule,
                             const char *value, size_t value_len,
                             uint64_t back, uint64_t at_ms);
/* An entry of five fields: a count (or a give-back, back > 0) in the
 * sub-window of at_ms, and the requests refused there, for an aggregator
 * that reads them (RL_WIRE_FEATURE_DEMAND), or in an EXCHANGE. */
void rl_wire_put_demand_at(rl_wire_writer *w, const char *rule,
                           const char *value, size_t value_len,
                           uint64_t count, uint64_t back, uint64_t at_ms,
                           uint64_t refused);
/* An EXCHANGE: begin, then n_entries rl_wire_put_demand_at. */
void rl_wire_begin_exchange(rl_wire_writer *w, const char *region,
                            const char *sender, uint64_t seq, uint64_t upto,
                            size_t n_entries);
/* A REPORT with the presence field: begin, put n_entries counts, then
 * rl_wire_put_presence once with its names. */
void rl_wire_begin_report_presence(rl_wire_writer *w, const char *agent_id,
                                   uint64_t seq, size_t n_entries);
void rl_wire_put_presence(rl_wire_writer *w, const char *const *rules,
                          size_t n);
/* The same for report stream stream (< RL_WIRE_STREAMS_MAX): stream 0
 * writes the 6-field REPORT an aggregator without streams reads. */
void rl_wire_begin_report_stream(rl_wire_writer *w, const char *agent_id,
                                 uint64_t seq, size_t n_entries,
                                 uint64_t stream);

void rl_wire_begin_ack(rl_wire_writer *w, uint64_t seq, uint64_t status,
                       uint64_t now_ms, size_t n_entries);
void rl_wire_put_ack_total(rl_wire_writer *w, const char *rule,
                           const char *value, size_t value_len,
                           uint64_t window, uint64_t current,
                           uint64_t previous, uint64_t agents);

/* TOTALS starts with its topic, "rule\0", so that agents can subscribe by
 * rule. */
void rl_wire_begin_totals(rl_wire_writer *w, const char *rule,
                          uint64_t now_ms, bool stale, uint64_t agents,
                          size_t n_entries);
void rl_wire_put_total(rl_wire_writer *w, const char *value,
                       size_t value_len, uint64_t window, uint64_t current,
                       uint64_t previous, uint64_t agents);

/* A global rule's TOTALS entry: with the region's share (millionths of
 * the room) and whether a region is cut off. */
void rl_wire_put_total_share(rl_wire_writer *w, const char *value,
                             size_t value_len, uint64_t window,
                             uint64_t current, uint64_t previous,
                             uint64_t agents, uint64_t share, bool cut);

/* LEAVING starts with its topic, RL_WIRE_LEAVING_TOPIC and "rule\0";
 * then n_entries rl_wire_put_leaving, each of 1 to RL_WIRE_LEAVING_MAX
 * counts. */
void rl_wire_begin_leaving(rl_wire_writer *w, const char *rule,
                           uint64_t now_ms, size_t n_entries);
void rl_wire_put_leaving(rl_wire_writer *w, const char *value,
                         size_t value_len, uint64_t window,
                         const uint64_t *counts, size_t n);

/* GOODBYE of agent_id from the n rules it named as present. */
void rl_wire_goodbye(rl_wire_writer *w, const char *agent_id,
                     const char *const *rules, size_t n);

/* FEATURES, after its topic (RL_WIRE_FEATURES_TOPIC): the message to
 * publish as it is. */
void rl_wire_begin_features(rl_wire_writer *w, uint64_t features);

/* The topic bytes a TOTALS message of rule starts with, and its length. */
size_t rl_wire_topic(const char *rule, char *buf, size_t cap);
/* The same for its LEAVING messages. */
size_t rl_wire_leaving_topic(const char *rule, char *buf, size_t cap);

#endif
