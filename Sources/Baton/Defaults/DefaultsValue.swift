#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A value as ``SharedDefaults`` stores it: one of the property-list-like types, or any
/// `Codable` value as JSON.
public enum DefaultsValue: Sendable, Hashable {
    /// A Boolean (1 byte).
    case bool(Bool)
    /// A 64-bit integer (8 bytes, little-endian).
    case int(Int)
    /// A double (8 bytes, its bit pattern).
    case double(Double)
    /// A string (its UTF-8).
    case string(String)
    /// Bytes.
    case data([UInt8])
    /// A date (8 bytes: seconds since the reference date, as a double).
    case date(Date)
    /// A `Codable` value encoded as JSON (sorted keys, so equal values have equal bytes).
    case json([UInt8])

    /// The type tag written in the log.
    var tag: UInt8 {
        switch self {
        case .bool: 1
        case .int: 2
        case .double: 3
        case .string: 4
        case .data: 5
        case .date: 6
        case .json: 7
        }
    }

    /// Calls `body` with the value's bytes as written in the log (integers little-endian).
    func withBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        switch self {
        case .bool(let value):
            var byte: UInt8 = value ? 1 : 0
            return try withUnsafeBytes(of: &byte, body)
        case .int(let value):
            var word = Int64(value).littleEndian
            return try withUnsafeBytes(of: &word, body)
        case .double(let value):
            var word = value.bitPattern.littleEndian
            return try withUnsafeBytes(of: &word, body)
        case .date(let value):
            var word = value.timeIntervalSinceReferenceDate.bitPattern.littleEndian
            return try withUnsafeBytes(of: &word, body)
        case .string(var value):
            return try value.withUTF8 { try body(UnsafeRawBufferPointer($0)) }
        case .data(let bytes), .json(let bytes):
            return try bytes.withUnsafeBytes(body)
        }
    }

    /// The number of bytes ``withBytes(_:)`` passes.
    var byteCount: Int {
        switch self {
        case .bool: 1
        case .int, .double, .date: 8
        case .string(let value): value.utf8.count
        case .data(let bytes), .json(let bytes): bytes.count
        }
    }

    /// Decodes a value read from the log; `nil` when the tag or length is not valid.
    static func decode(tag: UInt8, bytes: UnsafeRawBufferPointer) -> DefaultsValue? {
        func word() -> UInt64? {
            guard bytes.count == 8 else { return nil }
            return UInt64(littleEndian: bytes.loadUnaligned(as: UInt64.self))
        }
        switch tag {
        case 1: return bytes.count == 1 ? .bool(bytes[0] != 0) : nil
        case 2: return word().map { .int(Int(truncatingIfNeeded: Int64(bitPattern: $0))) }
        case 3: return word().map { .double(Double(bitPattern: $0)) }
        case 4: return .string(String(decoding: bytes, as: UTF8.self))
        case 5: return .data(Array(bytes))
        case 6: return word().map { .date(Date(timeIntervalSinceReferenceDate: Double(bitPattern: $0))) }
        case 7: return .json(Array(bytes))
        default: return nil
        }
    }

    /// Turns any `Codable` value into a stored value: the basic types are stored natively (so
    /// `set(5 as Int)` and `integer(forKey:)` agree), everything else as JSON.
    static func encode<T: Encodable>(_ value: T) throws -> DefaultsValue {
        switch value {
        case let value as Bool: return .bool(value)
        case let value as Int: return .int(value)
        case let value as Double: return .double(value)
        case let value as String: return .string(value)
        case let value as Data: return .data(Array(value))
        case let value as [UInt8]: return .data(value)
        case let value as Date: return .date(value)
        default:
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            do {
                return .json(Array(try encoder.encode(value)))
            } catch {
                throw BatonError(.invalidArgument, "a value of type \(T.self) could not be encoded as JSON: \(error)")
            }
        }
    }

    /// Turns a stored value back into `T`.
    /// - Throws: `typeMismatch` when the stored value is of another type.
    func decode<T: Decodable>(_ type: T.Type, key: String) throws -> T {
        func mismatch() -> BatonError {
            BatonError(.typeMismatch, "the value of key \"\(key)\" is stored as \(typeName), not as \(T.self); read it with the type it was written with")
        }
        switch self {
        case .bool(let value): if let result = value as? T { return result }
        case .int(let value):
            if let result = value as? T { return result }
            if T.self == Double.self { return Double(value) as! T }
        case .double(let value): if let result = value as? T { return result }
        case .string(let value): if let result = value as? T { return result }
        case .data(let bytes):
            if T.self == Data.self { return Data(bytes) as! T }
            if let result = bytes as? T { return result }
        case .date(let value): if let result = value as? T { return result }
        case .json(let bytes):
            do {
                return try JSONDecoder().decode(T.self, from: Data(bytes))
            } catch {
                throw BatonError(.typeMismatch, "the value of key \"\(key)\" does not decode as \(T.self): \(error)")
            }
        }
        throw mismatch()
    }

    /// The stored type's name, for messages and the command line.
    public var typeName: String {
        switch self {
        case .bool: "bool"
        case .int: "int"
        case .double: "double"
        case .string: "string"
        case .data: "data"
        case .date: "date"
        case .json: "json"
        }
    }
}
