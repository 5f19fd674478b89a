// The hand-over trace: see baton_trace_event in CBatonShims.h. Only POSIX calls; called only by
// builds with -DBATON_TRACE (HandOverTrace.swift), so it costs nothing otherwise.
#include "CBatonShims.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/// One event: 32 bytes, little-endian on every platform Baton runs on.
struct baton_trace_record {
    uint64_t nanoseconds; // baton_monotonic_ns(): comparable across the processes of one boot
    uint64_t thread;      // pthread_self(): distinct among the live threads of the process
    char tag[16];         // NUL-terminated
};

enum { baton_trace_capacity = 1 << 19 }; // 16 MiB of records per process

static struct baton_trace_record *baton_trace_records;
static _Atomic uint64_t baton_trace_next;
static pthread_once_t baton_trace_once = PTHREAD_ONCE_INIT;

static void baton_trace_open(void) {
    const char *directory = getenv("BATON_TRACE_DIR");
    if (directory == NULL) return;
    char path[1024];
    if (snprintf(path, sizeof path, "%s/trace.%d", directory, (int)getpid()) >= (int)sizeof path) return;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    size_t length = (size_t)baton_trace_capacity * sizeof(struct baton_trace_record);
    void *map = ftruncate(fd, (off_t)length) == 0 ? mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (map != MAP_FAILED) baton_trace_records = map;
}

void baton_trace_event(const char *tag) {
    pthread_once(&baton_trace_once, baton_trace_open);
    if (baton_trace_records == NULL) return;
    uint64_t index = atomic_fetch_add_explicit(&baton_trace_next, 1, memory_order_relaxed);
    if (index >= baton_trace_capacity) return;
    struct baton_trace_record *record = &baton_trace_records[index];
    record->thread = (uint64_t)(uintptr_t)pthread_self();
    strncpy(record->tag, tag, sizeof record->tag - 1);
    record->nanoseconds = baton_monotonic_ns();
}
