/*
 * rlctl_json.c: see rlctl_json.h. Quotes, backslashes and control bytes
 * are escaped; values come from the store and the wire, so nothing in them
 * is trusted to be plain.
 */
#include "rlctl_json.h"

#include <stdio.h>

void rlctl_json_string(const char *s)
{
    putchar('"');
    for (; *s != '\0'; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}
