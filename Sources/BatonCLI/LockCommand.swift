import ArgumentParser
import Baton
import BatonCommandSupport

struct LockCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lock",
        abstract: "Take a cross-process file lock under the container's .baton directory.",
        subcommands: [Hold.self]
    )

    struct Hold: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Wait for the lock, print 'acquired', hold it until SIGTERM or SIGINT. Exits 3 on timeout.")
        @OptionGroup var options: ContainerOptions
        @Argument(help: "The lock file name, relative to .baton (e.g. locks/demo.lock).") var name: String
        @Flag(help: "Take a shared lock instead of an exclusive one.") var shared = false
        @Option(help: "Give up after this many seconds.", transform: ArgumentCheck.seconds) var timeout: Double?
        @Option(help: "Release after this many seconds instead of waiting for a signal.", transform: ArgumentCheck.seconds) var hold: Double?

        func run() async throws {
            TerminationSignal.prepare()
            let lock = try FileLock(try options.open(), name: name)
            let held: HeldFileLock
            do {
                held = try await lock.lock(shared ? .shared : .exclusive, deadline: try .option(timeout))
            } catch let error as BatonError where error.code == .timedOut {
                emit("timeout")
                throw CommandOutcome.timedOut("the lock \(name) is held by another process", after: timeout)
            }
            emit("acquired")
            if let hold {
                try await Task.sleep(for: .milliseconds(Int(hold * 1000)))
            } else {
                await TerminationSignal.wait()
            }
            held.release()
            emit("released")
        }
    }
}
