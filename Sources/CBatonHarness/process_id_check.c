// A forked child's view of CBatonShims' cached process id (see CBatonHarness.h).
#include "CBatonHarness.h"
#include "CBatonShims.h"
#include <sys/wait.h>
#include <unistd.h>

int baton_harness_fork_and_check_process_id(pid_t parent) {
    pid_t child = fork();
    if (child < 0) return -1;
    if (child == 0) {
        // Only async-signal-safe calls here: an atomic load, a finished pthread_once, getpid.
        pid_t cached = baton_process_id();
        _exit(cached == getpid() ? 0 : (cached == parent ? 1 : 2));
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
