// The mapping guard: a SIGBUS handler that repairs one kind of fault, a shared mapping of a
// Baton file that another program cut short. Touching a MAP_SHARED page past the end of its
// file raises SIGBUS (POSIX mmap: "References within the address range starting at pa and
// continuing for len bytes to whole pages following the end of an object shall result in
// delivery of a SIGBUS signal"), on Linux and on Apple platforms alike. Baton never shrinks a
// mapped file, so such a fault is always damage done from outside: the handler extends the
// file back to the mapping's length (zeros, which Baton's own checks then see and report) and
// returns, and the faulting access runs again and succeeds. Any other SIGBUS (an address that
// is not a registered mapping, a file that is not short, an extension that fails) goes to the
// handler that was installed before, or to the default action (the process dies as before).
//
// Only async-signal-safe calls run in the handler (fstat, ftruncate, sigaction; POSIX
// "Signal Concepts", 2.4.3), over a fixed table written with atomics.
#include "CBatonShims.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#define BATON_GUARD_SLOTS 1024

typedef struct {
    _Atomic(uintptr_t) start;   // 0: free; 1: being filled
    _Atomic(uintptr_t) length;
    _Atomic(int) fd;
    _Atomic(int64_t) offset;    // the file offset the mapping starts at
    _Atomic(uint64_t) repairs;  // faults repaired in this slot since it was registered
} baton_guard_slot;

static baton_guard_slot baton_guard_slots[BATON_GUARD_SLOTS];
static struct sigaction baton_guard_previous;
static atomic_int baton_guard_state;   // 0: not installed, 1: installing, 2: installed
static _Atomic(uint64_t) baton_guard_repair_count;

static void baton_guard_handler(int signal_number, siginfo_t *info, void *context) {
    uintptr_t address = (uintptr_t)info->si_addr;
    for (int index = 0; index < BATON_GUARD_SLOTS; index++) {
        uintptr_t start = atomic_load(&baton_guard_slots[index].start);
        if (start <= 1) continue;
        uintptr_t length = atomic_load(&baton_guard_slots[index].length);
        if (address < start || address - start >= length) continue;
        int fd = atomic_load(&baton_guard_slots[index].fd);
        off_t end = (off_t)atomic_load(&baton_guard_slots[index].offset) + (off_t)length;
        struct stat info_of_file;
        if (fstat(fd, &info_of_file) == 0 && info_of_file.st_size < end
            && ftruncate(fd, end) == 0) {
            atomic_fetch_add(&baton_guard_slots[index].repairs, 1);
            atomic_fetch_add(&baton_guard_repair_count, 1);
            return;   // the access runs again, now within the file
        }
        break;
    }
    // Not a fault the guard repairs.
    if ((baton_guard_previous.sa_flags & SA_SIGINFO) && baton_guard_previous.sa_sigaction != NULL) {
        baton_guard_previous.sa_sigaction(signal_number, info, context);
        return;
    }
    if (baton_guard_previous.sa_handler != SIG_DFL && baton_guard_previous.sa_handler != SIG_IGN
        && !(baton_guard_previous.sa_flags & SA_SIGINFO)) {
        baton_guard_previous.sa_handler(signal_number);
        return;
    }
    struct sigaction fallback;
    memset(&fallback, 0, sizeof fallback);
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    sigaction(SIGBUS, &fallback, NULL);   // returning re-raises the fault with the default action
}

static void baton_guard_install(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&baton_guard_state, &expected, 1)) {
        while (atomic_load(&baton_guard_state) != 2) {}
        return;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = baton_guard_handler;
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &baton_guard_previous);
    atomic_store(&baton_guard_state, 2);
}

int baton_mapping_guard_register(void *start, size_t length, int fd) {
    return baton_mapping_guard_register_at(start, length, fd, 0);
}

int baton_mapping_guard_register_at(void *start, size_t length, int fd, int64_t offset) {
    if (atomic_load(&baton_guard_state) != 2) baton_guard_install();
    for (int index = 0; index < BATON_GUARD_SLOTS; index++) {
        uintptr_t free_slot = 0;
        if (atomic_compare_exchange_strong(&baton_guard_slots[index].start, &free_slot, 1)) {
            atomic_store(&baton_guard_slots[index].length, (uintptr_t)length);
            atomic_store(&baton_guard_slots[index].fd, fd);
            atomic_store(&baton_guard_slots[index].offset, offset);
            atomic_store(&baton_guard_slots[index].repairs, 0);   // counted for this mapping
            atomic_store(&baton_guard_slots[index].start, (uintptr_t)start);
            return index;
        }
    }
    return -1;   // full: this mapping is not guarded
}

void baton_mapping_guard_unregister(int slot) {
    if (slot < 0 || slot >= BATON_GUARD_SLOTS) return;
    atomic_store(&baton_guard_slots[slot].start, 0);
}

uint64_t baton_mapping_guard_repairs(void) { return atomic_load(&baton_guard_repair_count); }

uint64_t baton_mapping_guard_slot_repairs(int slot) {
    if (slot < 0 || slot >= BATON_GUARD_SLOTS) return 0;
    return atomic_load(&baton_guard_slots[slot].repairs);
}
