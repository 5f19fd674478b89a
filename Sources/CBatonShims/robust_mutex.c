#include "CBatonShims.h"

#if defined(__linux__)
#include <pthread.h>
#include <string.h>

_Static_assert(sizeof(pthread_mutex_t) <= BATON_ROBUST_MUTEX_SIZE, "pthread_mutex_t does not fit its slot");

int baton_robust_mutex_init(void *memory) {
    pthread_mutexattr_t attributes;
    int result = pthread_mutexattr_init(&attributes);
    if (result != 0) return result;
    result = pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
    if (result == 0) result = pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
    if (result == 0) {
        memset(memory, 0, BATON_ROBUST_MUTEX_SIZE);
        result = pthread_mutex_init((pthread_mutex_t *)memory, &attributes);
    }
    pthread_mutexattr_destroy(&attributes);
    return result;
}

int baton_robust_mutex_lock(void *memory, int64_t timeout_ns) {
    pthread_mutex_t *mutex = (pthread_mutex_t *)memory;
    int result = pthread_mutex_trylock(mutex);
    if (result != EBUSY) return result;
    // Holders keep it for one append (well under a microsecond): spin a little before sleeping
    // in the kernel, which costs a futex wait and wake.
    for (int spin = 0; spin < 200; spin++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
        result = pthread_mutex_trylock(mutex);
        if (result != EBUSY) return result;
    }
    if (timeout_ns < 0) return pthread_mutex_lock(mutex);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    int64_t nanoseconds = (int64_t)deadline.tv_nsec + timeout_ns % 1000000000LL;
    deadline.tv_sec += (time_t)(timeout_ns / 1000000000LL + nanoseconds / 1000000000LL);
    deadline.tv_nsec = (long)(nanoseconds % 1000000000LL);
    return pthread_mutex_timedlock(mutex, &deadline);
}

int baton_robust_mutex_unlock(void *memory) { return pthread_mutex_unlock((pthread_mutex_t *)memory); }
int baton_robust_mutex_consistent(void *memory) { return pthread_mutex_consistent((pthread_mutex_t *)memory); }
#endif
