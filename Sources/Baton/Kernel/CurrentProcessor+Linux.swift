#if os(Linux)
import CBatonShims

extension CurrentProcessor {
    /// `sched_getcpu()`: the processor's number, or -1.
    static var number: Int32 { baton_linux_current_cpu() }
}
#endif
