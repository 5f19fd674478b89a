import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The error every Baton API throws.
///
/// Match a code in a `catch` (the codes are listed in ``BatonErrorCodes``):
///
/// ```swift
/// do { try container.signals.post("ping") }
/// catch BatonError.invalidName { ... }
/// catch let error as BatonError { print(error.code, error.message) }
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

/// Every code Baton throws, in one list.
///
/// Each code is reachable two ways: as a ``BatonError/Code`` (`error.code == .busy`,
/// `switch error.code { case .timedOut: ... }`) and as a pattern on ``BatonError`` itself, so a
/// `catch` can name it without a cast, as GRDB's `catch DatabaseError.SQLITE_BUSY` does:
///
/// ```swift
/// do { _ = try container.role("sync").acquire(deadline: .after(.seconds(1))) }
/// catch BatonError.busy { /* another process holds it */ }
/// catch BatonError.timedOut { /* ... */ }
/// ```
///
/// Every module of this package (`BatonDatabase`, `BatonSimulator`...) throws codes of this
/// list. Modules built on Baton add their own codes in an `extension BatonError.Code`; those
/// match the same way (`catch BatonError.Code.myCode`).
public protocol BatonErrorCodes {}

extension BatonErrorCodes {
    // MARK: Container and files

    /// A path that must exist does not.
    public static var notFound: BatonError.Code { .init("notFound") }
    /// A path that must be a directory is something else.
    public static var notADirectory: BatonError.Code { .init("notADirectory") }
    /// The process may not write where it must.
    public static var notWritable: BatonError.Code { .init("notWritable") }
    /// The container or one of Baton's files belongs to another user.
    public static var ownedByAnotherUser: BatonError.Code { .init("ownedByAnotherUser") }
    /// The container, one of Baton's files or the database may be written by other users (group
    /// or others write permission), so they could forge what Baton reads.
    public static var writableByOthers: BatonError.Code { .init("writableByOthers") }
    /// A path is longer than the system allows.
    public static var pathTooLong: BatonError.Code { .init("pathTooLong") }
    /// A symbolic link was found where Baton requires a real file or directory.
    public static var symbolicLink: BatonError.Code { .init("symbolicLink") }
    /// Something other than a regular file (a FIFO, a directory, a device, a socket) was found
    /// where Baton requires a regular file.
    public static var notARegularFile: BatonError.Code { .init("notARegularFile") }
    /// The file system does not support `flock(2)` (some network file systems).
    public static var lockingNotSupported: BatonError.Code { .init("lockingNotSupported") }
    /// The disk (or the file-size limit) is full; nothing was written.
    public static var noSpace: BatonError.Code { .init("noSpace") }
    /// A file's content failed its checksum or format check.
    public static var corrupt: BatonError.Code { .init("corrupt") }
    /// A file that must be an SQLite database is something else.
    public static var notADatabase: BatonError.Code { .init("notADatabase") }
    /// A system call failed; ``BatonError/cause`` is a ``SystemCallError``.
    public static var systemCallFailed: BatonError.Code { .init("systemCallFailed") }

    // MARK: Arguments

    /// A name (signal, role, suite, channel...) is empty, too long, or has a path separator or `..`.
    public static var invalidName: BatonError.Code { .init("invalidName") }
    /// An argument is out of its documented range.
    public static var invalidArgument: BatonError.Code { .init("invalidArgument") }
    /// A key or value is past the documented limit (keys 1 KiB, values 16 MiB).
    public static var tooLarge: BatonError.Code { .init("tooLarge") }
    /// A stored value is of another type than the one asked for.
    public static var typeMismatch: BatonError.Code { .init("typeMismatch") }
    /// A fixed-size table is full.
    public static var capacityExceeded: BatonError.Code { .init("capacityExceeded") }
    /// The feature is not available on this platform.
    public static var unsupported: BatonError.Code { .init("unsupported") }

    // MARK: Waits, ownership and grants

    /// A wait reached its deadline.
    public static var timedOut: BatonError.Code { .init("timedOut") }
    /// A wait was cancelled. (Most cancelled waits throw `CancellationError` instead, as their
    /// `Throws:` documentation says.)
    public static var cancelled: BatonError.Code { .init("cancelled") }
    /// Something is held by another process; the message names the holder when known.
    public static var busy: BatonError.Code { .init("busy") }
    /// A write was refused because its fencing token is stale: a newer holder exists.
    public static var fenced: BatonError.Code { .init("fenced") }
    /// A grant was lost (taken over while this process was suspended or unresponsive).
    public static var lost: BatonError.Code { .init("lost") }
    /// A critical section was refused because a higher priority already asked the holder to
    /// stop: release the role instead.
    public static var stopRequested: BatonError.Code { .init("stopRequested") }
    /// The process is suspended: no lock may be taken until it resumes.
    public static var suspended: BatonError.Code { .init("suspended") }
    /// The platform's time for this process ran out (background time, an extension's budget).
    public static var expired: BatonError.Code { .init("expired") }

    // MARK: Channels

    /// The channel was closed: nothing more can be sent on it.
    public static var closed: BatonError.Code { .init("closed") }
    /// A channel frame failed its format or checksum check, or its payload could not be
    /// decoded as the channel's element type. The frame was skipped; the channel goes on.
    public static var malformedFrame: BatonError.Code { .init("malformedFrame") }

    // MARK: Simulator

    /// The simulator (`BatonSimulator`: `baton demo`, `baton simulate`) could not do what it was
    /// asked: a child process would not start or report ready, a socket failed.
    public static var simulationFailed: BatonError.Code { .init("simulationFailed") }
}

extension BatonError: BatonErrorCodes {}
extension BatonError.Code: BatonErrorCodes {
    /// Matches a ``BatonError`` of this code in a `catch` or `switch`: `catch BatonError.busy`.
    /// Any other error does not match.
    public static func ~= (code: BatonError.Code, error: any Error) -> Bool {
        guard let error = error as? BatonError else { return false }
        return error.code == code
    }
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
