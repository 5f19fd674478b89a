import CBatonShims
/// Starts a detached OS thread for a loop that blocks in the kernel (inotify read, futex wait,
/// a pipe or socket read). The library uses one per kind of kernel wait per process; the
/// simulator one per child pipe and server connection.
package enum KernelThread {
    private final class Box {
        let body: () -> Void
        let name: String
        init(_ body: @escaping () -> Void, name: String) { self.body = body; self.name = name }
    }

    package static func spawn(name: String, _ body: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(Box(body, name: name)).toOpaque()
        var thread = pthread_t()
        let result = pthread_create(&thread, nil, { argument in
            let box = Unmanaged<Box>.fromOpaque(argument!).takeRetainedValue()
            baton_set_thread_name(box.name)
            box.body()
            return nil
        }, box)
        precondition(result == 0, "pthread_create failed with \(result)")
        pthread_detach(thread)
    }
}
