/*
 * The wire format: what is written reads back the same, and every way a
 * peer can get a message wrong is refused with a reason, without a crash
 * and without allocating what the message claims.
 */
#include "wire.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static rl_wire_msg decode_ok(rl_wire_writer *w, size_t skip)
{
    size_t len;
    const char *data = rl_wire_writer_data(w, &len);
    rl_wire_msg m;
    const char *why = NULL;
    cr_assert_eq(rl_wire_decode(data + skip, len - skip, &m, &why), 0,
                 "refused: %s", why);
    return m;
}

static const char *refusal(const void *buf, size_t len)
{
    rl_wire_msg m;
    const char *why = NULL;
    cr_assert_eq(rl_wire_decode(buf, len, &m, &why), -1, "accepted");
    cr_assert_not_null(why);
    cr_assert_null(m.entries);
    return why;
}

Test(wire, a_report_reads_back_the_same)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report(w, "agent-1", 42, 2);
    rl_wire_put_count(w, "per-tenant", "org_acme", 8, 17);
    rl_wire_put_count(w, "per-tenant", "a\0b", 3, 9007199254740991ULL);
    rl_wire_msg m = decode_ok(w, 0);
    cr_assert_eq(m.type, RL_WIRE_REPORT);
    cr_assert_eq(m.agent_id.len, 7);
    cr_assert_eq(memcmp(m.agent_id.ptr, "agent-1", 7), 0);
    cr_assert_eq(m.seq, 42);
    cr_assert_eq(m.n_entries, 2);
    cr_assert_eq(memcmp(m.entries[0].rule.ptr, "per-tenant", 10), 0);
    cr_assert_eq(m.entries[0].count, 17);
    cr_assert_eq(m.entries[1].value.len, 3);
    cr_assert_eq(memcmp(m.entries[1].value.ptr, "a\0b", 3), 0);
    cr_assert_eq(m.entries[1].count, 9007199254740991ULL);
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
}

/* An entry of three fields is counted now (at 0 when read); one of
 * four says when in Redis's clock its count was made. Both in one
 * report. */
Test(wire, a_report_entry_reads_back_with_or_without_its_window)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report(w, "agent-1", 42, 3);
    rl_wire_put_count(w, "per-tenant", "org", 3, 5);
    rl_wire_put_count_at(w, "per-tenant", "org", 3, 6, 89800);
    rl_wire_put_count_at(w, "per-tenant", "a\0b", 3, 9007199254740991ULL,
                         UINT64_MAX);
    rl_wire_msg m = decode_ok(w, 0);
    cr_assert_eq(m.type, RL_WIRE_REPORT);
    cr_assert_eq(m.n_entries, 3);
    cr_assert_eq(m.entries[0].count, 5);
    cr_assert_eq(m.entries[0].at_ms, 0);
    cr_assert_eq(m.entries[1].rule.len, 10);
    cr_assert_eq(memcmp(m.entries[1].rule.ptr, "per-tenant", 10), 0);
    cr_assert_eq(m.entries[1].value.len, 3);
    cr_assert_eq(memcmp(m.entries[1].value.ptr, "org", 3), 0);
    cr_assert_eq(m.entries[1].count, 6);
    cr_assert_eq(m.entries[1].at_ms, 89800);
    cr_assert_eq(memcmp(m.entries[2].value.ptr, "a\0b", 3), 0);
    cr_assert_eq(m.entries[2].count, 9007199254740991ULL);
    cr_assert_eq(m.entries[2].at_ms, UINT64_MAX);
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
}

/* An entry's time is never 0 (which would say "now" in a shape older
 * aggregators refuse), and an entry has four fields at most. */
