#if canImport(Darwin)
extension PromptWakeUps {
    /// Nothing to ask: XNU's timeshare priority decay already lets a thread that mostly sleeps
    /// preempt a CPU-bound one (see ``PromptWakeUps``).
    package static func requestForCurrentThread() {}

    /// No per-thread slice on Apple platforms.
    static var currentSliceNanoseconds: UInt64 { 0 }
}
#endif
