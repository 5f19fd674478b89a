import ArgumentParser
import Baton
import BatonCommandSupport

struct SignalCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "signal",
        abstract: "Post and watch cross-process signals.",
        subcommands: [Post.self, Watch.self]
    )

    struct Post: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Ring a signal, optionally setting its state.")
        @OptionGroup var options: ContainerOptions
        @Argument(help: "The signal name (1-128 bytes).") var name: String
        @Option(parsing: .unconditional, help: "A state to set before ringing: a whole number from 0 to 18446744073709551615.", transform: ArgumentCheck.state)
        var state: UInt64?

        func run() async throws {
            let signals = try options.open().signals
            if let state { try signals.post(name, state: state) } else { try signals.post(name) }
        }
    }

    struct Watch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print one line per delivery: NAME state=N. Exits 0 after --count deliveries, 3 on timeout.")
        @OptionGroup var options: ContainerOptions
        @Argument(help: "The signal name.") var name: String
        @Option(help: "Exit after this many deliveries.", transform: ArgumentCheck.count) var count: Int?
        @Option(help: "Exit with status 3 after this many seconds without finishing.", transform: ArgumentCheck.seconds) var timeout: Double?
        @Flag(help: "Print 'ready' once observing (for scripts and tests).") var announce = false

        func run() async throws {
            let signals = try options.open().signals
            let observation = try signals.observe(name)
            try await watchLoop(
                announce: announce, count: count, timeout: timeout,
                timedOut: { "signal \(name) delivered \($0) times" },
                next: { try await observation.next(deadline: $0) },
                show: { emit("\($0.name) state=\($0.state)") })
        }
    }
}