Test(wire, a_report_entry_at_0_or_of_six_fields_is_refused)
{
    /* [1, 1, "a", 1, [["r", "v", 1, 0]]] */
    static const unsigned char zero[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91, 0x94,
                                         0xa1, 'r', 0xa1, 'v', 1, 0};
    cr_assert_str_eq(refusal(zero, sizeof zero), "at 0");
    /* [1, 1, "a", 1, [["r", "v", 1, 2, 3, 4]]] */
    static const unsigned char six[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91, 0x96,
                                        0xa1, 'r', 0xa1, 'v', 1, 2, 3, 4};
    cr_assert_str_eq(refusal(six, sizeof six), "wrong number of fields");
    /* [1, 1, "a", 1, [["r", "v", 1, 0, 3]]]: refused needs its at */
    static const unsigned char five[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91, 0x95,
                                         0xa1, 'r', 0xa1, 'v', 1, 0, 3};
    cr_assert_str_eq(refusal(five, sizeof five), "at 0");
    /* [1, 1, "a", 1, [["r", "v"]]] */
    static const unsigned char two[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91, 0x92,
                                        0xa1, 'r', 0xa1, 'v'};
    cr_assert_str_eq(refusal(two, sizeof two), "wrong number of fields");
    /* [1, 1, "a", 1, [["r", "v", 1, -1]]] */
    static const unsigned char negative[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91,
                                             0x94, 0xa1, 'r', 0xa1, 'v', 1,
                                             0xff};
    cr_assert_str_eq(refusal(negative, sizeof negative),
                     "expected an unsigned integer");
}

/* A give-back is a negative count, read as its magnitude (back), in every
 * width msgpack writes it, down to -(2^53 - 1). */
Test(wire, a_give_back_reads_back_as_a_negative_count)
{
    static const uint64_t backs[] = {1, 32, 33, 128, 129, 32768, 32769,
                                     2147483648ULL, 2147483649ULL,
                                     9007199254740991ULL};
    enum { N = sizeof backs / sizeof backs[0] };
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report(w, "agent-1", 7, N);
    for (size_t i = 0; i < N; i++)
        rl_wire_put_giveback_at(w, "per-tenant", "org", 3, backs[i],
                                89800 + i);
    rl_wire_msg m = decode_ok(w, 0);
    cr_assert_eq(m.n_entries, N);
    for (size_t i = 0; i < N; i++) {
        cr_assert_eq(m.entries[i].back, backs[i], "entry %zu: %llu", i,
                     (unsigned long long)m.entries[i].back);
        cr_assert_eq(m.entries[i].count, 0);
        cr_assert_eq(m.entries[i].at_ms, 89800 + i);
    }
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
}

/* A negative count is refused past -(2^53 - 1), in a signed width that
 * holds a number that is not negative, and without its sub-window. */
Test(wire, a_give_back_out_of_range_or_without_its_window_is_refused)
{
    /* [1, 1, "a", 1, [["r", "v", -2^53, 5]]] (int 64) */
    static const unsigned char big[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91, 0x94,
                                        0xa1, 'r', 0xa1, 'v', 0xd3, 0xff,
                                        0xe0, 0, 0, 0, 0, 0, 0, 5};
    cr_assert_str_eq(refusal(big, sizeof big), "number out of range");
    /* The same of -2^63, whose magnitude does not fit int 64. */
    static const unsigned char min[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91, 0x94,
                                        0xa1, 'r', 0xa1, 'v', 0xd3, 0x80,
                                        0, 0, 0, 0, 0, 0, 0, 5};
    cr_assert_str_eq(refusal(min, sizeof min), "number out of range");
    /* int 8 of 5: signed, not negative. */
    static const unsigned char positive[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91,
                                             0x94, 0xa1, 'r', 0xa1, 'v',
                                             0xd0, 5, 5};
    cr_assert_str_eq(refusal(positive, sizeof positive),
                     "a signed integer that is not negative");
    /* [1, 1, "a", 1, [["r", "v", -1]]]: no sub-window. */
    static const unsigned char bare[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91, 0x93,
                                         0xa1, 'r', 0xa1, 'v', 0xff};
    cr_assert_str_eq(refusal(bare, sizeof bare),
                     "a give-back without its sub-window");
    /* int 16 cut short. */
    static const unsigned char cut[] = {0x95, 1, 1, 0xa1, 'a', 1, 0x91, 0x94,
                                        0xa1, 'r', 0xa1, 'v', 0xd1, 0xff};
    cr_assert_str_eq(refusal(cut, sizeof cut), "message cut short");
}

