/// Asks the OS scheduler that the calling thread, when woken, run at once even when every
/// processor is busy with CPU-bound work, instead of waiting out the running task's time slice.
///
/// For the library's kernel-wait threads (``KernelWaitThread``: the signal thread, channel
/// doorbells, the deadline timer), which sleep nearly all the time and run for microseconds when
/// another process rings them: a ring is worth nothing if it is delivered a slice later.
///
/// - Linux (`PromptWakeUps+Linux.swift`): EEVDF's per-task slice (Linux 6.12 and later;
///   sched_setattr(2) with `sched_runtime` on a `SCHED_OTHER` thread, no privilege needed): a
///   slice of 0.1 ms, shorter than a CPU-bound task's (0.75 ms times 1 + log2 of the processor
///   count), lets the woken thread's wake-up preempt that task, which the scheduler otherwise
///   protects until it has run its whole slice (1.5 ms on a 2-core machine: the tail of every
///   loaded latency in `baton bench`). The thread's nice value and policy are unchanged, so it
///   gets no more processor time than before, only sooner. Older kernels ignore the request.
/// - Apple platforms (`PromptWakeUps+Darwin.swift`): nothing to ask. XNU's timeshare scheduler
///   lowers the priority of a thread by the processor time it used recently
///   (`sched_compute_timeshare_priority` in osfmk/kern/priority.c: base priority minus
///   `sched_usage >> pri_shift`), so a thread that mostly sleeps already preempts a CPU-bound
///   one of the same base priority. (Raising the thread's QoS would also change its energy
///   and priority standing on iOS, which a library should not decide for its app.)
package enum PromptWakeUps {
    /// The slice requested on Linux: the kernel's minimum.
    static let sliceNanoseconds: UInt64 = 100_000

    // `requestForCurrentThread()` (best effort: a refusal changes nothing but latency under
    // load) and `currentSliceNanoseconds` are in the platform files.
}
