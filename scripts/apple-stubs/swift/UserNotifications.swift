// A stand-in for Apple's UserNotifications, for type-checking the example notification service
// extension on Linux. Never linked or run. Only what the example uses, with the declarations
// Apple documents (developer.apple.com/documentation/usernotifications/...).
@_exported import Foundation

/// developer.apple.com/documentation/usernotifications/unnotificationcontent
open class UNNotificationContent: NSObject, @unchecked Sendable {
    /// developer.apple.com/documentation/usernotifications/unnotificationcontent/title
    open var title: String { "" }
    /// developer.apple.com/documentation/usernotifications/unnotificationcontent/body
    open var body: String { "" }
    /// developer.apple.com/documentation/usernotifications/unnotificationcontent/userinfo
    open var userInfo: [AnyHashable: Any] { [:] }
}

/// developer.apple.com/documentation/usernotifications/unmutablenotificationcontent
open class UNMutableNotificationContent: UNNotificationContent, @unchecked Sendable {
    public override init() {}
    private var storedTitle = ""
    private var storedBody = ""
    /// developer.apple.com/documentation/usernotifications/unmutablenotificationcontent/title
    open override var title: String { get { storedTitle } set { storedTitle = newValue } }
    /// developer.apple.com/documentation/usernotifications/unmutablenotificationcontent/body
    open override var body: String { get { storedBody } set { storedBody = newValue } }
}

/// developer.apple.com/documentation/usernotifications/unnotificationrequest
open class UNNotificationRequest: NSObject, @unchecked Sendable {
    /// developer.apple.com/documentation/usernotifications/unnotificationrequest/identifier
    open var identifier: String { "" }
    /// developer.apple.com/documentation/usernotifications/unnotificationrequest/content
    open var content: UNNotificationContent { UNNotificationContent() }
}

/// developer.apple.com/documentation/usernotifications/unnotificationserviceextension
open class UNNotificationServiceExtension: NSObject {
    public override init() {}
    /// developer.apple.com/documentation/usernotifications/unnotificationserviceextension/didreceive(_:withcontenthandler:)
    open func didReceive(_ request: UNNotificationRequest, withContentHandler contentHandler: @escaping (UNNotificationContent) -> Void) {}
    /// developer.apple.com/documentation/usernotifications/unnotificationserviceextension/serviceextensiontimewillexpire()
    open func serviceExtensionTimeWillExpire() {}
}
