import ArgumentParser
import Baton
import BatonCommandSupport
import BatonDatabase
import CBatonShims
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `baton-harness kernel-test ...`: workers for the kernel-layer tests: a process that sleeps on a shared word, one that
/// holds an owner token, one that holds a ``SharedMutex``, one that opens and drops containers.
struct KernelTestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kernel-test",
        abstract: "Test workers for the kernel layer.",
        subcommands: [WaitWord.self, HoldToken.self, HoldMutex.self, QueueAcquire.self, RebuildSignals.self, ChurnContainers.self]
    )

    /// Maps `.baton/<file>` (4 KiB) and sleeps on its first word until it moves or the timeout
    /// passes: prints "waiting <value>", then "woken <value>" or "timed-out".
    struct WaitWord: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "wait-word")
        @OptionGroup var container: ContainerOptions
        @Option var file: String
        @Option(transform: ArgumentCheck.seconds) var timeout: Double = 10

        func run() async throws {
            let container = try container.open()
            let map = try MappedFile(container, relativePath: file, minimumSize: 4096)
            let word = map.pointer.assumingMemoryBound(to: UInt32.self)
            let seen = baton_load32(word)
            emit("waiting \(seen)")
            let deadline = try Deadline.seconds(timeout)
            while baton_load32(word) == seen {
                if AddressWait.wait(on: word, expecting: seen, timeoutNanoseconds: deadline.sleepTimeout) == .timedOut {
                    emit("timed-out")
                    return
                }
            }
            emit("woken \(baton_load32(word))")
        }
    }

    /// Makes this process rebuild the signal table `rounds` times, as fast as it can: each round
    /// cuts the last byte off `.baton/signals` (slot padding: nothing is lost) and reads a state,
    /// which finds the table truncated, extends it and rebuilds it (another program's truncation,
    /// as the signal table handles it). Prints "ready" first and "rebuilt <rounds>" at the end.
    struct RebuildSignals: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "rebuild-signals")
        @OptionGroup var container: ContainerOptions
        @Option var rounds: Int = 1000

        func run() async throws {
            let container = try container.open()
            let signals = try container.signals
            _ = try signals.state(of: "rebuilder")
            let path = container.absolutePath("signals")
            emit("ready")
            for _ in 0..<rounds {
                guard truncate(path, off_t(1_052_672 - 1)) == 0 else { throw TestFailureText("truncate \(path): errno \(errno)") }
                _ = try signals.state(of: "rebuilder")
            }
            emit("rebuilt \(rounds)")
        }
    }

    /// Opens and drops `rounds` container objects of one directory, using each one's signals
    /// (an observation, a post, its delivery, and a `wait(for:)` ended by a post), presence (a
    /// registration dropped without `release()`, a listing) and a channel (a receive that times
    /// out on the doorbell thread, a send and a receive), then waits (at most `timeout`) for
    /// every container object to be freed and for the threads and descriptors to come back to
    /// what they were after one warm-up round (process-wide threads start there). Prints
    /// "baseline threads=T fds=F maps=M", then "after threads=T fds=F maps=M alive=A" (`threads`:
    /// Baton's threads; `maps`: mappings of files in the container; `alive`: container objects
    /// not freed).
    struct ChurnContainers: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "churn-containers")
        @OptionGroup var container: ContainerOptions
        @Option var rounds: Int = 50
        @Option(help: "Comma-separated parts to use: signals, presence, channel, rendezvous.") var parts: String = "signals,presence,channel,rendezvous"
        @Option(transform: ArgumentCheck.seconds) var timeout: Double = 10

        private final class WeakContainer {
            weak var container: SharedContainer?
            init(_ container: SharedContainer) { self.container = container }
        }

        func run() async throws {
            let parts = Set(parts.split(separator: ",").map(String.init))
            let path = URL(fileURLWithPath: try container.open().path).resolvingSymlinksInPath().path
            _ = try await round(parts) // warm-up: process-wide threads and files
            let baseline = Self.usage(path)
            emit("baseline threads=\(baseline.threads) fds=\(baseline.fds) maps=\(baseline.maps)")
            var dropped: [WeakContainer] = []
            for _ in 0..<rounds { dropped.append(try await round(parts)) }
            let deadline = ContinuousClock.now + .seconds(timeout)
            var now = Self.usage(path)
            var alive = dropped.filter { $0.container != nil }.count
            // The threads end on their own once their container is gone: look again until they
            // did, or until the deadline.
            while alive > 0 || now.threads > baseline.threads || now.fds > baseline.fds || now.maps > baseline.maps,
                  ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(10))
                now = Self.usage(path)
                alive = dropped.filter { $0.container != nil }.count
            }
            emit("after threads=\(now.threads) fds=\(now.fds) maps=\(now.maps) alive=\(alive)")
        }

        /// Opens a container object, uses `parts` of it, and returns a weak reference to it.
        private func round(_ parts: Set<String>) async throws -> WeakContainer {
            let container = try self.container.open()
            if parts.contains("signals") {
                let signals = try container.signals
                let observation = try signals.observe("churn")
                try signals.post("churn", state: 1)
                _ = try await observation.next(deadline: .after(.seconds(10)))
                // Posted until the wait (registered once its task runs) sees a post.
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { _ = try await signals.wait(for: "churn-wait", deadline: .after(.seconds(10))) }
                    group.addTask {
                        while !Task.isCancelled {
                            try signals.post("churn-wait")
                            try await Task.sleep(for: .milliseconds(1))
                        }
                    }
                    try await group.next()
                    group.cancelAll()
                }
            }
            if parts.contains("presence") {
                _ = try container.presence.register(kind: "churn") // dropped without release()
                _ = try container.presence.list()
            }
            if parts.contains("channel") {
                let channel = try SharedChannel<Int>(container, name: "churn", capacity: .bounded(4))
                _ = try? await channel.receive(deadline: .after(.milliseconds(5)))
                try await channel.send(1)
                _ = try await channel.receive(deadline: .after(.seconds(10)))
            }
            if parts.contains("rendezvous") {
                // A rendezvous takes a waiter record of the container's waiter table.
                let channel = try SharedChannel<Int>(container, name: "churn-rendezvous", capacity: .rendezvous)
                async let received = channel.receive(deadline: .after(.seconds(10)))
                try await channel.send(1, deadline: .after(.seconds(10)))
                _ = try await received
            }
            return WeakContainer(container)
        }

        /// This process's Baton threads (named `baton-…`; the runtime's pool grows as it likes),
        /// open descriptors, and mappings of files under `path`.
        private static func usage(_ path: String) -> (threads: Int, fds: Int, maps: Int) {
            // (Read to the end: /proc files report a size of 0.)
            func read(_ path: String) -> String {
                FileHandle(forReadingAtPath: path).map { String(decoding: $0.readDataToEndOfFile(), as: UTF8.self) } ?? ""
            }
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
            let threads = tasks.filter { read("/proc/self/task/\($0)/comm").hasPrefix("baton-") }.count
            // (The listing's own descriptor is counted each time alike.)
            let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
            let mapped = read("/proc/self/maps").split(separator: "\n").filter { $0.contains(path + "/") }.count
            return (threads, fds, mapped)
        }
    }

    /// Takes this process's owner token, prints "token <hex>", and sleeps until killed.
    struct HoldToken: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "hold-token")
        @OptionGroup var container: ContainerOptions

        func run() async throws {
            let container = try container.open()
            emit("token \(String(try container.owners.current(), radix: 16))")
            while true { try await Task.sleep(for: .seconds(3600)) }
        }
    }

    /// Takes the ``SharedMutex`` at the start of `.baton/<file>`, prints "held <token hex>", and
    /// sleeps holding it until killed.
    struct HoldMutex: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "hold-mutex")
        @OptionGroup var container: ContainerOptions
        @Option var file: String

        func run() async throws {
            let container = try container.open()
            let map = try MappedFile(container, relativePath: file, minimumSize: 4096)
            let token = try container.owners.enter()
            guard SharedMutex(map.pointer).lock(as: token, tokens: container.owners, deadline: .after(.seconds(10)), keepAlive: map) != nil else {
                throw ExitCode(3)
            }
            emit("held \(String(token, radix: 16))")
            while true { try await Task.sleep(for: .seconds(3600)) }
        }
    }

    /// Prints "started", waits in the writer queue `.baton/<name>` for at most `timeout`, then
    /// prints "acquired" (and holds it until killed) or "busy".
    struct QueueAcquire: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "queue-acquire")
        @OptionGroup var container: ContainerOptions
        @Option var name: String
        @Option(transform: ArgumentCheck.seconds) var timeout: Double = 10

        func run() async throws {
            let queue = try TicketLock(try container.open(), name: name)
            emit("started")
            do {
                _ = try queue.acquire(deadline: try .seconds(timeout), interruption: { nil })
            } catch let error as BatonError where error.code == .busy {
                emit("busy")
                return
            }
            emit("acquired")
            while true { try await Task.sleep(for: .seconds(3600)) }
        }
    }
}
