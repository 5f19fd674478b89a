// Stub of libplatform's <os/os_sync_wait_on_address.h> (iOS 17.4+, macOS 14.4+), for
// type-checking Baton's Apple code on Linux. Never linked or run.
//
// Signatures: developer.apple.com/documentation/os/os_sync_wait_on_address,
//   .../os_sync_wait_on_address_with_timeout, .../os_sync_wake_by_address_any,
//   .../os_sync_wake_by_address_all.
// Flag values: the header's OS_ENUM declarations (apple-oss-distributions/libplatform
//   include/os/os_sync_wait_on_address.h; that repository is not in the index searched here,
//   the values were read from a verbatim copy of the header's OS_ENUM blocks and agree with
//   Rust libc's bindings of the SDK: NONE = 0x0, SHARED = 0x1).
#ifndef BATON_STUB_OS_SYNC_WAIT_ON_ADDRESS_H
#define BATON_STUB_OS_SYNC_WAIT_ON_ADDRESS_H
#include <stddef.h>
#include <stdint.h>
#include <os/clock.h>

// OS_ENUM(os_sync_wait_on_address_flags, uint32_t, ...) as Apple's os/base.h expands it for
// clang: `typedef enum : uint32_t { ... } os_sync_wait_on_address_flags_t`.
typedef enum : uint32_t {
    OS_SYNC_WAIT_ON_ADDRESS_NONE = 0x00000000,
    OS_SYNC_WAIT_ON_ADDRESS_SHARED = 0x00000001,
} os_sync_wait_on_address_flags_t;

typedef enum : uint32_t {
    OS_SYNC_WAKE_BY_ADDRESS_NONE = 0x00000000,
    OS_SYNC_WAKE_BY_ADDRESS_SHARED = 0x00000001,
} os_sync_wake_by_address_flags_t;

// developer.apple.com/documentation/os/os_sync_wait_on_address
extern int os_sync_wait_on_address(void *addr, uint64_t value, size_t size, os_sync_wait_on_address_flags_t flags);
// developer.apple.com/documentation/os/os_sync_wait_on_address_with_timeout
extern int os_sync_wait_on_address_with_timeout(void *addr, uint64_t value, size_t size,
    os_sync_wait_on_address_flags_t flags, os_clockid_t clockid, uint64_t timeout_ns);
// developer.apple.com/documentation/os/os_sync_wake_by_address_any
extern int os_sync_wake_by_address_any(void *addr, size_t size, os_sync_wake_by_address_flags_t flags);
// developer.apple.com/documentation/os/os_sync_wake_by_address_all
extern int os_sync_wake_by_address_all(void *addr, size_t size, os_sync_wake_by_address_flags_t flags);

#endif
