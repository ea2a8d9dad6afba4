/*
 * rl-rls's wire types against Envoy's field numbers: a RateLimitRequest
 * made by hand, byte by byte, as Envoy's encoder lays it out, decodes to
 * what it says; a response encodes to the bytes Envoy's decoder expects.
 */
#include "envoy/service/ratelimit/v3/rls.pb-c.h"

#include <criterion/criterion.h>
#include <string.h>

Test(rls_wire, a_request_with_envoys_field_numbers_decodes)
{
    /* domain (1) "d"; descriptors (2) { entries (1) {key (1) "k", value
     * (2) "v"}, hits_addend (3) {value (1) 0} }; hits_addend (3) 5. */
    static const uint8_t bytes[] = {
        0x0a, 0x01, 'd',
        0x12, 0x0c,
        0x0a, 0x06, 0x0a, 0x01, 'k', 0x12, 0x01, 'v',
        0x1a, 0x02, 0x08, 0x00,
        0x18, 0x05,
    };
    Envoy__Service__Ratelimit__V3__RateLimitRequest *r =
        envoy__service__ratelimit__v3__rate_limit_request__unpack(
            NULL, sizeof bytes, bytes);
    cr_assert_not_null(r);
    cr_expect_str_eq(r->domain, "d");
    cr_expect_eq(r->hits_addend, 5);
    cr_assert_eq(r->n_descriptors, 1);
    cr_assert_eq(r->descriptors[0]->n_entries, 1);
    cr_expect_str_eq(r->descriptors[0]->entries[0]->key, "k");
    cr_expect_str_eq(r->descriptors[0]->entries[0]->value, "v");
    /* A descriptor's hits_addend of 0 is there, and 0. */
    cr_assert_not_null(r->descriptors[0]->hits_addend);
    cr_expect_eq(r->descriptors[0]->hits_addend->value, 0);
    cr_expect_null(r->descriptors[0]->limit);
    envoy__service__ratelimit__v3__rate_limit_request__free_unpacked(r,
                                                                    NULL);
}

Test(rls_wire, a_response_encodes_with_envoys_field_numbers)
{
    Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit limit =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__RATE_LIMIT__INIT;
    limit.requests_per_unit = 20;
    limit.unit =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__RATE_LIMIT__UNIT__MINUTE;
    Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus st =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__DESCRIPTOR_STATUS__INIT;
    st.code = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT;
    st.current_limit = &limit;
    Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus *sts[] =
        {&st};
    Envoy__Service__Ratelimit__V3__RateLimitResponse resp =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__INIT;
    resp.overall_code =
        ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT;
    resp.n_statuses = 1;
    resp.statuses = sts;
    uint8_t out[64];
    size_t n = envoy__service__ratelimit__v3__rate_limit_response__pack(&resp,
                                                                       out);
    /* overall_code (1) = 2; statuses (2) { code (1) = 2, current_limit
     * (2) { requests_per_unit (1) = 20, unit (2) = MINUTE (2) } }. */
    static const uint8_t want[] = {0x08, 0x02, 0x12, 0x08, 0x08, 0x02, 0x12,
                                   0x04, 0x08, 0x14, 0x10, 0x02};
    cr_assert_eq(n, sizeof want);
    cr_expect_eq(memcmp(out, want, n), 0);
}
