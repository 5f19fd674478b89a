import CBatonShims
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An OS thread for a loop that blocks in the kernel (a pipe or socket read, `accept`,
/// `waitpid`). The simulator uses one per child pipe and one per server connection; they end
/// when their descriptor reaches end of file or is shut down.
enum DetachedThread {
    private final class Box {
        let body: () -> Void
        let name: String
        init(_ body: @escaping () -> Void, name: String) { self.body = body; self.name = name }
    }

    static func spawn(name: String, _ body: @escaping @Sendable () -> Void) {
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
