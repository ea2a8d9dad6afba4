/*
 * no_network.h: proof that a thread makes no network call, for the synced
 * path's promise that a check never touches the network. A seccomp filter
 * on the checking thread alone traps (SIGSYS) every socket system call and
 * every read or write on a descriptor other than 0-2 (a socket, an
 * eventfd...), and counts it. A trapped call fails with ENOSYS, but for a
 * write on a descriptor that is not a socket, which the handler makes for
 * the thread: the eventfd write that wakes an I/O thread is counted, and
 * libuv, which aborts when that write fails, goes on. Reads and writes on
 * 0-2 stay allowed: sanitizers report on stderr. A call handed to another
 * thread (nng's, the agent's I/O thread) is not seen here.
 */
#ifndef RL_NO_NETWORK_H
#define RL_NO_NETWORK_H

/* Installs the filter on the calling thread (for the rest of its life);
 * returns 0, or the errno of what refused it. No Criterion assertion here:
 * the thread is not the test's own. */
int test_forbid_network(void);

/* The calls trapped so far in this process, and the system call number of
 * the first (or -1). */
long test_network_calls(long *first);

#endif
