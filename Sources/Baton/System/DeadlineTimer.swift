/// The process's deadline timer: a ``KernelWaitThread`` with no source, which sleeps on its
/// private word until the nearest deadline and calls the callbacks that are due there, so that a
/// wait with a deadline (``EventCounter``, the redelivery of close events in `FileEvents+Linux`)
/// costs an insertion instead of a sleeping child task. A later deadline than the one the thread
/// sleeps until costs no system call.
///
/// `DeadlineTimer.shared.schedule(at:_:)` returns an id for `DeadlineTimer.shared.cancel(_:)`.
enum DeadlineTimer {
    static let shared = KernelWaitThread(name: "baton-timer")
}
