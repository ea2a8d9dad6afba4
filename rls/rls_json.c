/*
 * rls_json.c: proto3 JSON of ShouldRateLimit's messages (rls_json.h),
 * with jansson. A request is built as protobuf-c structs whose strings
 * point into the parsed JSON and whose other parts come from one list of
 * blocks, packed, then all freed at once.
 */
#include "rls_json.h"

#include "envoy/service/ratelimit/v3/rls.pb-c.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef Envoy__Service__Ratelimit__V3__RateLimitRequest request;
typedef Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor desc;
typedef Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor__Entry
    entry;
typedef Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor__RateLimitOverride
    override;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse response;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus
    status;
typedef Envoy__Config__Core__V3__HeaderValue header;

#define AT_MAX 96

/* --- Reading a request ------------------------------------------------- */

typedef struct block {
    struct block *next;
    _Alignas(max_align_t) unsigned char data[];
} block;

typedef struct parse {
    block *mem;
    char *err;
    size_t cap;
} parse;

/* A field's names: proto's, and lowerCamelCase where it differs. */
typedef struct name {
    const char *proto, *camel;
} name;

static void *alloc(parse *p, size_t size)
{
    block *b = calloc(1, sizeof *b + size);
    if (b == NULL)
        return NULL;
    b->next = p->mem;
    p->mem = b;
    return b->data;
}

/* at's field fname, or its element i when fname is NULL; a path too deep
 * for AT_MAX is cut short. */
static void path_of(char *out, const char *at, const char *fname, size_t i)
{
    char tail[32];
    if (fname != NULL)
        snprintf(tail, sizeof tail, "%s%s", at[0] != '\0' ? "." : "", fname);
    else
        snprintf(tail, sizeof tail, "[%zu]", i);
    size_t a = strnlen(at, AT_MAX - 1), t = strlen(tail);
    if (a + t > AT_MAX - 1)
        t = AT_MAX - 1 - a;
    memcpy(out, at, a);
    memcpy(out + a, tail, t);
    out[a + t] = '\0';
}

static int fail(parse *p, const char *at, const char *what)
{
    snprintf(p->err, p->cap, "%s%s%s", at, at[0] != '\0' ? ": " : "", what);
    return -1;
}

static bool named(const name *n, const char *key)
{
    return strcmp(key, n->proto) == 0 ||
           (n->camel != NULL && strcmp(key, n->camel) == 0);
}

/* Every key of obj is one of names, each field given once. */
static int known_fields(parse *p, json_t *obj, const char *at,
                        const name *names, size_t n)
{
    const char *key;
    json_t *v;
    char what[160];
    json_object_foreach(obj, key, v) {
        size_t i = 0;
        while (i < n && !named(&names[i], key))
            i++;
        if (i == n) {
            snprintf(what, sizeof what, "unknown field \"%.100s\"", key);
            return fail(p, at, what);
        }
        if (names[i].camel != NULL &&
            json_object_get(obj, names[i].proto) != NULL &&
            json_object_get(obj, names[i].camel) != NULL) {
            snprintf(what, sizeof what, "duplicate field \"%s\"",
                     names[i].camel);
            return fail(p, at, what);
        }
    }
    return 0;
}

/* A field's value; NULL when absent or null (its default). */
static json_t *field(json_t *obj, const name *n)
{
    json_t *v = json_object_get(obj, n->proto);
    if (v == NULL && n->camel != NULL)
        v = json_object_get(obj, n->camel);
    return json_is_null(v) ? NULL : v;
}

static int object_at(parse *p, json_t *v, const char *at)
{
    return json_is_object(v) ? 0 : fail(p, at, "want an object");
}

static int string_field(parse *p, json_t *obj, const char *fname,
                        const char *at, char **out)
{
    json_t *v = field(obj, &(name){fname, NULL});
    *out = (char *)"";
    if (v == NULL)
        return 0;
    if (!json_is_string(v)) {
        char path[AT_MAX];
        path_of(path, at, fname, 0);
        return fail(p, path, "want a string");
    }
    *out = (char *)json_string_value(v);
    return 0;
}

/* An unsigned integer, as protojson reads one: a number (1, 1.0, 1e2)
 * or a string of decimal digits. */
