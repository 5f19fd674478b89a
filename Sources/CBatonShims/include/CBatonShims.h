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

/// Waits until either of two (process-shared) futex words is woken or differs from its expected
/// value (futex_waitv, Linux 5.16+). Returns the index woken, or -1 with errno (EAGAIN when a
/// value already differs, ENOSYS on older kernels).
static inline int baton_futex_wait_either(uint32_t *a, uint32_t expected_a, uint32_t *b, uint32_t expected_b) {
    struct futex_waitv waiters[2];
    waiters[0].val = expected_a; waiters[0].uaddr = (uint64_t)(uintptr_t)a; waiters[0].flags = FUTEX_32; waiters[0].__reserved = 0;
    waiters[1].val = expected_b; waiters[1].uaddr = (uint64_t)(uintptr_t)b; waiters[1].flags = FUTEX_32; waiters[1].__reserved = 0;
    return (int)syscall(449 /* futex_waitv */, waiters, 2, 0, NULL, 0);
}

/// Whether the kernel has futex_waitv.
static inline int baton_futex_waitv_supported(void) {
    long result = syscall(449 /* futex_waitv */, NULL, 0, 0, NULL, 0);
    return !(result == -1 && errno == ENOSYS);
}

static inline int baton_gettid(void) { return (int)syscall(SYS_gettid); }
#include <sys/prctl.h>
static inline void baton_set_thread_name(const char *name) { prctl(PR_SET_NAME, name, 0, 0, 0); }

// Open-file-description byte-range locks (released by the kernel when the holder dies) and
// helpers for robust process-shared mutexes (declared below, in robust_mutex.c).
#include <pthread.h>
#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif

/// Takes (F_WRLCK) or releases (F_UNLCK) an OFD lock on `length` bytes at `start`, without
/// waiting. Returns 0, or -1 with errno (EAGAIN/EACCES when someone else holds it).
static inline int baton_ofd_setlk(int fd, int64_t start, int64_t length, short type) {
    struct flock lock = { .l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = length, .l_pid = 0 };
    return fcntl(fd, F_OFD_SETLK, &lock);
}

/// 1 when another open file description holds a conflicting OFD lock on the range, 0 when
/// not, -1 with errno on failure.
static inline int baton_ofd_held_by_other(int fd, int64_t start, int64_t length) {
    struct flock lock = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = length, .l_pid = 0 };
    if (fcntl(fd, F_OFD_GETLK, &lock) != 0) return -1;
    return lock.l_type == F_UNLCK ? 0 : 1;
}

static inline int baton_robust_mutex_trylock(void *mutex) { return pthread_mutex_trylock((pthread_mutex_t *)mutex); }
/// A CPU hint for a short spin loop.
static inline void baton_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
static inline size_t baton_robust_mutex_size(void) { return sizeof(pthread_mutex_t); }
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

/// An SQLite progress handler (`sqlite3_progress_handler`): nonzero, which interrupts the
/// statement, while the 32-bit flag `context` points to is nonzero. Plain C: SQLite calls it every
/// few virtual-machine steps of every statement, where a Swift closure's thunk would cost more.
static inline int baton_flag_progress_handler(void *context) {
    return __atomic_load_n((const uint32_t *)context, __ATOMIC_RELAXED) != 0;
}
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
static inline uint64_t baton_or64(uint64_t *p, uint64_t v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline uint64_t baton_and64(uint64_t *p, uint64_t v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
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