/* FEATURES goes out behind a topic of one NUL byte, which no rule's topic
 * starts with, and carries its bits. */
Test(wire, features_read_back_the_same_after_their_topic)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_features(w, RL_WIRE_FEATURE_WINDOWS);
    size_t len;
    const char *data = rl_wire_writer_data(w, &len);
    cr_assert_eq(RL_WIRE_FEATURES_TOPIC_LEN, 1);
    cr_assert_eq(data[0], '\0', "the topic comes first");
    char topic[64];
    cr_assert_gt(rl_wire_topic("per-tenant", topic, sizeof topic), 0);
    cr_assert_neq(topic[0], '\0');
    rl_wire_msg m = decode_ok(w, RL_WIRE_FEATURES_TOPIC_LEN);
    cr_assert_eq(m.type, RL_WIRE_FEATURES);
    cr_assert_eq(m.features, RL_WIRE_FEATURE_WINDOWS);
    cr_assert_null(m.entries);
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
    /* [1, 4, 1, 0]: a field too many. */
    static const unsigned char four[] = {0x94, 1, 4, 1, 0};
    cr_assert_str_eq(refusal(four, sizeof four), "wrong number of fields");
}

Test(wire, acks_and_totals_read_back_the_same)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_ack(w, 7, RL_ACK_DUPLICATE, 1796000000123ULL, 1);
    rl_wire_put_ack_total(w, "per-tenant", "org", 3, 179600, 950, 1000, 10);
    rl_wire_msg m = decode_ok(w, 0);
    cr_assert_eq(m.type, RL_WIRE_ACK);
    cr_assert_eq(m.seq, 7);
    cr_assert_eq(m.status, RL_ACK_DUPLICATE);
    cr_assert_eq(m.now_ms, 1796000000123ULL);
    cr_assert_eq(m.entries[0].window, 179600);
    cr_assert_eq(m.entries[0].current, 950);
    cr_assert_eq(m.entries[0].previous, 1000);
    cr_assert_eq(m.entries[0].agents, 10);
    rl_wire_msg_free(&m);

    rl_wire_writer_reset(w);
    rl_wire_begin_totals(w, "per-tenant", 5000, true, 9, 1);
    rl_wire_put_total(w, "org", 3, 1, 2, 3, 4);
    size_t len;
    const char *data = rl_wire_writer_data(w, &len);
    char topic[64];
    size_t tlen = rl_wire_topic("per-tenant", topic, sizeof topic);
    cr_assert_eq(tlen, 11);
    cr_assert_eq(memcmp(data, topic, tlen), 0, "the topic comes first");
    m = decode_ok(w, tlen);
    cr_assert_eq(m.type, RL_WIRE_TOTALS);
    cr_assert(m.stale);
    cr_assert_eq(m.now_ms, 5000);
    cr_assert_eq(m.agents, 9);
    cr_assert_eq(m.entries[0].agents, 4);
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
}

/* A global rule's entries: a report's refusals, an exchange between
 * regions, and TOTALS with the region's share. */