static int unsigned_value(parse *p, json_t *v, uint64_t max, const char *at,
                          uint64_t *out)
{
    bool ok = false;
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        ok = i >= 0 && (uint64_t)i <= max;
        *out = (uint64_t)i;
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        /* max + 1 is a power of two: exact as a double. */
        ok = d >= 0 && d < (double)max + 1.0 && d == (double)(uint64_t)d;
        *out = ok ? (uint64_t)d : 0;
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        ok = s[0] >= '0' && s[0] <= '9';
        unsigned long long n = strtoull(s, &end, 10);
        ok = ok && *end == '\0' && n <= max;
        *out = n;
    }
    if (!ok) {
        char what[64];
        snprintf(what, sizeof what, "want an integer from 0 to %llu",
                 (unsigned long long)max);
        return fail(p, at, what);
    }
    return 0;
}

/* A RateLimitUnit: its name, or its number. */
static int unit_value(parse *p, json_t *v, const char *at, int *out)
{
    if (json_is_string(v)) {
        const ProtobufCEnumValue *e = protobuf_c_enum_descriptor_get_value_by_name(
            &envoy__type__v3__rate_limit_unit__descriptor,
            json_string_value(v));
        if (e == NULL)
            return fail(p, at, "want a unit: SECOND, MINUTE, HOUR, DAY, "
                               "MONTH or YEAR");
        *out = e->value;
        return 0;
    }
    if (json_is_integer(v) && json_integer_value(v) >= INT32_MIN &&
        json_integer_value(v) <= INT32_MAX) {
        *out = (int)json_integer_value(v);
        return 0;
    }
    return fail(p, at, "want a unit's name or number");
}

static int read_override(parse *p, json_t *v, const char *at, override **out)
{
    static const name names[] = {{"requests_per_unit", "requestsPerUnit"},
                                 {"unit", NULL}};
    if (object_at(p, v, at) != 0 || known_fields(p, v, at, names, 2) != 0)
        return -1;
    override *o = alloc(p, sizeof *o);
    if (o == NULL)
        return fail(p, at, "out of memory");
    *o = (override)
        ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__RATE_LIMIT_OVERRIDE__INIT;
    char path[AT_MAX];
    json_t *rpu = field(v, &names[0]), *unit = field(v, &names[1]);
    uint64_t n = 0;
    int u = 0;
    path_of(path, at, "requestsPerUnit", 0);
    if (rpu != NULL && unsigned_value(p, rpu, UINT32_MAX, path, &n) != 0)
        return -1;
    path_of(path, at, "unit", 0);
    if (unit != NULL && unit_value(p, unit, path, &u) != 0)
        return -1;
    o->requests_per_unit = (uint32_t)n;
    o->unit = (Envoy__Type__V3__RateLimitUnit)u;
    *out = o;
    return 0;
}

static int read_entry(parse *p, json_t *v, const char *at, entry **out)
{
    static const name names[] = {{"key", NULL}, {"value", NULL}};
    if (object_at(p, v, at) != 0 || known_fields(p, v, at, names, 2) != 0)
        return -1;
    entry *e = alloc(p, sizeof *e);
    if (e == NULL)
        return fail(p, at, "out of memory");
    *e = (entry)
        ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__ENTRY__INIT;
    *out = e;
    if (string_field(p, v, "key", at, &e->key) != 0)
        return -1;
    return string_field(p, v, "value", at, &e->value);
}

/* A repeated field: NULL or an array, each element read by fn. */
static int read_list(parse *p, json_t *v, const char *at, size_t *n,
                     void ***out,
                     int (*fn)(parse *, json_t *, const char *, void **))
{
    *n = 0;
    if (v == NULL)
        return 0;
    if (!json_is_array(v))
        return fail(p, at, "want an array");
    size_t len = json_array_size(v);
    void **items = alloc(p, (len > 0 ? len : 1) * sizeof *items);
    if (items == NULL)
        return fail(p, at, "out of memory");
    char path[AT_MAX];
    for (size_t i = 0; i < len; i++) {
        path_of(path, at, NULL, i);
        if (fn(p, json_array_get(v, i), path, &items[i]) != 0)
            return -1;
    }
    *n = len;
    *out = items;
    return 0;
}

static int read_entry_item(parse *p, json_t *v, const char *at, void **out)
{
    return read_entry(p, v, at, (entry **)out);
}

static int read_hits(parse *p, json_t *v, const char *at,
                     Google__Protobuf__UInt64Value **out)
{
    uint64_t n;
    if (unsigned_value(p, v, UINT64_MAX, at, &n) != 0)
        return -1;
    Google__Protobuf__UInt64Value *h = alloc(p, sizeof *h);
    if (h == NULL)
        return fail(p, at, "out of memory");
    *h = (Google__Protobuf__UInt64Value)GOOGLE__PROTOBUF__UINT64_VALUE__INIT;
    h->value = n;
    *out = h;
    return 0;
}

