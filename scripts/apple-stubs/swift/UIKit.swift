// A stand-in for Apple's UIKit, for type-checking Baton's UIKit adapters and the example on
// Linux. Never linked or run. Only what Baton and Examples/ call, with the Swift declarations
// Apple documents (developer.apple.com/documentation/uikit/...). On Apple platforms UIKit
// re-exports Foundation.
@_exported import Foundation

/// developer.apple.com/documentation/uikit/uibackgroundtaskidentifier
/// (`struct UIBackgroundTaskIdentifier`, RawRepresentable over Int, `static let invalid`).
public struct UIBackgroundTaskIdentifier: RawRepresentable, Hashable, Sendable {
    public var rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }
    /// developer.apple.com/documentation/uikit/uibackgroundtaskidentifier/invalid
    public static let invalid = UIBackgroundTaskIdentifier(rawValue: 0)
}

/// developer.apple.com/documentation/uikit/uiresponder
@MainActor open class UIResponder: NSObject {}

/// developer.apple.com/documentation/uikit/uiapplication (`@MainActor class UIApplication`).
@MainActor open class UIApplication: UIResponder {
    /// developer.apple.com/documentation/uikit/uiapplication/shared
    /// (`class var shared: UIApplication { get }`, unavailable to app extensions).
    @available(iOSApplicationExtension, unavailable)
    public class var shared: UIApplication { fatalError("type-check stub") }

    /// developer.apple.com/documentation/uikit/uiapplication/beginbackgroundtask(withname:expirationhandler:)
    nonisolated public func beginBackgroundTask(
        withName taskName: String?,
        expirationHandler handler: (@MainActor @Sendable () -> Void)? = nil
    ) -> UIBackgroundTaskIdentifier { fatalError("type-check stub") }

    /// developer.apple.com/documentation/uikit/uiapplication/endbackgroundtask(_:)
    nonisolated public func endBackgroundTask(_ identifier: UIBackgroundTaskIdentifier) { fatalError("type-check stub") }

    /// developer.apple.com/documentation/uikit/uiapplication/didenterbackgroundnotification
    nonisolated public static let didEnterBackgroundNotification = Notification.Name("UIApplicationDidEnterBackgroundNotification")
    /// developer.apple.com/documentation/uikit/uiapplication/willenterforegroundnotification
    nonisolated public static let willEnterForegroundNotification = Notification.Name("UIApplicationWillEnterForegroundNotification")
}

/// developer.apple.com/documentation/uikit/uiscene (`@MainActor class UIScene: UIResponder`).
@MainActor open class UIScene: UIResponder {
    /// developer.apple.com/documentation/uikit/uiscene/didenterbackgroundnotification
    nonisolated public static let didEnterBackgroundNotification = Notification.Name("UISceneDidEnterBackgroundNotification")
    /// developer.apple.com/documentation/uikit/uiscene/willenterforegroundnotification
    nonisolated public static let willEnterForegroundNotification = Notification.Name("UISceneWillEnterForegroundNotification")
}
