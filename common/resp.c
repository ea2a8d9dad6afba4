/*
 * resp.c: see resp.h. The store sends every check as one command; hiredis's
 * own formatting (redisFormatSdsCommandArgv) grows an sds through
 * sdscatfmt for each argument, which perf put at a tenth of an agent's time
 * at 64 checks in flight. This one measures first and writes once.
 */
#include "resp.h"

#include <string.h>

static size_t digits(unsigned long long n)
{
    size_t d = 1;
    while (n >= 10) {
        n /= 10;
        d++;
    }
    return d;
}

/* Writes "<mark><n>\r\n". */
static char *header(char *p, char mark, size_t n)
{
    *p++ = mark;
    size_t d = digits(n);
    for (size_t i = d; i > 0; i--) {
        p[i - 1] = (char)('0' + n % 10);
        n /= 10;
    }
    p += d;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

size_t rl_resp_length(int argc, const size_t *lens)
{
    size_t n = 3 + digits((size_t)argc);
    for (int i = 0; i < argc; i++)
        n += 3 + digits(lens[i]) + lens[i] + 2;
    return n;
}

size_t rl_resp_format(char *out, int argc, const char *const *argv,
                      const size_t *lens)
{
    char *p = header(out, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        p = header(p, '$', lens[i]);
        memcpy(p, argv[i], lens[i]);
        p += lens[i];
        *p++ = '\r';
        *p++ = '\n';
    }
    return (size_t)(p - out);
}

size_t rl_resp_unsigned(char *out, unsigned long long v)
{
    size_t d = digits(v);
    for (size_t i = d; i > 0; i--) {
        out[i - 1] = (char)('0' + v % 10);
        v /= 10;
    }
    out[d] = '\0';
    return d;
}

size_t rl_resp_decimal(char *out, long long v)
{
    if (v >= 0)
        return rl_resp_unsigned(out, (unsigned long long)v);
    /* The magnitude as unsigned: -LLONG_MIN does not fit a long long. */
    out[0] = '-';
    return 1 + rl_resp_unsigned(out + 1, 0ULL - (unsigned long long)v);
}
