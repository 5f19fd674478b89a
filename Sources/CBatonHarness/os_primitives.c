#define _GNU_SOURCE 1
#include "CBatonHarness.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#if defined(__linux__)
#include <mqueue.h>

int baton_bench_mq_open(const char *name, int create, long maxmsg, long msgsize) {
    if (!create) return (int)mq_open(name, O_RDWR | O_CLOEXEC);
    struct mq_attr attributes;
    memset(&attributes, 0, sizeof attributes);
    attributes.mq_maxmsg = maxmsg;
    attributes.mq_msgsize = msgsize;
    return (int)mq_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600, &attributes);
}

int baton_bench_mq_send(int queue, const void *bytes, size_t size) {
    int result;
    while ((result = mq_send((mqd_t)queue, bytes, size, 0)) < 0 && errno == EINTR) {}
    return result;
}

ssize_t baton_bench_mq_receive(int queue, void *buffer, size_t capacity) {
    ssize_t result;
    while ((result = mq_receive((mqd_t)queue, buffer, capacity, NULL)) < 0 && errno == EINTR) {}
    return result;
}

int baton_bench_mq_close(int queue) { return mq_close((mqd_t)queue); }
int baton_bench_mq_unlink(const char *name) { return mq_unlink(name); }
#else
int baton_bench_mq_open(const char *name, int create, long maxmsg, long msgsize) { errno = ENOSYS; return -1; }
int baton_bench_mq_send(int queue, const void *bytes, size_t size) { errno = ENOSYS; return -1; }
ssize_t baton_bench_mq_receive(int queue, void *buffer, size_t capacity) { errno = ENOSYS; return -1; }
int baton_bench_mq_close(int queue) { errno = ENOSYS; return -1; }
int baton_bench_mq_unlink(const char *name) { errno = ENOSYS; return -1; }
#endif

static int baton_bench_unix_address(const char *path, struct sockaddr_un *address) {
    memset(address, 0, sizeof *address);
    address->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof address->sun_path) { errno = ENAMETOOLONG; return -1; }
    strcpy(address->sun_path, path);
    return 0;
}

int baton_bench_unix_listen(const char *path) {
    struct sockaddr_un address;
    if (baton_bench_unix_address(path, &address) < 0) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (bind(fd, (struct sockaddr *)&address, sizeof address) < 0 || listen(fd, 4) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int baton_bench_unix_accept(int listener) {
    int fd;
    while ((fd = accept(listener, NULL, NULL)) < 0 && errno == EINTR) {}
    if (fd >= 0) fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

int baton_bench_unix_connect(const char *path) {
    struct sockaddr_un address;
    if (baton_bench_unix_address(path, &address) < 0) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    int result;
    while ((result = connect(fd, (struct sockaddr *)&address, sizeof address)) < 0 && errno == EINTR) {}
    if (result < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

// Processor affinity of the whole process (every thread), for the bench's one-processor round
// trips: Linux's sched_setaffinity applies to one thread, so each thread in /proc/self/task is
// set; threads and processes created meanwhile inherit the mask of their creator.
#if defined(__linux__)
#include <dirent.h>
#include <sched.h>
#include <stdlib.h>

static int baton_bench_set_process_mask(const cpu_set_t *mask) {
    DIR *tasks = opendir("/proc/self/task");
    if (tasks == NULL) return -1;
    int failures = 0;
    struct dirent *entry;
    while ((entry = readdir(tasks)) != NULL) {
        if (entry->d_name[0] == '.') continue;
        pid_t thread = (pid_t)strtol(entry->d_name, NULL, 10);
        // A thread that ended since the listing is no failure.
        if (sched_setaffinity(thread, sizeof *mask, mask) != 0 && errno != ESRCH) failures += 1;
    }
    closedir(tasks);
    return failures == 0 ? 0 : -1;
}

// The calling thread's mask before the first pin, put back by the unpin (a bench started under
// `taskset` keeps its processors).
static cpu_set_t baton_bench_saved_mask;
static int baton_bench_mask_saved = 0;

int baton_bench_pin_process(int processor) {
    if (!baton_bench_mask_saved) {
        if (sched_getaffinity(0, sizeof baton_bench_saved_mask, &baton_bench_saved_mask) != 0) return -1;
        baton_bench_mask_saved = 1;
    }
    cpu_set_t mask;
    CPU_ZERO(&mask);
    CPU_SET(processor, &mask);
    return baton_bench_set_process_mask(&mask);
}

int baton_bench_unpin_process(void) {
    if (!baton_bench_mask_saved) return 0;
    return baton_bench_set_process_mask(&baton_bench_saved_mask);
}
#else
int baton_bench_pin_process(int processor) { errno = ENOSYS; return -1; }
int baton_bench_unpin_process(void) { errno = ENOSYS; return -1; }
#endif

// The calling thread as SCHED_BATCH (Linux): it still gets its share of the processors, but its
// wake-ups never preempt a running thread; it runs when a processor is free, or at the next
// tick. sched_setscheduler(2) with pid 0 changes the calling thread only, and keeps its nice value.
#if defined(__linux__)
int baton_harness_batch_thread(void) {
    struct sched_param parameters;
    memset(&parameters, 0, sizeof parameters);
    return sched_setscheduler(0, SCHED_BATCH, &parameters);
}
#else
int baton_harness_batch_thread(void) { errno = ENOSYS; return -1; }
#endif
