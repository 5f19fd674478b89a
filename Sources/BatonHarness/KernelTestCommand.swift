import ArgumentParser
import Baton
import BatonCommandSupport
import BatonDatabase
import CBatonShims
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `baton-harness kernel-test ...`: workers for the kernel-layer tests: a process that sleeps on a shared word, one that
/// holds an owner token, one that holds a ``SharedMutex``.
struct KernelTestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kernel-test",
        abstract: "Test workers for the kernel layer.",
        subcommands: [WaitWord.self, HoldToken.self, HoldMutex.self, QueueAcquire.self, RebuildSignals.self]
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
            let deadline = try Deadline.seconds(timeout).instant
            while baton_load32(word) == seen {
                if AddressWait.wait(on: word, expecting: seen, timeoutNanoseconds: AddressWait.timeout(until: deadline)) == .timedOut {
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
            guard SharedMutex(map.pointer).lock(as: token, tokens: container.owners, deadline: .now + .seconds(10), keepAlive: map) != nil else {
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
