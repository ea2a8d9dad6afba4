/*
 * rls_stat_key.c: upstream's stats key and its labels (rls_stat_key.h).
 * The key is written whole first (its IPv4 addresses are found across
 * the parts it joins), on the stack when short, then cut into labels.
 */
#include "rls_stat_key.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define STACK_KEY 4096

typedef struct key_buf {
    char *s;    /* NULL: only measure */
    size_t len;
} key_buf;

static void put(key_buf *k, const char *bytes, size_t len)
{
    if (k->s != NULL)
        memcpy(k->s + k->len, bytes, len);
    k->len += len;
}

/* "key" and, when value is not empty or always_value, "_value". */
static void put_entry(key_buf *k, const rls_entry *e, const char *value,
                      size_t value_len, bool always_value)
{
    put(k, ".", 1);
    put(k, e->key, e->key_len);
    if (value_len > 0 || always_value) {
        put(k, "_", 1);
        put(k, value, value_len);
    }
}

static bool any_shared(const rls_match *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (m->shared[i] != NULL)
            return true;
    }
    return false;
}

/* Upstream's GetLimit: a detailed_metric limit is named by the request's
 * values (a share_threshold entry by its pattern); another by its
 * descriptors' key_values, value_to_metric ones by the request's value;
 * a descriptor's own limit by its values (descriptorKey). */
static void write_key(key_buf *k, const char *domain, const rls_entry *e,
                      size_t n, const rls_match *m)
{
    put(k, domain, strlen(domain));
    bool detailed = m != NULL && m->limit->detailed_metric;
    bool shared = detailed && any_shared(m, n);
    for (size_t i = 0; i < n; i++) {
        if (shared && m->shared[i] != NULL)
            put_entry(k, &e[i], m->shared[i], strlen(m->shared[i]), true);
        else if (detailed)
            put_entry(k, &e[i], e[i].value, e[i].value_len, !shared);
        else if (m != NULL && m->named[i] != NULL) {
            put(k, ".", 1);
            put(k, m->named[i], strlen(m->named[i]));
        } else
            put_entry(k, &e[i], e[i].value, e[i].value_len, false);
    }
}

static bool digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The length of \d{1,3}(\.\d{1,3}){3} at s (upstream's ipv4Regex), as Go's
 * regexp prefers it (each run of digits as long as the rest allows), or
 * 0. */
static size_t ipv4_at(const char *s, size_t len, int group)
{
    size_t run = 0;
    while (run < 3 && run < len && digit(s[run]))
        run++;
    for (; run > 0; run--) {
        if (group == 3)
            return run;
        if (run < len && s[run] == '.') {
            size_t rest = ipv4_at(s + run + 1, len - run - 1, group + 1);
            if (rest > 0)
                return run + 1 + rest;
        }
    }
    return 0;
}

/* SanitizeStatName: ':' and '|' as '_', then each IPv4 address's dots. */
static void sanitize(char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ':' || s[i] == '|')
            s[i] = '_';
    }
    for (size_t i = 0; i < len;) {
        size_t ip = ipv4_at(s + i, len - i, 0);
        for (size_t j = i; j < i + ip; j++) {
            if (s[j] == '.')
                s[j] = '_';
        }
        i += ip > 0 ? ip : 1;
    }
}

/* The length of the UTF-8 character at s (len bytes left), 0 if none. */
static size_t utf8_char(const unsigned char *s, size_t len)
{
    size_t n = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2
             : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
             : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    if (n == 0 || n > len)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    }
    /* Overlong forms, surrogates and past U+10FFFF. */
    if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] > 0x9F)
        || (s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] > 0x8F))
        return 0;
    return n;
}

/* One label: the part's UTF-8 (others as '?'), cut at RLS_LABEL_MAX. */
static size_t put_label(char *out, const char *part, size_t len)
{
    size_t at = 0;
    for (size_t i = 0; i < len;) {
        size_t c = utf8_char((const unsigned char *)part + i, len - i);
        if (at + (c > 0 ? c : 1) > RLS_LABEL_MAX)
            break;
        if (c == 0) {
            out[at++] = '?';
            i++;
        } else {
            memcpy(out + at, part + i, c);
            at += c;
            i += c;
        }
    }
    return at;
}

long rls_stat_labels(const char *domain, const rls_entry *entries, size_t n,
                     const rls_match *m, char *out)
{
    key_buf k = {NULL, 0};
    write_key(&k, domain, entries, n, m);
    char stack[STACK_KEY];
    char *key = k.len <= sizeof stack ? stack : malloc(k.len);
    if (key == NULL)
        return -1;
    k = (key_buf){key, 0};
    write_key(&k, domain, entries, n, m);
    sanitize(key, k.len);
    size_t at = 0;
    const char *part = key, *end = key + k.len;
    for (int label = 0; label < 3 && part <= end; label++) {
        const char *dot = memchr(part, '.', (size_t)(end - part));
        const char *stop = dot != NULL ? dot : end;
        if (label > 0)
            out[at++] = '.';
        at += put_label(out + at, part, (size_t)(stop - part));
        part = stop + 1;
    }
    if (key != stack)
        free(key);
    return (long)at;
}
