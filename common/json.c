/*
 * json.c: JSON string literals. Rule names and override labels come from
 * an operator's config and reasons from our own code, so they are printable
 * as a rule; quoting every one the same way keeps a stray quote or control
 * byte in a name from breaking a client's parser.
 */
#include "json.h"

#include <stdio.h>

/* Writes one byte of the literal if it fits, keeping room for the NUL. */
static void put(char *out, size_t cap, size_t at, char ch)
{
    if (at + 1 < cap)
        out[at] = ch;
}

size_t rl_json_quote(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    put(out, cap, n++, '"');
    for (; *s != '\0'; s++) {
        unsigned char ch = (unsigned char)*s;
        char esc[8];
        int len = 1;
        if (ch == '"' || ch == '\\')
            len = snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch < 0x20)
            len = snprintf(esc, sizeof esc, "\\u%04x", ch);
        else
            esc[0] = (char)ch;
        for (int i = 0; i < len; i++)
            put(out, cap, n++, esc[i]);
    }
    put(out, cap, n++, '"');
    if (cap > 0)
        out[n < cap ? n : cap - 1] = '\0';
    return n;
}