static int read_descriptor(parse *p, json_t *v, const char *at, void **out)
{
    static const name names[] = {{"entries", NULL}, {"limit", NULL},
                                 {"hits_addend", "hitsAddend"}};
    if (object_at(p, v, at) != 0 || known_fields(p, v, at, names, 3) != 0)
        return -1;
    desc *d = alloc(p, sizeof *d);
    if (d == NULL)
        return fail(p, at, "out of memory");
    *d = (desc)ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__INIT;
    *out = d;
    char path[AT_MAX];
    path_of(path, at, "entries", 0);
    if (read_list(p, field(v, &names[0]), path, &d->n_entries,
                  (void ***)&d->entries, read_entry_item) != 0)
        return -1;
    json_t *limit = field(v, &names[1]), *hits = field(v, &names[2]);
    path_of(path, at, "limit", 0);
    if (limit != NULL && read_override(p, limit, path, &d->limit) != 0)
        return -1;
    path_of(path, at, "hitsAddend", 0);
    if (hits != NULL && read_hits(p, hits, path, &d->hits_addend) != 0)
        return -1;
    return 0;
}

static int read_request(parse *p, json_t *v, request *r)
{
    static const name names[] = {{"domain", NULL}, {"descriptors", NULL},
                                 {"hits_addend", "hitsAddend"}};
    if (object_at(p, v, "") != 0 || known_fields(p, v, "", names, 3) != 0 ||
        string_field(p, v, "domain", "", &r->domain) != 0 ||
        read_list(p, field(v, &names[1]), "descriptors", &r->n_descriptors,
                  (void ***)&r->descriptors, read_descriptor) != 0)
        return -1;
    json_t *hits = field(v, &names[2]);
    uint64_t n = 0;
    if (hits != NULL &&
        unsigned_value(p, hits, UINT32_MAX, "hitsAddend", &n) != 0)
        return -1;
    r->hits_addend = (uint32_t)n;
    return 0;
}

static int pack_request(parse *p, const request *r, uint8_t **msg,
                        size_t *msg_len)
{
    size_t n = envoy__service__ratelimit__v3__rate_limit_request__get_packed_size(r);
    *msg = malloc(n > 0 ? n : 1);
    if (*msg == NULL)
        return fail(p, "", "out of memory");
    *msg_len = envoy__service__ratelimit__v3__rate_limit_request__pack(r, *msg);
    return 0;
}

int rls_json_request(const char *json, size_t len, uint8_t **msg,
                     size_t *msg_len, char *err, size_t cap)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    *msg = NULL;
    *msg_len = 0;
    if (root == NULL) {
        snprintf(err, cap, "not JSON: %s at line %d column %d", je.text,
                 je.line, je.column);
        return -1;
    }
    parse p = {.err = err, .cap = cap};
    request r = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_REQUEST__INIT;
    int rc = read_request(&p, root, &r);
    if (rc == 0)
        rc = pack_request(&p, &r, msg, msg_len);
    while (p.mem != NULL) {
        block *next = p.mem->next;
        free(p.mem);
        p.mem = next;
    }
    json_decref(root);
    return rc;
}

/* --- Writing a response ------------------------------------------------ */

/* Sets key to v (taking it) in o; a NULL v (out of memory, not UTF-8)
 * makes *bad. */
static void put(json_t *o, const char *key, json_t *v, bool *bad)
{
    if (v == NULL || json_object_set_new(o, key, v) != 0)
        *bad = true;
}

static json_t *enum_json(const ProtobufCEnumDescriptor *d, int value)
{
    const ProtobufCEnumValue *e = protobuf_c_enum_descriptor_get_value(d,
                                                                       value);
    return e != NULL ? json_string(e->name) : json_integer(value);
}

/* Go's Duration: seconds, and 3, 6 or 9 digits of a fraction if any. */
static json_t *duration_json(const Google__Protobuf__Duration *d)
{
    bool negative = d->seconds < 0 || d->nanos < 0;
    unsigned long long s = negative ? -(unsigned long long)d->seconds
                                    : (unsigned long long)d->seconds;
    long nanos = negative ? -(long)d->nanos : (long)d->nanos;
    char text[48];
    int n = snprintf(text, sizeof text, "%s%llu.%09ld", negative ? "-" : "",
                     s, nanos);
    for (int i = 0; i < 3 && n >= 4 && memcmp(text + n - 3, "000", 3) == 0;
         i++)
        n -= i < 2 ? 3 : 4; /* the last takes the point with it */
    snprintf(text + n, sizeof text - (size_t)n, "s");
    return json_string(text);
}

