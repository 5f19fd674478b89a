// Tiny C helpers for what Swift cannot call directly: futex through syscall(2),
// atomics on memory shared between processes, variadic libc calls.
#ifndef C_BATON_SHIMS_H
#define C_BATON_SHIMS_H

#include <stdint.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <sys/types.h>
#include <sys/stat.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <limits.h>

/// FUTEX_WAIT on a word that may be shared between processes.
/// `timeout_ns` < 0 waits forever. Returns 0 or -1 with errno (EAGAIN, ETIMEDOUT, EINTR).
static inline int baton_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns) {
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
static inline int baton_futex_wake(uint32_t *addr, int count) {
    return (int)syscall(SYS_futex, addr, FUTEX_WAKE, count, NULL, NULL, 0);
}

static inline int baton_futex_wake_all(uint32_t *addr) {
    return baton_futex_wake(addr, INT_MAX);
}

static inline int baton_gettid(void) { return (int)syscall(SYS_gettid); }
#include <sys/prctl.h>
static inline void baton_set_thread_name(const char *name) { prctl(PR_SET_NAME, name, 0, 0, 0); }
#endif


#if !defined(__linux__)
static inline void baton_set_thread_name(const char *name) { (void)name; }
#endif
static inline int baton_errno(void) { return errno; }
static inline void baton_set_errno(int value) { errno = value; }

static inline int baton_openat(int dirfd, const char *path, int flags, mode_t mode) {
    return openat(dirfd, path, flags, mode);
}

static inline int baton_fcntl_int(int fd, int cmd, int arg) { return fcntl(fd, cmd, arg); }

// Atomics on memory mapped from a file shared with other processes.
static inline uint32_t baton_load32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline void baton_store32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline uint32_t baton_add32(uint32_t *p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline uint32_t baton_sub32(uint32_t *p, uint32_t v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
static inline int baton_cas32(uint32_t *p, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline uint64_t baton_load64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline void baton_store64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline uint64_t baton_add64(uint64_t *p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline int baton_cas64(uint64_t *p, uint64_t expected, uint64_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline void baton_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/// Monotonic nanoseconds (CLOCK_MONOTONIC), comparable across processes on one machine.
static inline uint64_t baton_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}


/// Exits the process (status 137) as soon as its parent exits: a thread waits on a pidfd of the
/// parent. For test and benchmark children, so that none outlives its runner.
int baton_exit_with_parent(void);

/// CRC-32C of `length` bytes, continuing from `crc` (start with 0).
uint32_t baton_crc32c(uint32_t crc, const void *data, size_t length);

#if defined(__linux__)
/// Bytes reserved for a process-shared robust mutex in shared memory (>= sizeof(pthread_mutex_t)).
#define BATON_ROBUST_MUTEX_SIZE 64
/// Initialises a PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST mutex at `memory`. Returns 0 or an errno.
int baton_robust_mutex_init(void *memory);
/// Locks; `timeout_ns` < 0 waits forever. Returns 0, EOWNERDEAD (locked; the previous owner died
/// holding it: repair, then call baton_robust_mutex_consistent), ETIMEDOUT, ENOTRECOVERABLE or an errno.
int baton_robust_mutex_lock(void *memory, int64_t timeout_ns);
int baton_robust_mutex_unlock(void *memory);
int baton_robust_mutex_consistent(void *memory);
#endif

#endif
