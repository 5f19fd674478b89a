// The Apple half of the kernel layer's C declarations (see Sources/Baton/Kernel). Included by
// CBatonShims.h only; nothing outside the kernel layer calls these directly.
//
// Every Apple call below is declared by Apple's own headers (named beside each); on Linux,
// scripts/check-apple.sh reads this file against copies of those declarations transcribed into
// scripts/apple-stubs. NOT RUN on Linux: type-checked only.
#ifndef C_BATON_SHIMS_DARWIN_H
#define C_BATON_SHIMS_DARWIN_H

#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <sys/event.h>                    // xnu bsd/sys/event.h: kqueue, kevent, EVFILT_VNODE, NOTE_FUNLOCK
#include <sys/sysctl.h>                   // sysctlbyname
#include <os/os_sync_wait_on_address.h>   // libplatform: os_sync_* (iOS 17.4, macOS 14.4)

/// The number of the CPU the calling thread ran on when asked, or -1 when the kernel does not
/// say. libpthread pthread.h: `int pthread_cpu_number_np(size_t *cpu_number_out)`, macOS 11.0,
/// iOS 14.2 ("The CPU number that the thread was running on at the time of query ... in the
/// interval [0, ncpus)"; returns 0 or an errno).
static inline int baton_darwin_current_cpu(void) {
    size_t number = 0;
    if (pthread_cpu_number_np(&number) != 0 || number > (size_t)INT32_MAX) return -1;
    return (int)number;
}

/// Waits while the 32-bit word at `addr` (in memory that may be shared between processes) holds
/// `expected`. `timeout_ns` < 0 waits forever. Returns >= 0 when woken or the word differs, or -1
/// with errno (ETIMEDOUT, EINTR, EFAULT).
static inline int baton_darwin_wait_on_address(uint32_t *addr, uint32_t expected, int64_t timeout_ns) {
    if (timeout_ns < 0) {
        return os_sync_wait_on_address(addr, (uint64_t)expected, 4, OS_SYNC_WAIT_ON_ADDRESS_SHARED);
    }
    if (timeout_ns == 0) {
        // os_sync_wait_on_address_with_timeout refuses a zero timeout (EINVAL).
        if (__atomic_load_n(addr, __ATOMIC_SEQ_CST) != expected) return 0;
        errno = ETIMEDOUT;
        return -1;
    }
    return os_sync_wait_on_address_with_timeout(addr, (uint64_t)expected, 4, OS_SYNC_WAIT_ON_ADDRESS_SHARED,
                                                OS_CLOCK_MACH_ABSOLUTE_TIME, (uint64_t)timeout_ns);
}

/// Wakes one waiter (or all) on the word at `addr`. Returns >= 0, or -1 with errno (ENOENT when
/// nobody waited).
static inline int baton_darwin_wake_by_address(uint32_t *addr, int all) {
    return all ? os_sync_wake_by_address_all(addr, 4, OS_SYNC_WAKE_BY_ADDRESS_SHARED)
               : os_sync_wake_by_address_any(addr, 4, OS_SYNC_WAKE_BY_ADDRESS_SHARED);
}

/// Monotonic nanoseconds, one clock for every process of the machine (mach absolute time, the
/// clock os_sync_wait_on_address_with_timeout counts in).
static inline uint64_t baton_monotonic_ns(void) { return clock_gettime_nsec_np(CLOCK_UPTIME_RAW); }

/// Names the calling thread (Darwin's pthread_setname_np names only the calling thread).
static inline void baton_set_thread_name(const char *name) { (void)pthread_setname_np(name); }

/// Reserves disk space so that the file can grow to `target` bytes, then sets its length:
/// F_PREALLOCATE (contiguous first, then any blocks) from the physical end of the file, then
/// ftruncate. Returns 0 or an errno (ENOSPC when the volume is full).
static inline int baton_darwin_preallocate(int fd, int64_t current, int64_t target) {
    if (target > current) {
        fstore_t store = { F_ALLOCATECONTIG | F_ALLOCATEALL, F_PEOFPOSMODE, 0, (off_t)(target - current), 0 };
        if (fcntl(fd, F_PREALLOCATE, &store) == -1) {
            store.fst_flags = F_ALLOCATEALL;
            if (fcntl(fd, F_PREALLOCATE, &store) == -1 && errno != ENOTSUP) return errno;
        }
    }
    while (ftruncate(fd, (off_t)target) == -1) {
        if (errno != EINTR) return errno;
    }
    return 0;
}

/// Flushes the file to permanent storage: F_FULLFSYNC asks the drive to write its cache too
/// (fsync alone does not on Apple platforms); where the file system refuses it, fsync.
static inline int baton_darwin_full_fsync(int fd) {
    if (fcntl(fd, F_FULLFSYNC) == 0) return 0;
    return fsync(fd);
}

/// Registers (or, with `remove`, removes) a vnode watch on `fd` in `kq` for `fflags`
/// (NOTE_FUNLOCK, NOTE_DELETE, NOTE_WRITE, ...), edge-triggered (EV_CLEAR), tagged `tag`.
/// Returns 0 or -1 with errno.
static inline int baton_darwin_watch_vnode(int kq, int fd, uint32_t fflags, uint64_t tag, int remove) {
    struct kevent change;
    EV_SET(&change, (uintptr_t)fd, EVFILT_VNODE, remove ? EV_DELETE : (EV_ADD | EV_ENABLE | EV_CLEAR),
           fflags, 0, (void *)(uintptr_t)tag);
    return kevent(kq, &change, 1, NULL, 0, NULL);
}

/// Waits for vnode events on `kq`; stores up to `capacity` tags and their fired flags. Returns the
/// number of events or -1 with errno.
static inline int baton_darwin_wait_vnode(int kq, uint64_t *tags, uint32_t *fflags, int capacity) {
    struct kevent events[64];
    if (capacity > 64) capacity = 64;
    int count = kevent(kq, NULL, 0, events, capacity, NULL);
    for (int i = 0; i < count; i++) {
        tags[i] = (uint64_t)(uintptr_t)events[i].udata;
        fflags[i] = (uint32_t)events[i].fflags;
    }
    return count;
}

/// Opens `path` only to watch it (O_EVTONLY: the descriptor does not keep a volume busy).
static inline int baton_darwin_open_event_only(const char *path) { return open(path, O_EVTONLY | O_CLOEXEC); }

/// The vnode events that say "a lock on this file was released, or the file went away".
static inline uint32_t baton_darwin_lock_release_events(void) {
    return NOTE_FUNLOCK | NOTE_DELETE | NOTE_RENAME | NOTE_REVOKE | NOTE_ATTRIB;
}

/// The vnode events on a directory that say "an entry was added, removed or renamed".
static inline uint32_t baton_darwin_directory_events(void) { return NOTE_WRITE | NOTE_DELETE | NOTE_RENAME; }

/// This boot's session id (kern.bootsessionuuid, a UUID string): `*length` in, bytes out.
static inline int baton_darwin_boot_session(char *buffer, size_t *length) {
    return sysctlbyname("kern.bootsessionuuid", buffer, length, NULL, 0);
}

/// Whether this arm64 processor has the CRC32 instructions: xnu's `hw.optional.armv8_crc32`
/// (apple-oss-distributions/xnu bsd/kern/kern_mib.c, an int: 1 when present; the node is absent
/// on Intel Macs).
static inline int baton_cpu_has_crc32(void) {
    int value = 0;
    size_t length = sizeof value;
    return sysctlbyname("hw.optional.armv8_crc32", &value, &length, NULL, 0) == 0 && value > 0;
}

#endif
