/*
 * no_network.c: see no_network.h.
 */
#define _GNU_SOURCE /* si_syscall, the registers in ucontext_t */
#include "no_network.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

/* The trapped call's arguments, and where its result goes, in the
 * context the SIGSYS handler is given (the kernel shows the handler the
 * registers as they were at the call). */
#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
static const int arg_regs[] = {REG_RDI, REG_RSI, REG_RDX};
#define CALL_ARG(uc, i) ((uc)->uc_mcontext.gregs[arg_regs[i]])
#define CALL_RESULT(uc) ((uc)->uc_mcontext.gregs[REG_RAX])
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#define CALL_ARG(uc, i) ((uc)->uc_mcontext.regs[i])
#define CALL_RESULT(uc) ((uc)->uc_mcontext.regs[0])
#else
#error "no_network.c: add this machine's AUDIT_ARCH_* and registers"
#endif

/* The low and high 32 bits of argument i (0: the descriptor). */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG_LOW(i) offsetof(struct seccomp_data, args[i])
#define ARG_HIGH(i) (offsetof(struct seccomp_data, args[i]) + 4)
#else
#define ARG_LOW(i) (offsetof(struct seccomp_data, args[i]) + 4)
#define ARG_HIGH(i) offsetof(struct seccomp_data, args[i])
#endif

/* In the unused sixth argument of the handler's own write: the filter
 * lets that one through. */
#define PASS 0x726c5f7061737321ULL /* "rl_pass!" */

static atomic_long trapped;
static atomic_long first_trapped = -1;

/* A trapped write on a descriptor that is not a socket, made for the
 * thread: the eventfd write that wakes an I/O thread must not fail, as
 * libuv's uv_async_send aborts the process when it does. The result as
 * the kernel returns it (-errno on failure). */
static long write_unless_socket(const ucontext_t *uc)
{
    int saved = errno;
    int fd = (int)CALL_ARG(uc, 0);
    struct stat st;
    long rc = -ENOSYS;
    if (fstat(fd, &st) == 0 && !S_ISSOCK(st.st_mode)) {
        rc = syscall(SYS_write, fd, CALL_ARG(uc, 1), CALL_ARG(uc, 2), 0L, 0L,
                     PASS);
        if (rc < 0)
            rc = -errno;
    }
    errno = saved;
    return rc;
}

/* Counts the call; its result is ENOSYS, but for a write that is not on
 * a socket. (Without a result set here, a trapped call would return its
 * own system call number: a trapped write "wrote" 1 byte.) */
static void on_sigsys(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    long none = -1;
    atomic_compare_exchange_strong(&first_trapped, &none, info->si_syscall);
    atomic_fetch_add(&trapped, 1);
    ucontext_t *uc = context;
    CALL_RESULT(uc) = info->si_syscall == SYS_write ? write_unless_socket(uc)
                                                    : -ENOSYS;
}

static const int network_calls[] = {
    SYS_socket,   SYS_socketpair, SYS_connect,    SYS_accept,
    SYS_accept4,  SYS_bind,       SYS_listen,     SYS_sendto,
    SYS_sendmsg,  SYS_sendmmsg,   SYS_recvfrom,   SYS_recvmsg,
    SYS_recvmmsg, SYS_shutdown,   SYS_getsockopt, SYS_setsockopt,
};

/* Trapped on any descriptor but 0-2. */
static const int io_calls[] = {
    SYS_read,    SYS_write,    SYS_readv,    SYS_writev,
    SYS_pread64, SYS_pwrite64, SYS_preadv,   SYS_pwritev,
    SYS_preadv2, SYS_pwritev2, SYS_sendfile, SYS_splice,
};

#define N_NET (sizeof network_calls / sizeof network_calls[0])
#define N_IO (sizeof io_calls / sizeof io_calls[0])

/* Layout: the arch check, the system call's number against each list,
 * allow; then the descriptor test for the I/O calls, and the handler's
 * PASS; then trap. */
enum { LISTS = 4, ALLOW = LISTS + N_NET + N_IO, FD = ALLOW + 1,
       PASSED = FD + 3, TRAP = PASSED + 5, FILTER_LEN = TRAP + 1 };

static void build_filter(struct sock_filter f[FILTER_LEN])
{
    f[0] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                        offsetof(struct seccomp_data, arch));
    f[1] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K,
                                        NATIVE_ARCH, 1, 0);
    f[2] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP);
    f[3] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                        offsetof(struct seccomp_data, nr));
    for (size_t i = 0; i < N_NET; i++)
        f[LISTS + i] = (struct sock_filter)BPF_JUMP(
            BPF_JMP | BPF_JEQ | BPF_K, (unsigned)network_calls[i],
            (unsigned char)(TRAP - (LISTS + i) - 1), 0);
    for (size_t i = 0; i < N_IO; i++)
        f[LISTS + N_NET + i] = (struct sock_filter)BPF_JUMP(
            BPF_JMP | BPF_JEQ | BPF_K, (unsigned)io_calls[i],
            (unsigned char)(FD - (LISTS + N_NET + i) - 1), 0);
    f[ALLOW] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K,
                                            SECCOMP_RET_ALLOW);
    f[FD] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                         ARG_LOW(0));
    f[FD + 1] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 2, 1,
                                             0);
    f[FD + 2] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K,
                                             SECCOMP_RET_ALLOW);
    f[PASSED] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                             ARG_LOW(5));
    f[PASSED + 1] = (struct sock_filter)BPF_JUMP(
        BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)PASS, 0, TRAP - PASSED - 2);
    f[PASSED + 2] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                                 ARG_HIGH(5));
    f[PASSED + 3] = (struct sock_filter)BPF_JUMP(
        BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(PASS >> 32), 0, 1);
    f[PASSED + 4] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K,
                                                 SECCOMP_RET_ALLOW);
    f[TRAP] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP);
}

int test_forbid_network(void)
{
    struct sock_filter f[FILTER_LEN];
    build_filter(f);
    struct sock_fprog prog = {.len = FILTER_LEN, .filter = f};
    /* A thread's first allocation may read /sys (glibc sizes its arenas
     * by the number of CPUs, with __read_nocancel): done here, before the
     * filter. */
    void *volatile first_allocation = malloc(1);
    free(first_allocation);
    struct sigaction sa = {.sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    /* No TSYNC: prctl filters this thread only; no_new_privs lets a
     * process without CAP_SYS_ADMIN install it. */
    if (sigaction(SIGSYS, &sa, NULL) != 0
        || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return errno;
    return 0;
}

long test_network_calls(long *first)
{
    *first = atomic_load(&first_trapped);
    return atomic_load(&trapped);
}
