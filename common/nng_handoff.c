/*
 * nng_handoff.c: one process-wide lock, taken and released at once. It
 * adds no ordering nng does not already guarantee; it only shows that
 * ordering to ThreadSanitizer.
 */
#include "nng_handoff.h"

#include <pthread.h>

static pthread_mutex_t handoff_lock = PTHREAD_MUTEX_INITIALIZER;

void rl_nng_handoff(void)
{
    pthread_mutex_lock(&handoff_lock);
    pthread_mutex_unlock(&handoff_lock);
}
