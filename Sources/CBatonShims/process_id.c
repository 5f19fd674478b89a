// The calling process's id, cached (see CBatonShims.h): getpid(2) is a system call on every
// call with glibc since 2.25, and a role's transition asked for it half a dozen times.
#include "CBatonShims.h"
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static _Atomic pid_t baton_cached_process_id;
static pthread_once_t baton_process_id_once = PTHREAD_ONCE_INIT;

// The child of a fork(2) is another process: it asks the kernel again. (A process made by
// posix_spawn or exec starts from a fresh image, with nothing cached.)
static void baton_process_id_forked(void) {
    atomic_store_explicit(&baton_cached_process_id, 0, memory_order_relaxed);
}

static void baton_process_id_register(void) {
    pthread_atfork(NULL, NULL, baton_process_id_forked);
}

pid_t baton_process_id(void) {
    pid_t id = atomic_load_explicit(&baton_cached_process_id, memory_order_relaxed);
    if (id != 0) return id;
    // Registered before the first value is cached, so no fork can copy a cached value that
    // its child would keep.
    pthread_once(&baton_process_id_once, baton_process_id_register);
    id = getpid();
    atomic_store_explicit(&baton_cached_process_id, id, memory_order_relaxed);
    return id;
}
