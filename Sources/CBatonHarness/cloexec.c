#define _GNU_SOURCE
#include "CBatonHarness.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(__linux__)

int baton_pipe_cloexec(int fds[2], int nonblocking) {
    return pipe2(fds, O_CLOEXEC | (nonblocking ? O_NONBLOCK : 0));
}

int baton_accept_cloexec(int listener) {
    int fd;
    do { fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK); } while (fd < 0 && errno == EINTR);
    return fd;
}

#else

// Apple platforms have neither pipe2 nor accept4: the flags are set right after, and the
// spawner passes POSIX_SPAWN_CLOEXEC_DEFAULT so that no child inherits them in between.
static int baton_set_flags(int fd, int nonblocking) {
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -1;
    if (nonblocking && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) return -1;
    return 0;
}

int baton_pipe_cloexec(int fds[2], int nonblocking) {
    if (pipe(fds) < 0) return -1;
    if (baton_set_flags(fds[0], nonblocking) < 0 || baton_set_flags(fds[1], nonblocking) < 0) {
        int saved = errno;
        close(fds[0]);
        close(fds[1]);
        errno = saved;
        return -1;
    }
    return 0;
}

int baton_accept_cloexec(int listener) {
    int fd;
    do { fd = accept(listener, NULL, NULL); } while (fd < 0 && errno == EINTR);
    if (fd >= 0 && baton_set_flags(fd, 1) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

#endif
