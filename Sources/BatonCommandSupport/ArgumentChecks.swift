import ArgumentParser
import Baton
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Checks of command-line values, used as `@Option(transform:)`: a value that is not what the
/// option means (NaN, an infinity, a negative count, a duration past any clock) is refused while
/// parsing, with a message that says what is allowed, instead of trapping later.
package enum ArgumentCheck {
    /// The longest duration accepted, in seconds (about 31 years): omit the option to wait
    /// forever.
    package static let maximumSeconds = 1e9

    /// A number of seconds from 0 to ``maximumSeconds``.
    package static func seconds(_ text: String) throws -> Double {
        try seconds(text, minimum: 0)
    }

    /// A number of seconds above 0 (an interval between checks) up to ``maximumSeconds``.
    package static func positiveSeconds(_ text: String) throws -> Double {
        try seconds(text, minimum: 0.001)
    }

    private static func seconds(_ text: String, minimum: Double) throws -> Double {
        guard let value = Double(text) else {
            throw ValidationError("not a number of seconds")
        }
        guard value.isFinite, value >= minimum, value <= maximumSeconds else {
            throw ValidationError("a number of seconds must be from \(minimum == 0 ? "0" : String(minimum)) to \(Int(maximumSeconds)); NaN, infinities and negative numbers are refused")
        }
        return value
    }

    /// A signal state: a whole number from 0 to `UInt64.max`.
    package static func state(_ text: String) throws -> UInt64 {
        if let value = UInt64(text) { return value }
        if let value = Int(text), value < 0 {
            throw ValidationError("a state is a whole number from 0 to \(UInt64.max); \(value) is negative")
        }
        if text.allSatisfy(\.isNumber), !text.isEmpty {
            throw ValidationError("a state is a whole number from 0 to \(UInt64.max); \(text) is too large")
        }
        throw ValidationError("a state is a whole number from 0 to \(UInt64.max), not '\(text.prefix(40))'")
    }

    /// A count from 0 up.
    package static func count(_ text: String) throws -> Int {
        guard let value = Int(text) else { throw ValidationError("not a whole number") }
        guard value >= 0 else { throw ValidationError("must be 0 or more") }
        return value
    }

    /// A count from 1 up.
    package static func positiveCount(_ text: String) throws -> Int {
        guard let value = Int(text) else { throw ValidationError("not a whole number") }
        guard value >= 1 else { throw ValidationError("must be 1 or more") }
        return value
    }

    /// The position of the first argument (after the program name) that is not valid UTF-8.
    ///
    /// `CommandLine.arguments` repairs invalid bytes (each becomes U+FFFD), so two different
    /// byte strings would name the same signal or key: the raw `argv` bytes are checked instead.
    package static func firstInvalidUTF8Argument() -> Int? {
        for index in 1..<Int(CommandLine.argc) {
            guard let pointer = CommandLine.unsafeArgv[index] else { continue }
            let bytes = UnsafeBufferPointer(start: UnsafeRawPointer(pointer).assumingMemoryBound(to: UInt8.self), count: strlen(pointer))
            if String(validating: bytes, as: UTF8.self) == nil { return index }
        }
        return nil
    }
}

extension Deadline {
    /// The deadline `seconds` from now for an option checked by ``ArgumentCheck/seconds(_:)``,
    /// or ``never`` without one.
    package static func option(_ seconds: Double?) throws -> Deadline {
        try seconds.map { try Deadline.seconds($0) } ?? .never
    }
}
