// Apple's additions to <time.h>, layered over glibc's for type-checking Baton's Apple code on
// Linux. Source: Apple Libc include/time.h (apple-oss-distributions/Libc; the text was read
// from a copy of that header, the repository itself is not in the index searched here):
// _CLOCK_MONOTONIC_RAW = 4, _CLOCK_UPTIME_RAW = 8, clock_gettime_nsec_np. Apple's clockid_t is
// an enum; glibc's int is kept.
#include_next <time.h>
#ifndef BATON_STUB_APPLE_TIME_H
#define BATON_STUB_APPLE_TIME_H
#include <stdint.h>

#ifndef CLOCK_MONOTONIC_RAW
#define CLOCK_MONOTONIC_RAW 4
#endif
#define CLOCK_UPTIME_RAW 8

uint64_t clock_gettime_nsec_np(clockid_t __clock_id);

#endif
