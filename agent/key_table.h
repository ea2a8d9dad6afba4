/*
 * key_table.h: the size of the lock-free tables of keys that synced.c and
 * leased.c keep (open addressing, a power of two of slots): at most half
 * full at max_keys, so that a probe ends soon. Private to librl.
 */
#ifndef RL_AGENT_KEY_TABLE_H
#define RL_AGENT_KEY_TABLE_H

#include <stddef.h>

static inline size_t rl_key_table_cap(size_t max_keys)
{
    size_t cap = 16;
    while (cap < 2 * max_keys)
        cap *= 2;
    return cap;
}

#endif
