// Does a requester that is asleep in the kernel before its wake-up lands avoid the loaded tails
// of a role preemption? (README, "Benchmarks": role preemption to the grant, loaded.)
//
// Two processes, B and W, on shared words, shaped like a preemption: B works 12 µs (its first
// transition), wakes W and waits for W's answer; W works 15 µs (reads the request, releases) and
// wakes B; B works 7 µs more (the grant). 0.5 ms idle before each round, as in the bench. Two
// ways for B to wake and wait, alternating in blocks of 50 rounds:
//   - "wake; wait": FUTEX_WAKE, then FUTEX_WAIT: two system calls, so B returns to user space
//     between them, where the W it woke onto its processor preempts it (what Baton does);
//   - "uring wake+wait": one io_uring_enter that submits IORING_OP_FUTEX_WAKE and
//     IORING_OP_FUTEX_WAIT and sleeps for the wait's completion (Linux 6.7+): B is asleep in
//     the kernel, not preempted, when W runs, so W's answer wakes it like any sleeper.
//
// Build and run (the second line under two CPU-bound processes, the bench's "loaded"):
//   gcc -O2 -o /tmp/wake-then-wait scripts/experiments/wake-then-wait.c
//   /tmp/wake-then-wait 1000
//   (for i in 1 2; do (while :; do :; done) & done; /tmp/wake-then-wait 1000; kill $(jobs -p))
//
// Measured here (2 cores, Linux 6.18, preemption model "none"), 2026-11-27, "wake; wait" first:
// idle p99 124 and 86 µs, 90 and 67 µs; loaded p99 2,735 and 2,192 µs, 1,747 and 2,472 µs,
// 3,399 and 2,124 µs, 1,959 and 2,829 µs; p50 within 3 µs of each other throughout. The loaded
// tails are a CPU-bound process's time slice either way: a wake-up that finds both processors
// busy waits for one, whoever the waker is. Not adopted.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <linux/io_uring.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// From Linux's include/uapi/linux/io_uring.h (enum io_uring_op, 6.7+) and futex.h (FUTEX2_SIZE_U32),
// which older installed headers lack.
#define OP_FUTEX_WAIT 51
#define OP_FUTEX_WAKE 52
#define FUTEX2_SIZE_U32 0x02

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void work(uint64_t ns) {
    uint64_t end = now() + ns;
    while (now() < end) {}
}

static void futex_wait(uint32_t *word, uint32_t expected) { syscall(SYS_futex, word, FUTEX_WAIT, expected, NULL, NULL, 0); }
static void futex_wake(uint32_t *word) { syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0); }

struct ring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
};

static int ring_init(struct ring *r) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    r->fd = (int)syscall(__NR_io_uring_setup, 8, &p);
    if (r->fd < 0) return -1;
    size_t size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (cq_size > size) size = cq_size;
    // One mapping for both rings (IORING_FEAT_SINGLE_MMAP, 5.4+).
    char *rings = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
    r->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (rings == MAP_FAILED || r->sqes == MAP_FAILED) return -1;
    r->sq_tail = (unsigned *)(rings + p.sq_off.tail);
    r->sq_mask = (unsigned *)(rings + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(rings + p.sq_off.array);
    r->cq_head = (unsigned *)(rings + p.cq_off.head);
    r->cq_tail = (unsigned *)(rings + p.cq_off.tail);
    r->cq_mask = (unsigned *)(rings + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(rings + p.cq_off.cqes);
    return 0;
}

static void push(struct ring *r, int op, uint32_t *word, uint64_t value, int flags, uint64_t tag) {
    unsigned tail = *r->sq_tail, index = tail & *r->sq_mask;
    struct io_uring_sqe *sqe = &r->sqes[index];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = (uint8_t)op;
    sqe->fd = FUTEX2_SIZE_U32;     // the futex2 flags (shared, 32-bit)
    sqe->addr = (uint64_t)(uintptr_t)word;
    sqe->off = value;              // addr2: the expected value (wait), how many to wake (wake)
    sqe->addr3 = 0xffffffffu;      // FUTEX_BITSET_MATCH_ANY
    sqe->flags = (uint8_t)flags;
    sqe->user_data = tag;
    r->sq_array[index] = index;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

// Wakes `wake`, then sleeps until `word` is no longer `expected`, in one system call.
static void wake_then_wait(struct ring *r, uint32_t *wake, uint32_t *word, uint32_t expected) {
    push(r, OP_FUTEX_WAKE, wake, 1, IOSQE_CQE_SKIP_SUCCESS, 1);
    push(r, OP_FUTEX_WAIT, word, expected, 0, 2);
    unsigned submit = 2;
    for (;;) {
        if (syscall(__NR_io_uring_enter, r->fd, submit, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0 && errno != EINTR) {
            perror("io_uring_enter");
            exit(1);
        }
        submit = 0;
        unsigned head = *r->cq_head, tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
        int done = 0;
        for (; head != tail; head++) {
            struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
            if (cqe->user_data == 2) done = 1;
            else fprintf(stderr, "wake failed: %d\n", cqe->res);
        }
        __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
        if (done) return;
    }
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1000;
    uint32_t *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint32_t *to_w = shared, *to_b = shared + 16;
    pid_t w = fork();
    if (w == 0) {
        for (uint32_t seen = 0;;) {
            while (__atomic_load_n(to_w, __ATOMIC_ACQUIRE) == seen) futex_wait(to_w, seen);
            seen = __atomic_load_n(to_w, __ATOMIC_ACQUIRE);
            work(15000);
            __atomic_add_fetch(to_b, 1, __ATOMIC_RELEASE);
            futex_wake(to_b);
        }
    }
    struct ring ring;
    if (ring_init(&ring) != 0) {
        perror("io_uring_setup");
        kill(w, SIGKILL);
        return 1;
    }
    double *samples[2] = {calloc((size_t)rounds, sizeof(double)), calloc((size_t)rounds, sizeof(double))};
    int count[2] = {0, 0};
    for (int i = 0; i < 2 * rounds; i++) {
        int mode = (i / 50) % 2;
        usleep(500);
        uint64_t start = now();
        work(12000);
        uint32_t seen = __atomic_load_n(to_b, __ATOMIC_ACQUIRE);
        __atomic_add_fetch(to_w, 1, __ATOMIC_RELEASE);
        if (mode == 0) futex_wake(to_w);
        else wake_then_wait(&ring, to_w, to_b, seen);
        while (__atomic_load_n(to_b, __ATOMIC_ACQUIRE) == seen) futex_wait(to_b, seen);
        work(7000);
        samples[mode][count[mode]++] = (double)(now() - start) / 1000;
    }
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    for (int m = 0; m < 2; m++) {
        qsort(samples[m], (size_t)count[m], sizeof(double), compare);
        printf("%s n=%d p50=%.1f p90=%.1f p99=%.1f max=%.1f (µs)\n", m ? "uring wake+wait" : "wake; wait     ", count[m],
               samples[m][count[m] / 2], samples[m][count[m] * 9 / 10], samples[m][count[m] * 99 / 100], samples[m][count[m] - 1]);
    }
    return 0;
}
