import ArgumentParser
import Baton
import Logging

/// `--container DIR`, defaulting to `$BATON_CONTAINER`.
package struct ContainerOptions: ParsableArguments {
    @Option(name: .long, help: "The shared container directory (default: $BATON_CONTAINER).")
    package var container: String?
    @Flag(help: "Accept a container or database that another user owns or may write (refused by default: that user could forge what Baton reads).")
    package var trustOtherUsers = false
    @Flag(help: "Print on standard error what Baton repairs or decides on its own: recoveries, take-overs, overtaken holders, rebuilt tables, skipped dead tickets, refused stale epochs.")
    package var verbose = false

    package init() {}

    package func open() throws -> SharedContainer {
        guard let path = container ?? environment("BATON_CONTAINER") else {
            throw ValidationError("no container: pass --container DIR or set BATON_CONTAINER")
        }
        var logger: Logger?
        if verbose {
            var verboseLogger = Logger(label: "baton") { StreamLogHandler.standardError(label: $0) }
            verboseLogger.logLevel = .notice
            logger = verboseLogger
        }
        return try SharedContainer(path: path, options: SharedContainer.Options(trustsOtherUsers: trustOtherUsers), logger: logger)
    }
}
