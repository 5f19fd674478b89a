// Apple's one-argument pthread_setname_np, layered over glibc's <pthread.h> for type-checking
// Baton's Apple code on Linux. Source: Apple libpthread include/pthread/pthread.h
// (`int pthread_setname_np(const char*);`, names the calling thread; the text was read from
// copies of the SDK header, apple-oss-distributions/libpthread is not in the index searched).
// glibc declares a two-argument form only under _GNU_SOURCE, which this check never defines.
#ifndef BATON_STUB_APPLE_PTHREAD_UNAVAILABLE
#define BATON_STUB_APPLE_PTHREAD_UNAVAILABLE
#include <sys/types.h>
// Linux-only, declared before glibc's so that the first declaration is unavailable (Swift
// reads the first one): Darwin has no robust mutexes (Baton watches the owner's flock).
int pthread_mutexattr_setrobust(pthread_mutexattr_t *, int) __attribute__((unavailable("not in Apple's SDK: no robust mutexes")));
int pthread_mutexattr_getrobust(const pthread_mutexattr_t *, int *) __attribute__((unavailable("not in Apple's SDK: no robust mutexes")));
int pthread_mutex_consistent(pthread_mutex_t *) __attribute__((unavailable("not in Apple's SDK: no robust mutexes")));
#endif
#include_next <pthread.h>
#ifndef BATON_STUB_APPLE_PTHREAD_H
#define BATON_STUB_APPLE_PTHREAD_H
#if defined(__USE_GNU)
#error "the Apple check must not define _GNU_SOURCE: glibc's two-argument pthread_setname_np would clash"
#endif
int pthread_setname_np(const char *);
// Source: Apple libpthread include/pthread/pthread.h, as shipped in the macOS SDK (read from the
// copy in ziglang/zig lib/libc/include/any-macos-any/pthread.h):
// `__API_AVAILABLE(macos(11.0), ios(14.2), tvos(14.2), watchos(7.1))
//  int pthread_cpu_number_np(size_t *cpu_number_out);` (0 or an errno; the CPU number the thread
// was running on at the time of query, in [0, hw.ncpu)).
int pthread_cpu_number_np(size_t *cpu_number_out);
#endif
