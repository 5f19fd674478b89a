import ArgumentParser
import Baton
import BatonDatabase

/// `--database PATH`, defaulting to `<container>/baton-inbox.sqlite`.
package struct InboxOptions: ParsableArguments {
    @OptionGroup package var container: ContainerOptions
    @Option(help: "The inbox database (default: <container>/baton-inbox.sqlite).") package var database: String?

    package init() {}

    package func open(configuration: InboxConfiguration = InboxConfiguration()) async throws -> Inbox {
        try await Inbox.open(container: try container.open(), path: database, configuration: configuration)
    }
}
