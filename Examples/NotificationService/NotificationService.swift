// A notification service extension that shares the app's Baton container. Not a SwiftPM
// target: add this file to an Xcode Notification Service Extension target with the same App
// Group entitlement as the app. Type-checked by scripts/check-apple.sh.
import Baton
import Foundation
import UserNotifications

final class NotificationService: UNNotificationServiceExtension, @unchecked Sendable {
    // @unchecked: iOS calls didReceive and serviceExtensionTimeWillExpire on one thread, and
    // the stored handler is touched only there.
    private var contentHandler: ((UNNotificationContent) -> Void)?
    private var bestAttempt: UNMutableNotificationContent?
    private let lifecycle: AppLifecycle? = {
        guard let url = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: "group.com.example.baton") else { return nil }
        return (try? SharedContainer(at: url)).map { AppLifecycle(container: $0) }
    }()

    override func didReceive(_ request: UNNotificationRequest, withContentHandler contentHandler: @escaping (UNNotificationContent) -> Void) {
        self.contentHandler = contentHandler
        let content = UNMutableNotificationContent()
        content.title = request.content.title
        content.body = request.content.body
        bestAttempt = content
        guard let lifecycle else { return contentHandler(content) }
        let deliver = UncheckedHandler(contentHandler)
        Task {
            // iOS reuses extension processes: undo the suspension of an earlier request.
            await lifecycle.extensionWillHandleRequest()
            do {
                // Tell the app (if it runs) that a message arrived; it re-reads the shared state.
                try lifecycle.container.signals.post("messages")
                content.body = request.content.body + " ✓"
            } catch {
                content.body = request.content.body
            }
            await lifecycle.extensionTimeWillExpire()
            deliver.call(content)
        }
    }

    override func serviceExtensionTimeWillExpire() {
        // Release every lock before iOS freezes the process, then deliver what we have.
        let semaphore = DispatchSemaphore(value: 0)
        let lifecycle = self.lifecycle
        Task {
            await lifecycle?.extensionTimeWillExpire()
            semaphore.signal()
        }
        _ = semaphore.wait(timeout: .now() + .milliseconds(500))
        if let contentHandler, let bestAttempt { contentHandler(bestAttempt) }
    }
}

/// Carries the content handler into the task (iOS accepts the call from any thread).
private struct UncheckedHandler: @unchecked Sendable {
    let handler: (UNNotificationContent) -> Void
    init(_ handler: @escaping (UNNotificationContent) -> Void) { self.handler = handler }
    func call(_ content: UNNotificationContent) { handler(content) }
}