Test(wire, demand_exchanges_and_shares_read_back_the_same)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report(w, "agent-1", 3, 2);
    rl_wire_put_demand_at(w, "g", "k", 1, 7, 0, 5000, 40);
    rl_wire_put_demand_at(w, "g", "k", 1, 0, 2, 4500, 0);
    rl_wire_msg m = decode_ok(w, 0);
    cr_assert_eq(m.entries[0].count, 7);
    cr_assert_eq(m.entries[0].at_ms, 5000);
    cr_assert_eq(m.entries[0].refused, 40);
    cr_assert_eq(m.entries[1].back, 2);
    cr_assert_eq(m.entries[1].refused, 0);
    rl_wire_msg_free(&m);

    rl_wire_writer_reset(w);
    rl_wire_begin_exchange(w, "eu", "region:eu/0/x", 9, 7000, 1);
    rl_wire_put_demand_at(w, "g", "k", 1, 12, 0, 6000, 1);
    m = decode_ok(w, 0);
    cr_assert_eq(m.type, RL_WIRE_EXCHANGE);
    cr_assert_eq(m.region.len, 2);
    cr_assert_eq(memcmp(m.region.ptr, "eu", 2), 0);
    cr_assert_eq(memcmp(m.agent_id.ptr, "region:eu/0/x", 13), 0);
    cr_assert_eq(m.seq, 9);
    cr_assert_eq(m.now_ms, 7000);
    cr_assert_eq(m.entries[0].count, 12);
    cr_assert_eq(m.entries[0].refused, 1);
    rl_wire_msg_free(&m);

    rl_wire_writer_reset(w);
    rl_wire_begin_totals(w, "g", 5000, false, 3, 2);
    rl_wire_put_total_share(w, "k", 1, 1, 2, 3, 4, 700000, true);
    rl_wire_put_total(w, "j", 1, 1, 2, 3, 4);
    size_t len;
    rl_wire_writer_data(w, &len);
    m = decode_ok(w, 2);
    cr_assert_eq(m.entries[0].share, 700000);
    cr_assert(m.entries[0].cut);
    cr_assert_eq(m.entries[1].share, RL_WIRE_SHARE_WHOLE,
                 "a regional key's room is all its region's");
    cr_assert_not(m.entries[1].cut);
    rl_wire_msg_free(&m);

    /* A share over the whole is refused. */
    rl_wire_writer_reset(w);
    rl_wire_begin_totals(w, "g", 5000, false, 3, 1);
    rl_wire_put_total_share(w, "k", 1, 1, 2, 3, 4, RL_WIRE_SHARE_WHOLE + 1,
                            false);
    const char *data = rl_wire_writer_data(w, &len);
    cr_assert_str_eq(refusal(data + 2, len - 2), "number out of range");
    rl_wire_writer_free(w);
}

/* LEAVING: its topic's first byte, the rule's topic, then the counts of
 * each key's sub-windows after the oldest, one to RL_WIRE_LEAVING_MAX. */
Test(wire, leaving_reads_back_the_same_after_its_topic)
{
    rl_wire_writer *w = rl_wire_writer_new();
    const uint64_t counts[RL_WIRE_LEAVING_MAX + 1] = {7, 0, 9};
    rl_wire_begin_leaving(w, "g", 5000, 2);
    rl_wire_put_leaving(w, "k", 1, 41, counts, 3);
    rl_wire_put_leaving(w, "j", 1, 40, counts, 1);
    char topic[8];
    size_t tlen = rl_wire_leaving_topic("g", topic, sizeof topic);
    cr_assert_eq(tlen, 3);
    size_t len;
    const char *data = rl_wire_writer_data(w, &len);
    cr_assert_eq(memcmp(data, "\1g", 3), 0, "the topic comes first");
    cr_assert_eq(memcmp(data, topic, tlen), 0);
    rl_wire_msg m = decode_ok(w, tlen);
    cr_assert_eq(m.type, RL_WIRE_LEAVING);
    cr_assert_eq(m.now_ms, 5000);
    cr_assert_eq(m.rule.len, 1);
    cr_assert_eq(m.n_entries, 2);
    cr_assert_eq(m.entries[0].window, 41);
    cr_assert_eq(m.entries[0].n_leaving, 3);
    cr_assert_eq(m.entries[0].leaving[0], 7);
    cr_assert_eq(m.entries[0].leaving[2], 9);
    cr_assert_eq(m.entries[1].n_leaving, 1);
    rl_wire_msg_free(&m);

    /* More counts than an interval can need, or none, are refused. */
    rl_wire_writer_reset(w);
    rl_wire_begin_leaving(w, "g", 5000, 1);
    rl_wire_put_leaving(w, "k", 1, 41, counts, RL_WIRE_LEAVING_MAX + 1);
    data = rl_wire_writer_data(w, &len);
    cr_assert_str_eq(refusal(data + tlen, len - tlen),
                     "too many or no counts");
    rl_wire_writer_reset(w);
    rl_wire_begin_leaving(w, "g", 5000, 1);
    rl_wire_put_leaving(w, "k", 1, 41, counts, 0);
    data = rl_wire_writer_data(w, &len);
    cr_assert_str_eq(refusal(data + tlen, len - tlen),
                     "too many or no counts");
    rl_wire_writer_free(w);
}

