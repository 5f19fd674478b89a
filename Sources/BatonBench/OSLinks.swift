import Baton
import BatonCommandSupport
import CBatonHarness
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The operating system's own ways to carry an element from one process to another, measured
/// beside Baton's channels in the same run (`baton bench channels`): a pipe pair, a POSIX
/// message queue pair, and a connected Unix-domain stream socket.
enum OSPrimitive: String, CaseIterable, Sendable {
    case pipe
    case posixMessageQueue = "posix_mq"
    case unixSocket = "unix_socket"
}

/// One end of an ``OSPrimitive`` link carrying fixed-size elements (and one-byte
/// acknowledgements) between the bench process and a worker.
final class OSLink {
    let primitive: OSPrimitive
    private let sendFD: Int32
    private let receiveFD: Int32
    private let ownsDescriptors: Bool
    private let cleanup: () -> Void

    private init(_ primitive: OSPrimitive, send: Int32, receive: Int32, owns: Bool, cleanup: @escaping () -> Void = {}) {
        self.primitive = primitive
        self.sendFD = send
        self.receiveFD = receive
        self.ownsDescriptors = owns
        self.cleanup = cleanup
    }

    deinit {
        if ownsDescriptors {
            switch primitive {
            case .posixMessageQueue:
                _ = baton_bench_mq_close(sendFD)
                _ = baton_bench_mq_close(receiveFD)
            case .pipe, .unixSocket:
                close(sendFD)
                if receiveFD != sendFD { close(receiveFD) }
            }
        }
        cleanup()
    }

    /// Sends exactly `size` bytes (one message for a queue).
    func send(_ bytes: UnsafeRawPointer, _ size: Int) -> Bool {
        switch primitive {
        case .posixMessageQueue:
            return baton_bench_mq_send(sendFD, bytes, size) == 0
        case .pipe, .unixSocket:
            var done = 0
            while done < size {
                let wrote = write(sendFD, bytes + done, size - done)
                if wrote < 0 && errno == EINTR { continue }
                guard wrote > 0 else { return false }
                done += wrote
            }
            return true
        }
    }

    /// Receives exactly `size` bytes (one message for a queue, whose buffer must hold
    /// ``OSLink/messageCapacity`` bytes).
    func receive(_ buffer: UnsafeMutableRawPointer, _ size: Int) -> Bool {
        switch primitive {
        case .posixMessageQueue:
            return baton_bench_mq_receive(receiveFD, buffer, OSLink.messageCapacity) == size
        case .pipe, .unixSocket:
            var done = 0
            while done < size {
                let got = read(receiveFD, buffer + done, size - done)
                if got < 0 && errno == EINTR { continue }
                guard got > 0 else { return false }
                done += got
            }
            return true
        }
    }

    /// The largest message a queue carries (and the receive buffer every user allocates).
    static let messageCapacity = 256
    /// Messages a queue holds (Linux's default `fs.mqueue.msg_max` is 10).
    static let queueDepth = 10

    // MARK: Setting up a link to a worker

    /// The bench side of a link to a worker about to be spawned, and the arguments that tell the
    /// worker how to open its side. The pipe uses the worker's standard input and output.
    static func benchSide(_ primitive: OSPrimitive, container: String) throws -> (prepare: () throws -> Void, arguments: [String], connect: (WorkerProcess) throws -> OSLink) {
        switch primitive {
        case .pipe:
            return ({}, [], { worker in OSLink(.pipe, send: worker.input, receive: worker.output, owns: false) })
        case .posixMessageQueue:
            let base = "/baton-bench-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let toWorker = base + "-a", toBench = base + "-b"
            var queues: [Int32] = []
            return ({
                for name in [toWorker, toBench] {
                    let queue = baton_bench_mq_open(name, 1, queueDepth, messageCapacity)
                    guard queue >= 0 else {
                        throw BatonError(.systemCallFailed, "mq_open \(name) failed: \(String(cString: strerror(errno)))")
                    }
                    queues.append(queue)
                }
            }, [toWorker, toBench], { _ in
                OSLink(.posixMessageQueue, send: queues[0], receive: queues[1], owns: true) {
                    _ = baton_bench_mq_unlink(toWorker)
                    _ = baton_bench_mq_unlink(toBench)
                }
            })
        case .unixSocket:
            let path = container + "/bench-\(UInt32.random(in: 0...UInt32.max)).sock"
            var listener: Int32 = -1
            return ({
                listener = baton_bench_unix_listen(path)
                guard listener >= 0 else {
                    throw BatonError(.systemCallFailed, "listening on \(path) failed: \(String(cString: strerror(errno)))")
                }
            }, [path], { _ in
                let fd = baton_bench_unix_accept(listener)
                close(listener)
                unlink(path)
                guard fd >= 0 else { throw BatonError(.systemCallFailed, "accept failed: \(String(cString: strerror(errno)))") }
                return OSLink(.unixSocket, send: fd, receive: fd, owns: true)
            })
        }
    }

    /// The worker side, from the arguments ``benchSide(_:container:)`` gave.
    static func workerSide(_ primitive: OSPrimitive, arguments: [String]) throws -> OSLink {
        switch primitive {
        case .pipe:
            return OSLink(.pipe, send: 1, receive: 0, owns: false)
        case .posixMessageQueue:
            let fromBench = baton_bench_mq_open(arguments[0], 0, 0, 0)
            let toBench = baton_bench_mq_open(arguments[1], 0, 0, 0)
            guard fromBench >= 0, toBench >= 0 else { throw BatonError(.systemCallFailed, "mq_open in the worker failed") }
            return OSLink(.posixMessageQueue, send: toBench, receive: fromBench, owns: true)
        case .unixSocket:
            let fd = baton_bench_unix_connect(arguments[0])
            guard fd >= 0 else { throw BatonError(.systemCallFailed, "connecting to \(arguments[0]) failed") }
            return OSLink(.unixSocket, send: fd, receive: fd, owns: true)
        }
    }
}