static json_t *base64_json(const ProtobufCBinaryData *b)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmn"
                                 "opqrstuvwxyz0123456789+/";
    char *text = malloc((b->len + 2) / 3 * 4 + 1);
    if (text == NULL)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < b->len; i += 3) {
        uint32_t v = (uint32_t)b->data[i] << 16;
        size_t left = b->len - i;
        if (left > 1)
            v |= (uint32_t)b->data[i + 1] << 8;
        if (left > 2)
            v |= b->data[i + 2];
        text[n++] = digits[v >> 18 & 63];
        text[n++] = digits[v >> 12 & 63];
        text[n++] = left > 1 ? digits[v >> 6 & 63] : '=';
        text[n++] = left > 2 ? digits[v & 63] : '=';
    }
    json_t *j = json_stringn(text, n);
    free(text);
    return j;
}

static json_t *limit_json(
    const Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit *l,
    bool *bad)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    if (l->name != NULL && l->name[0] != '\0')
        put(o, "name", json_string(l->name), bad);
    if (l->requests_per_unit != 0)
        put(o, "requestsPerUnit", json_integer(l->requests_per_unit), bad);
    if (l->unit != 0)
        put(o, "unit", enum_json(
            &envoy__service__ratelimit__v3__rate_limit_response__rate_limit__unit__descriptor,
            l->unit), bad);
    return o;
}

static json_t *status_json(const status *s, bool *bad)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    if (s->code != 0)
        put(o, "code", enum_json(
            &envoy__service__ratelimit__v3__rate_limit_response__code__descriptor,
            s->code), bad);
    if (s->current_limit != NULL)
        put(o, "currentLimit", limit_json(s->current_limit, bad), bad);
    if (s->limit_remaining != 0)
        put(o, "limitRemaining", json_integer(s->limit_remaining), bad);
    if (s->duration_until_reset != NULL)
        put(o, "durationUntilReset", duration_json(s->duration_until_reset),
            bad);
    return o;
}

static json_t *header_json(const header *h, bool *bad)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    if (h->key != NULL && h->key[0] != '\0')
        put(o, "key", json_string(h->key), bad);
    if (h->value != NULL && h->value[0] != '\0')
        put(o, "value", json_string(h->value), bad);
    if (h->raw_value.len > 0)
        put(o, "rawValue", base64_json(&h->raw_value), bad);
    return o;
}

static void put_headers(json_t *o, const char *key, header *const *h,
                        size_t n, bool *bad)
{
    if (n == 0)
        return;
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++) {
        if (json_array_append_new(a, header_json(h[i], bad)) != 0)
            *bad = true;
    }
    put(o, key, a, bad);
}

static json_t *response_json(const response *r, bool *bad)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    if (r->overall_code != 0)
        put(o, "overallCode", enum_json(
            &envoy__service__ratelimit__v3__rate_limit_response__code__descriptor,
            r->overall_code), bad);
    if (r->n_statuses > 0) {
        json_t *a = json_array();
        for (size_t i = 0; a != NULL && i < r->n_statuses; i++) {
            if (json_array_append_new(a, status_json(r->statuses[i], bad)))
                *bad = true;
        }
        put(o, "statuses", a, bad);
    }
    put_headers(o, "responseHeadersToAdd", r->response_headers_to_add,
                r->n_response_headers_to_add, bad);
    put_headers(o, "requestHeadersToAdd", r->request_headers_to_add,
                r->n_request_headers_to_add, bad);
    if (r->raw_body.len > 0)
        put(o, "rawBody", base64_json(&r->raw_body), bad);
    return o;
}

char *rls_json_response(const uint8_t *msg, size_t len, int *code)
{
    response *r = envoy__service__ratelimit__v3__rate_limit_response__unpack(
        NULL, len, msg);
    if (r == NULL)
        return NULL;
    bool bad = false;
    json_t *o = response_json(r, &bad);
    *code = (int)r->overall_code;
    envoy__service__ratelimit__v3__rate_limit_response__free_unpacked(r,
                                                                      NULL);
    char *text = o != NULL && !bad ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}