/* How many LEAVING names: none while an interval holds one edge at most,
 * else those an interval's edges free after the oldest and one more,
 * never beyond RL_WIRE_LEAVING_MAX. */
Test(wire, leaving_names_an_interval_of_edges_and_one_more)
{
    cr_assert_eq(rl_wire_leaving_count(4000, 200), 0, "g 200, interval 200");
    cr_assert_eq(rl_wire_leaving_count(60000, 1000), 0);
    cr_assert_eq(rl_wire_leaving_count(10000, 1000), 2, "g 500");
    cr_assert_eq(rl_wire_leaving_count(2000, 250), 3, "g 100");
    cr_assert_eq(rl_wire_leaving_count(1000, 1000), RL_WIRE_LEAVING_MAX);
}

Test(wire, malformed_messages_are_refused_with_a_reason)
{
    /* [1, 1, "a", 1, [...]] with pieces wrong. */
    static const unsigned char empty[] = {0};
    cr_assert_str_eq(refusal(empty, 0), "message cut short");
    static const unsigned char not_array[] = {0x01};
    cr_assert_str_eq(refusal(not_array, 1), "expected an array");
    static const unsigned char version[] = {0x95, 0x02, 0x01, 0xa1, 'a', 0x01,
                                            0x90};
    cr_assert_str_eq(refusal(version, sizeof version), "unknown version");
    static const unsigned char type[] = {0x95, 0x01, 0x09, 0xa1, 'a', 0x01,
                                         0x90};
    cr_assert_str_eq(refusal(type, sizeof type), "unknown message type");
    static const unsigned char fields[] = {0x94, 0x01, 0x01, 0xa1, 'a', 0x01};
    cr_assert_str_eq(refusal(fields, sizeof fields), "wrong number of fields");
    static const unsigned char empty_id[] = {0x95, 0x01, 0x01, 0xa0, 0x01,
                                             0x90};
    cr_assert_str_eq(refusal(empty_id, sizeof empty_id),
                     "string empty or too long");
    static const unsigned char negative[] = {0x95, 0x01, 0x01, 0xa1, 'a',
                                             0xff, 0x90};
    cr_assert_str_eq(refusal(negative, sizeof negative),
                     "expected an unsigned integer");
    static const unsigned char trailing[] = {0x95, 0x01, 0x01, 0xa1, 'a',
                                             0x01, 0x90, 0x00};
    cr_assert_str_eq(refusal(trailing, sizeof trailing),
                     "bytes after the message");
    /* A count over 2^53. */
    static const unsigned char huge[] = {0x95, 0x01, 0x01, 0xa1, 'a', 0x01,
                                         0x91, 0x93, 0xa1, 'r', 0xa1, 'v',
                                         0xcf, 0xff, 0xff, 0xff, 0xff, 0xff,
                                         0xff, 0xff, 0xff};
    cr_assert_str_eq(refusal(huge, sizeof huge), "number out of range");
}

