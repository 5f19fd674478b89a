#if canImport(Darwin)
import CBatonShims

extension CurrentProcessor {
    /// `pthread_cpu_number_np`: the processor's number, or -1.
    static var number: Int32 { baton_darwin_current_cpu() }
}
#endif
