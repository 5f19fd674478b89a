// Apple-only Foundation API that swift-corelibs-foundation (Linux) lacks, for type-checking
// Baton's Apple code on Linux. scripts/check-apple.sh imports it implicitly into every checked
// file (-import-module), as if Foundation had it. Never linked or run. Only what Baton calls,
// with the Swift declarations Apple documents.
import Foundation

/// Apple: `typealias NSErrorPointer = AutoreleasingUnsafeMutablePointer<NSError?>?`
/// (developer.apple.com/documentation/foundation/nserrorpointer). Linux has no
/// AutoreleasingUnsafeMutablePointer; an `&error` argument type-checks against either.
public typealias NSErrorPointer = UnsafeMutablePointer<NSError?>?

/// developer.apple.com/documentation/foundation/nsfilepresenter
public protocol NSFilePresenter: NSObjectProtocol {}

/// developer.apple.com/documentation/foundation/nsfilecoordinator
open class NSFileCoordinator: NSObject {
    /// developer.apple.com/documentation/foundation/nsfilecoordinator/init(filepresenter:)
    public init(filePresenter filePresenterOrNil: (any NSFilePresenter)?) {}

    /// developer.apple.com/documentation/foundation/nsfilecoordinator/readingoptions
    public struct ReadingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        /// developer.apple.com/documentation/foundation/nsfilecoordinator/readingoptions/withoutchanges
        public static let withoutChanges = ReadingOptions(rawValue: 1 << 0)
    }

    /// developer.apple.com/documentation/foundation/nsfilecoordinator/writingoptions
    public struct WritingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        /// developer.apple.com/documentation/foundation/nsfilecoordinator/writingoptions/formerging
        public static let forMerging = WritingOptions(rawValue: 1 << 1)
    }

    /// developer.apple.com/documentation/foundation/nsfilecoordinator/coordinate(readingitemat:options:error:byaccessor:)
    open func coordinate(readingItemAt url: URL, options: ReadingOptions = [], error outError: NSErrorPointer, byAccessor reader: (URL) -> Void) {}

    /// developer.apple.com/documentation/foundation/nsfilecoordinator/coordinate(writingitemat:options:error:byaccessor:)
    open func coordinate(writingItemAt url: URL, options: WritingOptions = [], error outError: NSErrorPointer, byAccessor writer: (URL) -> Void) {}
}

extension FileManager {
    /// developer.apple.com/documentation/foundation/filemanager/containerurl(forsecurityapplicationgroupidentifier:)
    public func containerURL(forSecurityApplicationGroupIdentifier groupIdentifier: String) -> URL? { nil }
}
