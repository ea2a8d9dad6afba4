/*
 * keys.c: bucket keys and their cluster slots. A key is the rule's prefix
 * followed by the attribute value as given: values are length-checked here
 * and only ever passed to Redis as arguments, never spliced into script text.
 * The slot function follows the Redis Cluster specification (CRC16-XMODEM:
 * polynomial 0x1021, initial value 0, no reflection) and its hash tag rule.
 */
#include "keys.h"

#include "rl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

int rl_key_build(const char *prefix, const char *value, size_t value_len,
                 char *buf, size_t cap, size_t *key_len)
{
    if (prefix == NULL || value == NULL || buf == NULL || value_len == 0)
        return RL_EINVAL;
    if (value_len > RL_VALUE_MAX)
        return RL_ETOOLONG;
    if (rl_key_has_nul(value, value_len))
        return RL_EINVAL;
    size_t prefix_len = strlen(prefix);
    if (prefix_len + value_len + 1 > cap)
        return RL_ETOOLONG;
    memcpy(buf, prefix, prefix_len);
    memcpy(buf + prefix_len, value, value_len);
    buf[prefix_len + value_len] = '\0';
    if (key_len != NULL)
        *key_len = prefix_len + value_len;
    return RL_OK;
}

size_t rl_key_tag_bytes(size_t tag_len)
{
    char digits[24];
    return (size_t)snprintf(digits, sizeof digits, "%zu", tag_len) + tag_len
           + 4;
}

int rl_key_build_tagged(const char *prefix, const char *tag, size_t tag_len,
                        const char *value, size_t value_len, char *buf,
                        size_t cap, size_t *key_len)
{
    if (tag == NULL)
        return rl_key_build(prefix, value, value_len, buf, cap, key_len);
    if (prefix == NULL || buf == NULL || tag_len == 0)
        return RL_EINVAL;
    if (tag_len > RL_VALUE_MAX)
        return RL_ETOOLONG;
    if (rl_key_has_nul(tag, tag_len))
        return RL_EINVAL;
    size_t prefix_len = strlen(prefix);
    size_t head = prefix_len + rl_key_tag_bytes(tag_len);
    if (head >= cap)
        return RL_ETOOLONG;
    int n = snprintf(buf, cap, "%s{%zu:", prefix, tag_len);
    memcpy(buf + n, tag, tag_len);
    memcpy(buf + n + tag_len, "}:", 2);
    size_t len;
    int rc = rl_key_build("", value, value_len, buf + head, cap - head, &len);
    if (rc == RL_OK && key_len != NULL)
        *key_len = head + len;
    return rc;
}

static uint16_t crc16_table[256];
static pthread_once_t crc16_once = PTHREAD_ONCE_INIT;

/* The table holds the CRC of each byte value shifted into the top of the
 * register, so that the main loop handles a byte in one step. */
static void crc16_table_fill(void)
{
    for (unsigned byte = 0; byte < 256; byte++) {
        uint16_t crc = (uint16_t)(byte << 8);
        for (int bit = 0; bit < 8; bit++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021)
                                 : (uint16_t)(crc << 1);
        crc16_table[byte] = crc;
    }
}

static uint16_t crc16_xmodem(const unsigned char *p, size_t len)
{
    pthread_once(&crc16_once, crc16_table_fill);
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++)
        crc = (uint16_t)((crc << 8) ^ crc16_table[((crc >> 8) ^ p[i]) & 0xff]);
    return crc;
}

uint16_t rl_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        size_t after = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - after);
        if (close != NULL && close > open + 1)
            return crc16_xmodem((const unsigned char *)open + 1,
                                (size_t)(close - open - 1)) % RL_CLUSTER_SLOTS;
    }
    return crc16_xmodem((const unsigned char *)key, len) % RL_CLUSTER_SLOTS;
}
