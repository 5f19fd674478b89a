import Baton
import Foundation

/// Where the app and its extension meet: the App Group container.
enum SharedStorage {
    static let appGroup = "group.com.example.baton"

    /// Opens the shared container inside the App Group directory.
    static func openContainer() throws -> SharedContainer {
        guard let url = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: appGroup) else {
            throw BatonError(.notFound, "the App Group \(appGroup) is not in the app's entitlements")
        }
        return try SharedContainer(at: url)
    }
}
