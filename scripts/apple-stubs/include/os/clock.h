// Stub of Apple's <os/clock.h>, for type-checking Baton's Apple code on Linux.
// Source: apple/swift-corelibs-libdispatch os/clock.h (the same header libdispatch ships in
// Apple's SDKs); value kept.
#ifndef BATON_STUB_OS_CLOCK_H
#define BATON_STUB_OS_CLOCK_H
#include <stdint.h>

// apple/swift-corelibs-libdispatch os/clock.h: OS_ENUM(os_clockid, uint32_t, OS_CLOCK_MACH_ABSOLUTE_TIME = 32)
// OS_ENUM expands to `typedef enum : uint32_t { ... } os_clockid_t` on Apple platforms
// (libdispatch os/object.h / libplatform os/base.h), so Swift imports a struct type with
// typed constants; written out here so Swift sees the same.
typedef enum : uint32_t {
    OS_CLOCK_MACH_ABSOLUTE_TIME = 32,
} os_clockid_t;

#endif
