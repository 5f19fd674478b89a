import ArgumentParser
import Baton

/// `--container DIR`, defaulting to `$BATON_CONTAINER`.
package struct ContainerOptions: ParsableArguments {
    @Option(name: .long, help: "The shared container directory (default: $BATON_CONTAINER).")
    package var container: String?
    @Flag(help: "Accept a container or database that another user owns or may write (refused by default: that user could forge what Baton reads).")
    package var trustOtherUsers = false

    package init() {}

    package func open() throws -> SharedContainer {
        guard let path = container ?? environment("BATON_CONTAINER") else {
            throw ValidationError("no container: pass --container DIR or set BATON_CONTAINER")
        }
        return try SharedContainer(path: path, options: SharedContainer.Options(trustsOtherUsers: trustOtherUsers))
    }
}
