/*
 * rls_json: ShouldRateLimit's messages in proto3 JSON, as Go's protojson
 * reads and writes them (the forms upstream's /json takes and gives).
 */
#include "rls_json.h"

#include "envoy/service/ratelimit/v3/rls.pb-c.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef Envoy__Service__Ratelimit__V3__RateLimitRequest request;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse response;

static request *read_request(const char *json)
{
    uint8_t *msg;
    size_t len;
    char err[256];
    cr_assert_eq(rls_json_request(json, strlen(json), &msg, &len, err,
                                  sizeof err), 0, "%s", err);
    request *r = envoy__service__ratelimit__v3__rate_limit_request__unpack(
        NULL, len, msg);
    free(msg);
    cr_assert_not_null(r);
    return r;
}

static void expect_refused(const char *json, const char *why)
{
    uint8_t *msg;
    size_t len;
    char err[256];
    cr_assert_eq(rls_json_request(json, strlen(json), &msg, &len, err,
                                  sizeof err), -1, "took %s", json);
    cr_expect_str_eq(err, why);
}

Test(rls_json_wire, a_request_in_either_spelling)
{
    request *r = read_request(
        "{\"domain\": \"d\", \"hitsAddend\": \"3\", \"descriptors\": [{"
        "\"entries\": [{\"key\": \"k\", \"value\": \"v\"}, {\"key\": "
        "\"k2\"}], \"limit\": {\"requestsPerUnit\": 1e1, \"unit\": "
        "\"MINUTE\"}, \"hits_addend\": 0}, {\"entries\": null}]}");
    cr_expect_str_eq(r->domain, "d");
    cr_expect_eq(r->hits_addend, 3);
    cr_assert_eq(r->n_descriptors, 2);
    cr_assert_eq(r->descriptors[0]->n_entries, 2);
    cr_expect_str_eq(r->descriptors[0]->entries[1]->key, "k2");
    cr_expect_str_eq(r->descriptors[0]->entries[1]->value, "");
    cr_assert_not_null(r->descriptors[0]->limit);
    cr_expect_eq(r->descriptors[0]->limit->requests_per_unit, 10);
    cr_expect_eq(r->descriptors[0]->limit->unit,
                 ENVOY__TYPE__V3__RATE_LIMIT_UNIT__MINUTE);
    /* A wrapper given as 0 is there, at 0: it reads the status. */
    cr_assert_not_null(r->descriptors[0]->hits_addend);
    cr_expect_eq(r->descriptors[0]->hits_addend->value, 0);
    cr_expect_null(r->descriptors[1]->hits_addend);
    cr_expect_eq(r->descriptors[1]->n_entries, 0);
    envoy__service__ratelimit__v3__rate_limit_request__free_unpacked(r,
                                                                      NULL);
}

Test(rls_json_wire, a_request_refused_says_where)
{
    expect_refused("[]", "want an object");
    expect_refused("{\"domain\": \"d\", \"hits_addend\": 1, "
                   "\"hitsAddend\": 1}", "duplicate field \"hitsAddend\"");
    expect_refused("{\"domain\": 1}", "domain: want a string");
    expect_refused("{\"hits_addend\": -1}",
                   "hitsAddend: want an integer from 0 to 4294967295");
    expect_refused("{\"hits_addend\": 4294967296}",
                   "hitsAddend: want an integer from 0 to 4294967295");
    expect_refused("{\"descriptors\": [{\"limit\": {\"unit\": \"WEEKS\"}}]}",
                   "descriptors[0].limit.unit: want a unit: SECOND, "
                   "MINUTE, HOUR, DAY, MONTH or YEAR");
    expect_refused("{\"descriptors\": {}}", "descriptors: want an array");
    expect_refused("{\"descriptors\": [{\"entries\": [{\"k\": 1}]}]}",
                   "descriptors[0].entries[0]: unknown field \"k\"");
}

/* The response's JSON from a response's fields. */
static char *write_response(const response *r, int *code)
{
    size_t n = envoy__service__ratelimit__v3__rate_limit_response__get_packed_size(r);
    uint8_t *msg = malloc(n + 1);
    envoy__service__ratelimit__v3__rate_limit_response__pack(r, msg);
    char *json = rls_json_response(msg, n, code);
    free(msg);
    cr_assert_not_null(json);
    return json;
}

static void expect_duration(int64_t s, int32_t nanos, const char *want)
{
    Google__Protobuf__Duration d = GOOGLE__PROTOBUF__DURATION__INIT;
    d.seconds = s;
    d.nanos = nanos;
    Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus st =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__DESCRIPTOR_STATUS__INIT;
    st.duration_until_reset = &d;
    Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus *sp =
        &st;
    response r = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__INIT;
    r.n_statuses = 1;
    r.statuses = &sp;
    int code;
    char *json = write_response(&r, &code);
    char full[128];
    snprintf(full, sizeof full,
             "{\"statuses\":[{\"durationUntilReset\":\"%s\"}]}", want);
    cr_expect_str_eq(json, full);
    free(json);
}

Test(rls_json_wire, durations_as_protojson_writes_them)
{
    expect_duration(35, 0, "35s");
    expect_duration(0, 0, "0s");
    expect_duration(1, 500000000, "1.500s");
    expect_duration(1000, 1000, "1000.000001s");
    expect_duration(2, 1, "2.000000001s");
    expect_duration(-2, -1000, "-2.000001s");
}

Test(rls_json_wire, a_response_with_names_and_no_zero_fields)
{
    Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit l =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__RATE_LIMIT__INIT;
    l.name = "per-user";
    l.requests_per_unit = 7;
    l.unit = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__RATE_LIMIT__UNIT__WEEK;
    Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus st =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__DESCRIPTOR_STATUS__INIT;
    st.code = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT;
    st.current_limit = &l;
    Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus *sp =
        &st;
    Envoy__Config__Core__V3__HeaderValue h =
        ENVOY__CONFIG__CORE__V3__HEADER_VALUE__INIT;
    h.key = "x-rl-degraded";
    h.value = "true";
    h.raw_value = (ProtobufCBinaryData){.len = 4, .data = (uint8_t *)"abcd"};
    Envoy__Config__Core__V3__HeaderValue *hp = &h;
    response r = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__INIT;
    r.overall_code = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT;
    r.n_statuses = 1;
    r.statuses = &sp;
    r.n_request_headers_to_add = 1;
    r.request_headers_to_add = &hp;
    int code;
    char *json = write_response(&r, &code);
    cr_expect_eq(code, 2);
    cr_expect_str_eq(json,
                     "{\"overallCode\":\"OVER_LIMIT\",\"statuses\":[{\"code\":"
                     "\"OVER_LIMIT\",\"currentLimit\":{\"name\":\"per-user\","
                     "\"requestsPerUnit\":7,\"unit\":\"WEEK\"}}],"
                     "\"requestHeadersToAdd\":[{\"key\":\"x-rl-degraded\","
                     "\"value\":\"true\",\"rawValue\":\"YWJjZA==\"}]}");
    free(json);
}
