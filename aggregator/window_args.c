/*
 * window_args.c: the argument list of one store call (window_args.h).
 */
#include "window_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rl_args_init(rl_args *a, size_t slots, size_t cap)
{
    *a = (rl_args){.argv = calloc(slots + 1, sizeof *a->argv),
                   .lens = calloc(slots + 1, sizeof *a->lens),
                   .text = malloc(cap + 1), .cap = cap + 1};
    if (a->argv == NULL || a->lens == NULL || a->text == NULL) {
        rl_args_fini(a);
        return -1;
    }
    return 0;
}

void rl_args_fini(rl_args *a)
{
    free(a->argv);
    free(a->lens);
    free(a->text);
    *a = (rl_args){0};
}

void rl_args_add(rl_args *a, const char *s, size_t len)
{
    memcpy(a->text + a->used, s, len);
    a->argv[a->n] = a->text + a->used;
    a->lens[a->n++] = len;
    a->used += len;
}

void rl_args_addf(rl_args *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(a->text + a->used, a->cap - a->used, fmt, ap);
    va_end(ap);
    a->argv[a->n] = a->text + a->used;
    a->lens[a->n++] = (size_t)n;
    a->used += (size_t)n;
}

void rl_args_add_u64(rl_args *a, uint64_t v)
{
    char digits[20];
    size_t n = 0;
    do {
        digits[sizeof digits - ++n] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    rl_args_add(a, digits + sizeof digits - n, n);
}

void rl_args_join(rl_args *a, size_t pieces, size_t start)
{
    a->n -= pieces;
    a->argv[a->n] = a->text + start;
    a->lens[a->n++] = a->used - start;
}
