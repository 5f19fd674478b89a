// C helpers for Baton's own test and benchmark processes (not part of the library).
#ifndef C_BATON_HARNESS_H
#define C_BATON_HARNESS_H

/// Exits the process (status 137) as soon as its parent exits: a thread waits on a pidfd of the
/// parent (Linux). For test and benchmark children, so that none outlives its runner. Returns 0,
/// or -1 where the parent cannot be watched (Apple platforms: the harness runs on Linux).
int baton_exit_with_parent(void);

/// `pipe2(fds, O_CLOEXEC [| O_NONBLOCK])`: both ends close-on-exec from their creation, so a
/// child spawned by another thread at the same moment cannot inherit them. Returns 0 or -1.
int baton_pipe_cloexec(int fds[2], int nonblocking);
/// `accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)`, retried on EINTR.
int baton_accept_cloexec(int listener);

#include <stdint.h>

// epoll (Linux) for the loopback fixtures' poll loop: a descriptor is added or removed by any
// thread without waking the one that waits. Each returns -1 with errno set (ENOSYS elsewhere).

/// `epoll_create1(EPOLL_CLOEXEC)`.
int baton_epoll_create(void);
/// `EPOLL_CTL_ADD` of `fd` for `events` (level-triggered), reported with `token`.
int baton_epoll_add(int epoll, int fd, uint32_t events, uint64_t token);
/// `EPOLL_CTL_DEL` of `fd`.
int baton_epoll_remove(int epoll, int fd);
/// `epoll_wait` for at most `capacity` (at most 64) events: their tokens and events. Returns
/// how many (-1 with EINTR when a signal interrupted the wait).
int baton_epoll_wait(int epoll, uint64_t *tokens, uint32_t *events, int capacity, int timeout);


#include <stddef.h>
#include <sys/types.h>

// The operating system's own message primitives, as floors for `baton bench channels`. Each
// returns -1 with errno set on failure (ENOSYS where the platform lacks the primitive: Apple
// platforms have no POSIX message queues).

/// `mq_open(name, O_RDWR | O_CREAT, 0600, {maxmsg, msgsize})` when `create`, else
/// `mq_open(name, O_RDWR)`. Returns the queue descriptor.
int baton_bench_mq_open(const char *name, int create, long maxmsg, long msgsize);
/// `mq_send` of `size` bytes at priority 0 (retried on EINTR).
int baton_bench_mq_send(int queue, const void *bytes, size_t size);
/// `mq_receive` into `capacity` bytes (retried on EINTR); returns the message's size.
ssize_t baton_bench_mq_receive(int queue, void *buffer, size_t capacity);
int baton_bench_mq_close(int queue);
int baton_bench_mq_unlink(const char *name);

/// A Unix-domain stream socket listening at `path` (which must not exist). Returns it.
int baton_bench_unix_listen(const char *path);
/// Accepts one connection on a listening socket (retried on EINTR).
int baton_bench_unix_accept(int listener);
/// A Unix-domain stream socket connected to `path`.
int baton_bench_unix_connect(const char *path);

/// Forks; the child compares `baton_process_id()` (CBatonShims' cached getpid) with getpid(2)
/// and with `parent`, and exits 0 when it is its own id, 1 when it still is the parent's, 2 on
/// any other mismatch. Returns the child's exit status, or -1 when fork or waitpid failed.
/// (Swift cannot call fork.)
int baton_harness_fork_and_check_process_id(pid_t parent);

/// Puts every thread of this process on `processor` alone (Linux; -1 with ENOSYS elsewhere).
/// Threads and child processes created meanwhile inherit it.
int baton_bench_pin_process(int processor);
/// Puts every thread of this process back on the processors the calling thread had before the
/// first pin.
int baton_bench_unpin_process(void);

/// Makes the calling thread `SCHED_BATCH` (Linux; -1 with ENOSYS elsewhere): its wake-ups no
/// longer preempt a running thread (it runs when a processor is free, or from the next tick),
/// and it keeps its nice value and its share of the processors. For a fixture that stands in
/// for another machine (the loopback server), so that its wake-ups do not take the processor
/// of a thread being measured.
int baton_harness_batch_thread(void);

#endif
