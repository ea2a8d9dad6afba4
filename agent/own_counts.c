/*
 * own_counts.c: an agent's counts of a key by sub-window (own_counts.h).
 */
#include "own_counts.h"

#include <string.h>

static uint64_t *slot(rl_own_counts *o, uint64_t window)
{
    return &o->by_window[window % RL_OWN_WINDOWS];
}

static uint64_t at(const rl_own_counts *o, uint64_t window)
{
    return o->by_window[window % RL_OWN_WINDOWS];
}

/* The oldest sub-window the ring still holds. */
static uint64_t oldest(const rl_own_counts *o)
{
    return o->newest >= RL_OWN_WINDOWS ? o->newest - RL_OWN_WINDOWS + 1 : 0;
}

static uint64_t total(const rl_own_counts *o)
{
    uint64_t n = 0;
    for (size_t i = 0; i < RL_OWN_WINDOWS; i++)
        n += o->by_window[i];
    return n;
}

void rl_own_record(rl_own_counts *o, uint64_t window, uint64_t basis,
                   uint64_t counted)
{
    if (o->basis != basis) {
        uint64_t kept = total(o);
        memset(o->by_window, 0, sizeof o->by_window);
        memset(o->recorded_ns, 0, sizeof o->recorded_ns);
        rl_own_backs_clear(o);
        o->newest = window;
        o->basis = basis;
        *slot(o, window) = kept;
    }
    if (o->newest == 0) {
        o->newest = window;
    } else if (window > o->newest) {
        /* The sub-windows skipped held nothing; at most a ring's worth to
         * clear. */
        for (uint64_t w = o->newest + 1;
             w <= window && w - o->newest <= RL_OWN_WINDOWS; w++) {
            *slot(o, w) = 0;
            uint64_t *gone_ns = &o->recorded_ns[w % RL_OWN_WINDOWS];
            o->left_ns = *gone_ns > o->left_ns ? *gone_ns : o->left_ns;
            *gone_ns = 0;
            o->back[w % RL_OWN_WINDOWS] = 0;
        }
        o->newest = window;
    }
    if (counted > o->counted)
        *slot(o, o->newest) += counted - o->counted;
    o->counted = counted > o->counted ? counted : o->counted;
}

size_t rl_own_split(const rl_own_counts *o, uint64_t upto,
                    rl_own_part parts[RL_OWN_WINDOWS + 1])
{
    uint64_t left = o->counted > upto ? o->counted - upto : 0;
    size_t n = 0;
    if (o->newest == 0) {
        if (left > 0)
            parts[n++] = (rl_own_part){0, left};
        return n;
    }
    for (uint64_t w = o->newest; left > 0 && w >= oldest(o) && w > 0; w--) {
        uint64_t take = at(o, w) < left ? at(o, w) : left;
        if (take > 0)
            parts[n++] = (rl_own_part){w, take};
        left -= take;
    }
    if (left > 0)
        parts[n++] = (rl_own_part){oldest(o) > 0 ? oldest(o) - 1 : 0, left};
    return n;
}

void rl_own_recorded_at(rl_own_counts *o, uint64_t ns)
{
    if (o->newest > 0)
        o->recorded_ns[o->newest % RL_OWN_WINDOWS] = ns;
}

uint64_t rl_own_window_of(const rl_own_counts *o, uint64_t ns)
{
    /* Records come in time order into sub-windows that only grow. */
    if (ns <= o->left_ns)
        return 0;
    for (uint64_t w = oldest(o) > 0 ? oldest(o) : 1;
         o->newest > 0 && w <= o->newest; w++) {
        uint64_t at_ns = o->recorded_ns[w % RL_OWN_WINDOWS];
        if (at_ns != 0 && at_ns >= ns)
            return w;
    }
    return 0;
}

void rl_own_give_back(rl_own_counts *o, uint64_t window, uint64_t n)
{
    if (window > 0 && window <= o->newest && window >= oldest(o))
        o->back[window % RL_OWN_WINDOWS] += n;
}

size_t rl_own_backs(const rl_own_counts *o,
                    rl_own_part parts[RL_OWN_WINDOWS + 1])
{
    size_t n = 0;
    for (uint64_t w = o->newest; o->newest > 0 && w >= oldest(o) && w > 0;
         w--) {
        if (o->back[w % RL_OWN_WINDOWS] > 0)
            parts[n++] = (rl_own_part){w, o->back[w % RL_OWN_WINDOWS]};
    }
    return n;
}

void rl_own_backs_clear(rl_own_counts *o)
{
    memset(o->back, 0, sizeof o->back);
}

uint64_t rl_own_since(const rl_own_counts *o, uint64_t lo)
{
    uint64_t n = 0;
    for (uint64_t w = o->newest; o->newest > 0 && w >= lo && w >= oldest(o)
                                 && w > 0; w--)
        n += at(o, w);
    return n;
}

uint64_t rl_own_since_before(const rl_own_counts *o, uint64_t lo,
                             uint64_t upto)
{
    uint64_t after = o->counted > upto ? o->counted - upto : 0;
    uint64_t since = rl_own_since(o, lo);
    /* The counts after the first upto are the newest: they fill the span
     * from its newest end. */
    return since > after ? since - after : 0;
}