Test(wire, array_headers_cannot_claim_more_than_the_message_holds)
{
    /* An entries array claiming 4 billion entries in a 12-byte message. */
    static const unsigned char bomb[] = {0x95, 0x01, 0x01, 0xa1, 'a', 0x01,
                                         0xdd, 0xff, 0xff, 0xff, 0xff, 0x00};
    cr_assert_str_eq(refusal(bomb, sizeof bomb),
                     "array longer than the message");
    /* 70,000 entries of the smallest size: over the entries cap. */
    static unsigned char many[6 + 5 + 70000];
    memcpy(many, (unsigned char[]){0x95, 0x01, 0x01, 0xa1, 'a', 0x01}, 6);
    memcpy(many + 6, (unsigned char[]){0xdd, 0x00, 0x01, 0x11, 0x70}, 5);
    cr_assert_str_eq(refusal(many, sizeof many), "too many entries");
    /* A string longer than the message, and one over its limit. */
    static const unsigned char str[] = {0x95, 0x01, 0x01, 0xdb, 0x00, 0x00,
                                        0x00, 0x30, 'a'};
    cr_assert_str_eq(refusal(str, sizeof str), "message cut short");
    static const unsigned char id[] = {0x95, 0x01, 0x01, 0xdb, 0xff, 0xff,
                                       0xff, 0xff, 'a'};
    cr_assert_str_eq(refusal(id, sizeof id), "string empty or too long");
}

/* The fuzzer's seeds are valid messages: if the format changes, so must
 * they. */
Test(wire, a_report_with_presence_reads_back_the_same)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report_presence(w, "agent-1", 43, 1);
    rl_wire_put_count(w, "per-tenant", "org_acme", 8, 0);
    const char *names[] = {"per-tenant", "per-user-local"};
    rl_wire_put_presence(w, names, 2);
    rl_wire_msg m = decode_ok(w, 0);
    cr_assert_eq(m.type, RL_WIRE_REPORT);
    cr_assert_eq(m.n_entries, 1);
    cr_assert_eq(m.entries[0].count, 0);
    cr_assert(m.has_presence);
    cr_assert_eq(m.n_presence, 2);
    cr_assert_eq(m.presence[1].len, 14);
    cr_assert_eq(memcmp(m.presence[1].ptr, "per-user-local", 14), 0);
    rl_wire_msg_free(&m);
    cr_assert_null(m.presence);
    /* No counts at all: presence alone. */
    rl_wire_writer_reset(w);
    rl_wire_begin_report_presence(w, "agent-1", 44, 0);
    rl_wire_put_presence(w, names, 1);
    m = decode_ok(w, 0);
    cr_assert_eq(m.n_entries, 0);
    cr_assert_eq(m.n_presence, 1);
    rl_wire_msg_free(&m);
    /* The older form has no presence. */
    rl_wire_writer_reset(w);
    rl_wire_begin_report(w, "agent-1", 45, 0);
    m = decode_ok(w, 0);
    cr_assert(!m.has_presence);
    cr_assert_eq(m.n_presence, 0);
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
}

Test(wire, presence_names_are_checked_and_bounded)
{
    /* [1, 1, "a", 1, [], [""]]: an empty name. */
    const unsigned char empty[] = {0x96, 1, 1, 0xa1, 'a', 1, 0x90, 0x91,
                                   0xa0};
    cr_assert_str_eq(refusal(empty, sizeof empty),
                     "string empty or too long");
    /* [1, 1, "a", 1, [], 5]: not an array. */
    const unsigned char number[] = {0x96, 1, 1, 0xa1, 'a', 1, 0x90, 5};
    cr_assert_str_eq(refusal(number, sizeof number), "expected an array");
    /* An array header claiming 65,537 names in a few bytes. */
    const unsigned char bomb[] = {0x96, 1, 1, 0xa1, 'a', 1, 0x90,
                                  0xdd, 0, 1, 0, 1, 0xa1, 'x'};
    cr_assert_str_eq(refusal(bomb, sizeof bomb),
                     "array longer than the message");
    /* More names than RL_WIRE_PRESENCE_MAX, each one byte long. */
    size_t n = RL_WIRE_PRESENCE_MAX + 1, len = 12 + 2 * n;
    unsigned char *big = malloc(len), *p = big;
    memcpy(p, (const unsigned char[]){0x96, 1, 1, 0xa1, 'a', 1, 0x90, 0xdd,
                                      0, 0, (unsigned char)(n >> 8),
                                      (unsigned char)n}, 12);
    p += 12;
    for (size_t i = 0; i < n; i++) {
        *p++ = 0xa1;
        *p++ = 'r';
    }
    cr_assert_str_eq(refusal(big, len), "too many rule names");
    free(big);
    /* Eight fields. */
    const unsigned char eight[] = {0x98, 1, 1, 0xa1, 'a', 1, 0x90, 0x90, 0,
                                   0};
    cr_assert_str_eq(refusal(eight, sizeof eight), "wrong number of fields");
}

