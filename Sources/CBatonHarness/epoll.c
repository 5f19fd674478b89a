#include "CBatonHarness.h"

#include <errno.h>

#if defined(__linux__)

#include <sys/epoll.h>

// `struct epoll_event` is packed on x86-64, which Swift does not import faithfully: these
// wrappers take and return its two fields separately.

int baton_epoll_create(void) {
    return epoll_create1(EPOLL_CLOEXEC);
}

int baton_epoll_add(int epoll, int fd, uint32_t events, uint64_t token) {
    struct epoll_event event = { .events = events, .data = { .u64 = token } };
    return epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
}

int baton_epoll_remove(int epoll, int fd) {
    struct epoll_event unused = { 0 };
    return epoll_ctl(epoll, EPOLL_CTL_DEL, fd, &unused);
}

int baton_epoll_wait(int epoll, uint64_t *tokens, uint32_t *events, int capacity, int timeout) {
    struct epoll_event ready[64];
    if (capacity > 64) capacity = 64;
    int count = epoll_wait(epoll, ready, capacity, timeout);
    for (int index = 0; index < count; index++) {
        tokens[index] = ready[index].data.u64;
        events[index] = ready[index].events;
    }
    return count;
}

#else

int baton_epoll_create(void) { errno = ENOSYS; return -1; }
int baton_epoll_add(int epoll, int fd, uint32_t events, uint64_t token) { errno = ENOSYS; return -1; }
int baton_epoll_remove(int epoll, int fd) { errno = ENOSYS; return -1; }
int baton_epoll_wait(int epoll, uint64_t *tokens, uint32_t *events, int capacity, int timeout) { errno = ENOSYS; return -1; }

#endif
