// Where do the loaded tails of a hand-over come from: from wake-ups that wait for a processor,
// or from threads that are still running when a CPU-bound process takes the processor back?
// (README, "Benchmarks": role preemption and preemption to connected, loaded, p99 2-5 ms.)
//
// Two processes beside two CPU-bound ones (the bench's "loaded", on a 2-core machine). Every
// 0.5 ms the waker stamps the time and wakes the wakee (FUTEX_WAKE on a shared word), then works
// AFTER µs on the processor before it sleeps again; the wakee, when it runs, records its wake-up
// latency and works 20 µs (a transition's worth). The wakee asks for a short time slice
// (sched_setattr with sched_runtime 0.1 ms on SCHED_OTHER, what Baton's kernel-wait threads ask
// for: PromptWakeUps) unless SHORT is 0. Printed: the wakee's wake-up latency, and the waker's
// time from its stamp to the end of its work, p50/p99/max and rounds over 1 ms.
//
// Build and run (AFTER SHORT: 0 1, then 20 1, then 20 0):
//   gcc -O2 -o /tmp/waker-tail scripts/experiments/waker-tail.c
//   /tmp/waker-tail 0 1; /tmp/waker-tail 20 1; /tmp/waker-tail 20 0
//
// Measured here (2 cores, Linux 6.18, HZ 250, preemption model "none"), 2026-11-27, three
// rounds of the three configurations, 3,000 wake-ups each:
//   - the short-slice wakee's wake-up: p99 6.6-34.5 µs, never over 0.5 ms (nor when, in a
//     first version, it worked 60, 150 or 300 µs per wake-up instead of 20);
//   - the waker, with nothing left to do after its wake-up (AFTER 0): 0, 0 and 12 rounds over
//     1 ms; with 20 µs left (AFTER 20): 11, 15 and 14 (max 3.9-4.1 ms); the same beside a
//     default-slice wakee: 18, 55 and 14 (max 4.6-5.4 ms);
//   - the waker's p50 with AFTER 0 is 25.6 µs, not 3: the wakee lands on the waker's processor
//     and runs its 20 µs first.
// A thread asleep in the kernel is woken promptly. The milliseconds belong to threads that are
// runnable but not running (here, a waker preempted by its own wakee) when a CPU-bound process
// gets the processor back: they wait out its slice. So a hand-over's loaded p99 follows the
// processor time its threads spend on the path beside CPU-bound processes, and how often a thread
// on the path is preempted there, rather than the number of wake-ups.
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 3000, WAKEE_WORK_US = 20 };

struct sched_attr {
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
    uint32_t util_min, util_max;
};

struct shared {
    uint32_t word;
    uint64_t stamp;
    int woken;
    uint64_t wakeup[ROUNDS];
    uint64_t waker[ROUNDS];
};

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}

static void work(uint64_t microseconds) {
    uint64_t start = now();
    while (now() - start < microseconds * 1000) {}
}

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, uint64_t *ns, int count) {
    qsort(ns, count, sizeof *ns, compare);
    int over = 0;
    for (int i = 0; i < count; i++) over += ns[i] > 1000000;
    printf("  %-38s p50 %7.1f  p99 %7.1f  max %7.1f µs, over 1 ms: %d of %d\n", what,
           ns[count / 2] / 1e3, ns[count * 99 / 100] / 1e3, ns[count - 1] / 1e3, over, count);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s AFTER_US SHORT(0|1)\n", argv[0]);
        return 2;
    }
    int after = atoi(argv[1]), shortSlice = atoi(argv[2]);
    struct shared *s = mmap(0, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) return 1;
    pid_t hogs[2];
    for (int i = 0; i < 2; i++)
        if ((hogs[i] = fork()) == 0)
            for (;;) {}
    pid_t wakee = fork();
    if (wakee == 0) {
        if (shortSlice) {
            struct sched_attr attr = {.size = sizeof attr, .sched_policy = SCHED_OTHER, .sched_runtime = 100000};
            syscall(SYS_sched_setattr, 0, &attr, 0);
        }
        uint32_t seen = 0;
        while (seen < ROUNDS) {
            while (__atomic_load_n(&s->word, __ATOMIC_SEQ_CST) == seen)
                syscall(SYS_futex, &s->word, FUTEX_WAIT, seen, 0, 0, 0);
            seen = __atomic_load_n(&s->word, __ATOMIC_SEQ_CST);
            uint64_t woke = now();
            if (s->woken < ROUNDS) s->wakeup[s->woken++] = woke - s->stamp;
            work(WAKEE_WORK_US);
        }
        _exit(0);
    }
    for (int i = 0; i < ROUNDS; i++) {
        struct timespec idle = {0, 500000};
        nanosleep(&idle, 0);
        s->stamp = now();
        __atomic_add_fetch(&s->word, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, &s->word, FUTEX_WAKE, 1, 0, 0, 0);
        work(after);
        s->waker[i] = now() - s->stamp;
    }
    waitpid(wakee, 0, 0);
    for (int i = 0; i < 2; i++) kill(hogs[i], SIGKILL);
    for (int i = 0; i < 2; i++) waitpid(hogs[i], 0, 0);
    printf("waker works %d µs after its wake-up; wakee %s slice\n", after, shortSlice ? "short (0.1 ms)" : "default");
    report("wakee: wake-up latency", s->wakeup, s->woken);
    report("waker: stamp to the end of its work", s->waker, ROUNDS);
    return 0;
}
