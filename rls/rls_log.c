/*
 * rls_log.c: rl's key=value log lines as logrus's JSON objects
 * (rls_log.h). A value is what follows `key=` up to a space, or, when
 * quoted, up to the quote that ends the line or comes before ` key=`:
 * rl_log's values are not escaped, so a quote inside one is its text.
 */
#include "rls_log.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct out {
    char *s;
    size_t len, cap;
    bool full;
} out;

static void put(out *o, const char *s, size_t n)
{
    if (o->full || o->len + n >= o->cap) {
        o->full = true;
        return;
    }
    memcpy(o->s + o->len, s, n);
    o->len += n;
}

static void put_str(out *o, const char *s)
{
    put(o, s, strlen(s));
}

/* The length of the UTF-8 sequence at s (n bytes left), 0 if it is none:
 * overlong forms, surrogates and values past U+10FFFF included. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : 2;
    if (s[0] < 0xc2 || s[0] > 0xf4 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    }
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0)
        || (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

/* n bytes as the inside of a JSON string. */
static void put_escaped(out *o, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        char esc[8];
        if (u[i] == '"' || u[i] == '\\') {
            snprintf(esc, sizeof esc, "\\%c", u[i]);
            put_str(o, esc);
        } else if (u[i] < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", u[i]);
            put_str(o, esc);
        } else if (u[i] < 0x80) {
            put(o, s + i, 1);
        } else {
            size_t len = utf8_len(u + i, n - i);
            if (len == 0) {
                put_str(o, "\\ufffd");
                i++;
                continue;
            }
            put(o, s + i, len);
            i += len;
            continue;
        }
        i++;
    }
}

static bool is_key_byte(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

/* The length of the key at s when s starts "key=", else 0. */
static size_t key_len(const char *s)
{
    size_t n = 0;
    while (is_key_byte(s[n]))
        n++;
    return n > 0 && s[n] == '=' ? n : 0;
}

/* The end of the quoted value whose text starts at s: its closing
 * quote, or the line's end when it has none (a cut line). */
static const char *quoted_end(const char *s)
{
    for (const char *q = strchr(s, '"'); q != NULL; q = strchr(q + 1, '"')) {
        if (q[1] == '\0' || (q[1] == ' ' && key_len(q + 2) > 0))
            return q;
    }
    return s + strlen(s);
}

typedef struct pair {
    const char *key, *value;
    size_t key_len, value_len;
} pair;

/* The next pair or word at *p, moving *p past it; false at the end.
 * A word has key_len 0. */
static bool next(const char **p, pair *x)
{
    while (**p == ' ')
        (*p)++;
    if (**p == '\0')
        return false;
    const char *s = *p;
    *x = (pair){.key = s, .key_len = key_len(s)};
    if (x->key_len == 0) {
        x->value = s;
        x->value_len = strcspn(s, " ");
        *p = s + x->value_len;
        return true;
    }
    s += x->key_len + 1;
    if (*s == '"') {
        const char *end = quoted_end(s + 1);
        x->value = s + 1;
        x->value_len = (size_t)(end - x->value);
        *p = *end == '"' ? end + 1 : end;
    } else {
        x->value = s;
        x->value_len = strcspn(s, " ");
        *p = s + x->value_len;
    }
    return true;
}

static bool reserved(const pair *x)
{
    static const char *const names[] = {"level", "msg", "time"};
    for (size_t i = 0; i < 3; i++) {
        if (x->key_len == strlen(names[i])
            && memcmp(x->key, names[i], x->key_len) == 0)
            return true;
    }
    return false;
}

/* msg: the event's name, then every word that is no pair. */
static void put_msg(out *o, const char *line)
{
    pair x;
    bool first = true;
    put_str(o, "\"msg\":\"");
    for (const char *p = line; next(&p, &x);) {
        bool event = x.key_len == 5 && memcmp(x.key, "event", 5) == 0;
        if (x.key_len != 0 && !event)
            continue;
        if (!first)
            put_str(o, " ");
        put_escaped(o, x.value, x.value_len);
        first = false;
    }
    put_str(o, "\"");
}

/* RFC 3339 with nanoseconds, trailing zeros cut (Go's RFC3339Nano). */
static void put_time(out *o, const struct timespec *now)
{
    struct tm tm;
    char buf[64];
    gmtime_r(&now->tv_sec, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    if (now->tv_nsec > 0) {
        n += (size_t)snprintf(buf + n, sizeof buf - n, ".%09ld",
                              now->tv_nsec);
        while (buf[n - 1] == '0')
            n--;
    }
    buf[n] = '\0';
    put_str(o, ",\"time\":\"");
    put_str(o, buf);
    put_str(o, "Z\"");
}

size_t rls_log_json_format(rl_log_level level, const char *line,
                           const struct timespec *now, char *s, size_t cap)
{
    static const char *const levels[] = {"debug", "info", "warning",
                                         "error"};
    out o = {.s = s, .cap = cap};
    put_str(&o, "{\"level\":\"");
    put_str(&o, levels[level]);
    put_str(&o, "\",");
    put_msg(&o, line);
    put_time(&o, now);
    pair x;
    for (const char *p = line; next(&p, &x);) {
        if (x.key_len == 0)
            continue;
        put_str(&o, reserved(&x) ? ",\"fields." : ",\"");
        put(&o, x.key, x.key_len);
        put_str(&o, "\":\"");
        put_escaped(&o, x.value, x.value_len);
        put_str(&o, "\"");
    }
    put_str(&o, "}");
    if (o.full)
        return 0;
    s[o.len] = '\0';
    return o.len;
}

void rls_log_json(rl_log_level level, const char *line, void *arg)
{
    (void)arg;
    char buf[RLS_LOG_JSON_MAX + 1];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    size_t n = rls_log_json_format(level, line, &now, buf, sizeof buf - 1);
    if (n == 0)
        return;
    buf[n++] = '\n';
    /* One write: lines of several threads never interleave. */
    ssize_t w = write(STDERR_FILENO, buf, n);
    (void)w;
}
