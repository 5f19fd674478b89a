// Tiny C helpers for what Swift cannot call directly: atomics on memory shared between
// processes, CRC-32C, variadic libc calls. Everything that differs between operating systems
// sits in one per-platform header below (the C half of the kernel layer, see
// Sources/Baton/Kernel): nothing else in this file may name an OS-specific call.
#ifndef C_BATON_SHIMS_H
#define C_BATON_SHIMS_H

#include <stdint.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <sched.h>

// The mapping guard (mapping_guard.c): a SIGBUS handler that extends a registered shared
// mapping's file back to the mapping's length when another program cut it short.
/// Registers a mapping of `fd` at `start` for `length` bytes; returns its slot (-1: not guarded).
int baton_mapping_guard_register(void *start, size_t length, int fd);
/// baton_mapping_guard_register for a mapping of `fd` from file offset `offset`: a fault is
/// repaired by extending the file to `offset + length`.
int baton_mapping_guard_register_at(void *start, size_t length, int fd, int64_t offset);
/// How many faults the guard repaired in `slot` since it was registered (0 for a negative slot).
uint64_t baton_mapping_guard_slot_repairs(int slot);
/// Forgets a mapping (before it is unmapped or its descriptor closed).
void baton_mapping_guard_unregister(int slot);
/// How many faults the guard repaired in this process.
uint64_t baton_mapping_guard_repairs(void);

// The hand-over trace (trace.c): a diagnostic compiled into the Swift side only with
// `-Xswiftc -DBATON_TRACE` (see Sources/Baton/System/HandOverTrace.swift).
/// Appends (monotonic time, calling thread, `tag`, at most 15 bytes) to the file
/// `$BATON_TRACE_DIR/trace.<pid>`, a shared mapping that survives SIGKILL; nothing when the
/// variable is unset or the file cannot be made.
void baton_trace_event(const char *tag);

// The process id (process_id.c): getpid(2), cached, and asked again in the child of a fork.
/// The calling process's id, as getpid(2) returns it, without a system call after the first.
pid_t baton_process_id(void);

// The thread context (thread_context.c): one pointer per thread, C11 `_Thread_local`, so that
// Swift code can ask "is this thread the one my executor runs?" without naming pthread_t
// (an integer on Linux, a pointer on Apple platforms).
/// Sets the calling thread's context pointer.
void baton_set_thread_context(void *context);
/// The calling thread's context pointer (NULL until set).
void *baton_thread_context(void);

// The Apple type-check (scripts/check-apple.sh) defines BATON_APPLE_TYPECHECK to read the Darwin
// half on Linux, against declarations transcribed from Apple's headers.
#if defined(__APPLE__) || defined(BATON_APPLE_TYPECHECK)
#include "../platform/CBatonShims+Darwin.h"
#elif defined(__linux__)
#include "../platform/CBatonShims+Linux.h"
#else
#error "Baton supports Linux and Apple platforms only"
#endif

#include <pthread.h>

/// Starts a detached thread running `body(argument)`. Returns 0 or an errno. (In C because
/// `pthread_t` is an integer on Linux and a pointer on Apple platforms.)
static inline int baton_spawn_detached_thread(void *(*body)(void *), void *argument) {
    pthread_t thread;
    int result = pthread_create(&thread, NULL, body, argument);
    if (result == 0) pthread_detach(thread);
    return result;
}

static inline int baton_errno(void) { return errno; }
static inline void baton_set_errno(int value) { errno = value; }

static inline int baton_openat(int dirfd, const char *path, int flags, mode_t mode) {
    return openat(dirfd, path, flags, mode);
}

static inline int baton_fcntl_int(int fd, int cmd, int arg) { return fcntl(fd, cmd, arg); }

/// A CPU hint for a short spin loop.
static inline void baton_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm64__)
    __asm__ __volatile__("yield");
#endif
}

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
static inline uint64_t baton_or64(uint64_t *p, uint64_t v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline uint64_t baton_and64(uint64_t *p, uint64_t v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
static inline void baton_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/// Writes the byte at `p` back unchanged (a volatile load and store, which the compiler keeps),
/// so that its page is faulted in for writing without changing any data. The caller must own
/// the byte: no other thread or process may write it meanwhile.
static inline void baton_touch_for_write(void *p) {
    volatile unsigned char *byte = (volatile unsigned char *)p;
    *byte = *byte;
}

/// The size of a page of virtual memory (POSIX `sysconf(_SC_PAGESIZE)`).
static inline long baton_page_size(void) { return sysconf(_SC_PAGESIZE); }

/// An SQLite progress handler (`sqlite3_progress_handler`): nonzero, which interrupts the
/// statement, while the 32-bit flag `context` points to is nonzero. Plain C: SQLite calls it every
/// few virtual-machine steps of every statement, where a Swift closure's thunk would cost more.
static inline int baton_flag_progress_handler(void *context) {
    return __atomic_load_n((const uint32_t *)context, __ATOMIC_RELAXED) != 0;
}

struct sqlite3;
/// The context of ``baton_writer_progress_handler``.
typedef struct baton_writer_interruption {
    /// While nonzero, statements that run in a write transaction are interrupted.
    const uint32_t *writes;
    /// While nonzero, every statement is interrupted.
    const uint32_t *all;
    /// The connection (`sqlite3 *`).
    struct sqlite3 *connection;
    /// `sqlite3_txn_state`, passed in by the caller (this shim does not link SQLite).
    int (*transaction_state)(struct sqlite3 *, const char *);
} baton_writer_interruption;

/// The progress handler of a writer connection (`context`: a `baton_writer_interruption`):
/// nonzero, which interrupts the statement, while `all` is set, or while `writes` is set and the
/// connection has a write transaction open (`SQLITE_TXN_WRITE`, 2). A read on the connection
/// outside a write transaction runs on: it holds no write lock (GRDB fetches the values of its
/// observations there, and an interrupted fetch ends the observation). The transaction state is
/// only asked for while `writes` is set.
static inline int baton_writer_progress_handler(void *context) {
    const baton_writer_interruption *interruption = (const baton_writer_interruption *)context;
    if (__atomic_load_n(interruption->all, __ATOMIC_RELAXED) != 0) return 1;
    if (__atomic_load_n(interruption->writes, __ATOMIC_RELAXED) == 0) return 0;
    return interruption->transaction_state(interruption->connection, NULL) == 2;
}

/// CRC-32C of `length` bytes, continuing from `crc` (start with 0).
uint32_t baton_crc32c(uint32_t crc, const void *data, size_t length);

#endif
