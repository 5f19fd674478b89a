import ArgumentParser
import Baton
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `--suite NAME` with the container options: the defaults suite a command reads or writes.
package struct DefaultsSuiteOptions: ParsableArguments {
    @OptionGroup package var container: ContainerOptions
    @Option(help: "The suite: a group of keys with its own files.") package var suite = "standard"

    /// Whether the suite has files yet, checked without creating anything (reading a suite
    /// that was never written must not create it).
    package init() {}

    package func exists() throws -> Bool {
        let container = try self.container.open()
        try SharedContainer.validateName(suite, what: "a defaults suite name")
        var info = stat()
        return lstat(container.batonPath + "/defaults/\(suite).meta", &info) == 0
    }

    package func open() throws -> SharedDefaults {
        let defaults = try SharedDefaults(container.open(), suite: suite)
        let report = defaults.recoveryReport
        if !report.isClean { FileHandleOutput.standardError("warning: defaults suite \(suite): \(report)") }
        return defaults
    }
}
