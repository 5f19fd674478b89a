/// Which processor the calling thread runs on, as a hint for spinning: a waiter that would spin
/// on a word only another process moves does not spin when that process last ran on the
/// waiter's own processor (it cannot be running while the waiter spins there; the spin would
/// only keep it off the processor). The answer may be stale by the time it is read: it steers a
/// heuristic, never correctness.
///
/// `sched_getcpu(3)` on Linux (read from the thread's rseq area or the vDSO, no system call;
/// `CurrentProcessor+Linux.swift`), `pthread_cpu_number_np` on Apple platforms (macOS 11,
/// iOS 14.2; `CurrentProcessor+Darwin.swift`).
package enum CurrentProcessor {
    /// 1 + the number of the processor the calling thread ran on when asked; 0 when the kernel
    /// does not say (0 is what shared hint words hold before anyone wrote them).
    package static var hint: UInt32 {
        let number = number
        return number < 0 ? 0 : UInt32(truncatingIfNeeded: number) &+ 1
    }
}
