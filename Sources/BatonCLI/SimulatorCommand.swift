import ArgumentParser
import Baton
import BatonCommandSupport
import BatonSimulator

/// `baton sim-app`: the app process of the simulator (internal).
struct SimulatorAppCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sim-app", abstract: "The simulated app process (internal: driven by the simulator over stdin/stdout).", shouldDisplay: false)
    @OptionGroup var options: ContainerOptions
    @Option(help: "The loopback message server's port.") var port: UInt16
    @Flag(help: "Misbehave: keep every lock when told it will be suspended (tests the 0xDEAD10CC rule).") var keepLocksWhenSuspended = false

    func run() async throws {
        try await SimulatedApp(container: try options.open(), port: port, keepsLocksWhenSuspended: keepLocksWhenSuspended).run()
    }
}

/// `baton sim-extension`: an extension process of the simulator (internal).
struct SimulatorExtensionCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sim-extension", abstract: "A simulated extension process (internal: driven by the simulator over stdin/stdout).", shouldDisplay: false)
    @OptionGroup var options: ContainerOptions
    @Option(help: "The loopback message server's port.") var port: UInt16

    func run() async throws {
        try await SimulatedExtension(container: try options.open(), port: port).run()
    }
}
