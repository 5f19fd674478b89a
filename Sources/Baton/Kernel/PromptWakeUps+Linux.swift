#if os(Linux)
import CBatonShims

extension PromptWakeUps {
    /// Asks for prompt wake-ups for the calling thread: sched_setattr(2) with a 0.1 ms
    /// `sched_runtime` (the shim keeps the nice value and policy; a refusal is ignored).
    package static func requestForCurrentThread() {
        _ = baton_linux_request_short_slice(sliceNanoseconds)
    }

    /// The calling thread's time slice as sched_getattr(2) reports it (the default one when
    /// none was requested; 0 when the call fails).
    static var currentSliceNanoseconds: UInt64 { baton_linux_current_slice() }
}
#endif