Test(wire, a_report_names_its_stream_and_an_old_one_is_stream_0)
{
    rl_wire_writer *w = rl_wire_writer_new();
    const char *names[] = {"api"};
    rl_wire_begin_report_stream(w, "agent-1", 7, 1, 2);
    rl_wire_put_count(w, "api", "t1", 2, 5);
    rl_wire_put_presence(w, names, 1);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    rl_wire_msg m;
    const char *why = NULL;
    cr_assert_eq(rl_wire_decode(data, len, &m, &why), 0, "%s", why);
    cr_assert_eq(m.stream, 2);
    cr_assert_eq(m.seq, 7);
    cr_assert_eq(m.n_entries, 1);
    cr_assert_eq(m.n_presence, 1);
    rl_wire_msg_free(&m);
    /* Stream 0 is the six-field report an aggregator without streams
     * reads, and a report without the field is stream 0. */
    rl_wire_writer_reset(w);
    rl_wire_begin_report_stream(w, "agent-1", 8, 0, 0);
    rl_wire_put_presence(w, names, 1);
    data = rl_wire_writer_data(w, &len);
    cr_assert_eq(((const unsigned char *)data)[0], 0x96);
    cr_assert_eq(rl_wire_decode(data, len, &m, &why), 0, "%s", why);
    cr_assert_eq(m.stream, 0);
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
    /* [1, 1, "a", 1, [], [], 16]: past the streams an agent has. */
    const unsigned char far[] = {0x97, 1, 1, 0xa1, 'a', 1, 0x90, 0x90, 16};
    cr_assert_str_eq(refusal(far, sizeof far), "number out of range");
}

Test(wire, a_goodbye_reads_back_the_same)
{
    rl_wire_writer *w = rl_wire_writer_new();
    const char *rules[] = {"per-tenant", "per-key"};
    rl_wire_goodbye(w, "nginx@web01/4242/mj3x0a1b", rules, 2);
    rl_wire_msg m = decode_ok(w, 0);
    cr_assert_eq(m.type, RL_WIRE_GOODBYE);
    cr_assert_eq(m.agent_id.len, strlen("nginx@web01/4242/mj3x0a1b"));
    cr_assert_eq(memcmp(m.agent_id.ptr, "nginx@web01/4242/mj3x0a1b",
                        m.agent_id.len), 0);
    cr_assert_eq(m.n_presence, 2);
    cr_assert_eq(m.presence[1].len, 7);
    cr_assert_eq(memcmp(m.presence[1].ptr, "per-key", 7), 0);
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
    /* [1, 5, "a"]: no rules. */
    static const unsigned char three[] = {0x93, 1, 5, 0xa1, 'a'};
    cr_assert_str_eq(refusal(three, sizeof three), "wrong number of fields");
}

Test(wire, fuzz_seeds_decode)
{
    const char *names[] = {"report", "ack", "totals", "report_presence",
                           "report_windows", "features", "goodbye",
                           "leaving"};
    const int types[] = {RL_WIRE_REPORT, RL_WIRE_ACK, RL_WIRE_TOTALS,
                         RL_WIRE_REPORT, RL_WIRE_REPORT, RL_WIRE_FEATURES,
                         RL_WIRE_GOODBYE, RL_WIRE_LEAVING};
    for (int i = 0; i < 8; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/../fuzz/corpus/wire/%s",
                 getenv("RL_TEST_CONFIGS"), names[i]);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s", path);
        unsigned char buf[512];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        rl_wire_msg m;
        const char *why = NULL;
        cr_assert_eq(rl_wire_decode(buf, n, &m, &why), 0, "%s: %s", names[i],
                     why);
        cr_assert_eq(m.type, types[i]);
        rl_wire_msg_free(&m);
    }
}
