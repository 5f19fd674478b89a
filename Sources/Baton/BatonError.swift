import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The error every Baton API throws.
///
/// Match on ``code`` in a `catch`:
///
/// ```swift
/// do { try container.signals.post("ping") }
/// catch let error as BatonError where error.code == .invalidName { ... }
/// ```
///
/// The ``message`` says what was wrong and what to do about it. Values and payloads are never
/// printed; ``cause`` carries the underlying failure (a system call and its errno, a SQLite code).
public struct BatonError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is. New codes may be added in any release; match the ones you
    /// handle and keep a default.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A stable, machine-readable identifier such as `"busy"`.
        public let rawValue: String
        /// Creates a code. Modules built on Baton add their own codes in extensions.
        public init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }
    }

    /// What kind of failure this is.
    public var code: Code
    /// A human explanation: what was wrong and what to do.
    public var message: String
    /// The underlying failure, when there is one (``SystemCallError``, a SQLite error, ...).
    public var cause: (any Error & Sendable)?
    /// Where the error was thrown.
    public var location: SourceLocation

    /// Where in Baton's sources an error was thrown.
    public struct SourceLocation: Sendable, Hashable, CustomStringConvertible {
        public var file: String
        public var line: Int
        public var description: String { "\(file):\(line)" }
    }

    /// Creates an error.
    public init(
        _ code: Code,
        _ message: String,
        cause: (any Error & Sendable)? = nil,
        file: String = #fileID,
        line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.cause = cause
        self.location = SourceLocation(file: file, line: line)
    }

    public var description: String {
        var text = "\(code): \(message)"
        if let cause { text += " (cause: \(cause))" }
        return text
    }
}

extension BatonError.Code {
    /// A path that must exist does not.
    public static let notFound = Self("notFound")
    /// A path that must be a directory is something else.
    public static let notADirectory = Self("notADirectory")
    /// The process may not write where it must.
    public static let notWritable = Self("notWritable")
    /// The container or one of Baton's files belongs to another user.
    public static let ownedByAnotherUser = Self("ownedByAnotherUser")
    /// A path is longer than the system allows.
    public static let pathTooLong = Self("pathTooLong")
    /// The file system does not support `flock(2)` (some network file systems).
    public static let lockingNotSupported = Self("lockingNotSupported")
    /// A name (signal, role, suite, channel...) is empty, too long, or has a path separator or `..`.
    public static let invalidName = Self("invalidName")
    /// An argument is out of its documented range.
    public static let invalidArgument = Self("invalidArgument")
    /// A wait reached its deadline.
    public static let timedOut = Self("timedOut")
    /// A wait was cancelled.
    public static let cancelled = Self("cancelled")
    /// A fixed-size table is full.
    public static let capacityExceeded = Self("capacityExceeded")
    /// A file's content failed its checksum or format check.
    public static let corrupt = Self("corrupt")
    /// The process is suspended: no lock may be taken until it resumes.
    public static let suspended = Self("suspended")
    /// A system call failed; ``BatonError/cause`` is a ``SystemCallError``.
    public static let systemCallFailed = Self("systemCallFailed")
    /// A symbolic link was found where Baton requires a real file or directory.
    public static let symbolicLink = Self("symbolicLink")
    /// Something other than a regular file (a FIFO, a directory, a device, a socket) was found
    /// where Baton requires a regular file.
    public static let notARegularFile = Self("notARegularFile")
    /// The container, one of Baton's files or the database may be written by other users (group
    /// or others write permission), so they could forge what Baton reads.
    public static let writableByOthers = Self("writableByOthers")
}

/// A failed system call: its name and `errno`.
public struct SystemCallError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The system call, such as `"flock"`.
    public var call: String
    /// The `errno` it set.
    public var errno: Int32

    public init(call: String, errno: Int32) {
        self.call = call
        self.errno = errno
    }

    public var description: String {
        "\(call)() failed: \(String(cString: strerror(errno))) (errno \(errno))"
    }
}

extension BatonError {
    /// Wraps a failed system call, adding what Baton was doing.
    static func system(
        _ error: SystemCallError,
        _ doing: String,
        file: String = #fileID,
        line: Int = #line
    ) -> BatonError {
        let code: Code
        switch error.errno {
        case ENOENT: code = .notFound
        case ENOTDIR: code = .notADirectory
        case EACCES, EPERM, EROFS: code = .notWritable
        case ENAMETOOLONG: code = .pathTooLong
        case ELOOP: code = .symbolicLink
        case EISDIR, ENXIO: code = .notARegularFile
        case ENOLCK, EOPNOTSUPP: code = .lockingNotSupported
        default: code = .systemCallFailed
        }
        return BatonError(code, "\(doing) failed: \(error)", cause: error, file: file, line: line)
    }
}
