import CBatonShims

/// Starts a detached OS thread for a loop that blocks in the kernel (a file-event read, a wait on
/// a shared word, a pipe or socket read). The library uses one per kind of kernel wait per
/// process; the simulator one per child pipe and server connection.
package enum KernelThread {
    private final class Box {
        let body: () -> Void
        let name: String
        init(_ body: @escaping () -> Void, name: String) { self.body = body; self.name = name }
    }

    package static func spawn(name: String, _ body: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(Box(body, name: name)).toOpaque()
        let result = baton_spawn_detached_thread({ argument in
            let box = Unmanaged<Box>.fromOpaque(argument!).takeRetainedValue()
            baton_set_thread_name(box.name)
            box.body()
            return nil
        }, box)
        precondition(result == 0, "pthread_create failed with \(result)")
    }
}
