// The Linux half of the kernel layer's C declarations (see Sources/Baton/Kernel). Included by
// CBatonShims.h only; nothing outside the kernel layer calls these directly.
#ifndef C_BATON_SHIMS_LINUX_H
#define C_BATON_SHIMS_LINUX_H

#include <stdint.h>
#include <time.h>
#include <limits.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <linux/futex.h>
#include <sys/resource.h>

/// FUTEX_WAIT on a word that may be shared between processes (not FUTEX_PRIVATE_FLAG, so it works
/// on private memory too). `timeout_ns` < 0 waits forever. Returns 0 or -1 with errno (EAGAIN
/// when the word already differs, ETIMEDOUT, EINTR).
static inline int baton_linux_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts;
    struct timespec *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
        tsp = &ts;
    }
    return (int)syscall(SYS_futex, addr, FUTEX_WAIT, expected, tsp, NULL, 0);
}

/// FUTEX_WAKE of up to `count` waiters (INT_MAX for all). Returns the number woken or -1.
static inline int baton_linux_futex_wake(uint32_t *addr, int count) {
    return (int)syscall(SYS_futex, addr, FUTEX_WAKE, count, NULL, NULL, 0);
}

// glibc's <sched.h> declares sched_getcpu only under _GNU_SOURCE, which the shim does not define;
// the function is in every glibc since 2.6 (sched_getcpu(3)), and reads the CPU number from the
// thread's rseq area (glibc >= 2.35) or the vDSO: no system call.
extern int sched_getcpu(void);

/// The number of the CPU the calling thread ran on when asked, or -1 when the kernel does not say.
static inline int baton_linux_current_cpu(void) { return sched_getcpu(); }

/// Monotonic nanoseconds (CLOCK_MONOTONIC: one clock for every process of the machine).
static inline uint64_t baton_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/// Names the calling thread (visible in `top -H`, gdb, /proc/<pid>/task/*/comm).
static inline void baton_set_thread_name(const char *name) { prctl(PR_SET_NAME, name, 0, 0, 0); }

/// Asks the scheduler for a short time slice for the calling thread (EEVDF's per-task slice,
/// Linux 6.12 and later: sched_setattr(2) with `sched_runtime` on a SCHED_OTHER thread; no
/// privilege needed, the kernel clamps it to 0.1-100 ms). A task with a shorter slice than the
/// one running gets an earlier deadline, and its wake-up preempts the running task at once
/// instead of waiting out that task's protected slice. Its nice value and policy are kept.
/// Returns 0, or -1 with errno set (older kernels ignore `sched_runtime` and return 0).
/// (`struct sched_attr` of <linux/sched/types.h>, version 1, 56 bytes, transcribed: that header
/// clashes with glibc's `struct sched_param`.)
struct baton_linux_sched_attr {
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
    uint32_t sched_util_min, sched_util_max;
};

static inline int baton_linux_request_short_slice(uint64_t nanoseconds) {
    struct baton_linux_sched_attr attr;
    __builtin_memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.sched_policy = 0; // SCHED_NORMAL (SCHED_OTHER)
    attr.sched_nice = getpriority(PRIO_PROCESS, 0);
    attr.sched_runtime = nanoseconds;
    return (int)syscall(SYS_sched_setattr, 0, &attr, 0);
}

/// The calling thread's time slice (`sched_runtime` of sched_getattr(2): the requested one, or the
/// default); 0 when the call fails.
static inline uint64_t baton_linux_current_slice(void) {
    struct baton_linux_sched_attr attr;
    __builtin_memset(&attr, 0, sizeof attr);
    if (syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) != 0) return 0;
    return attr.sched_runtime;
}

#if defined(__aarch64__)
#include <sys/auxv.h>   // getauxval, AT_HWCAP; glibc's <bits/hwcap.h> for aarch64: HWCAP_CRC32

/// Whether this ARMv8 processor has the CRC32 instructions (FEAT_CRC32), as the kernel reports
/// them in the auxiliary vector.
static inline int baton_cpu_has_crc32(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#endif

#endif
