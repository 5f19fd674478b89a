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

/// Any JSON value: what the command line sends and receives on a channel.
package enum JSONElement: Codable, Sendable, Hashable {
    case null
    case bool(Bool)
    case int(Int)
    case double(Double)
    case string(String)
    case array([JSONElement])
    case object([String: JSONElement])

    package init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Int.self) { self = .int(value) }
        else if let value = try? container.decode(Double.self) { self = .double(value) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else if let value = try? container.decode([JSONElement].self) { self = .array(value) }
        else { self = .object(try container.decode([String: JSONElement].self)) }
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .int(let value): try container.encode(value)
        case .double(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// Parses a JSON text (any value, not only objects and arrays).
    package static func parse(_ text: String) throws -> JSONElement {
        do {
            return try JSONDecoder().decode(JSONElement.self, from: Data(text.utf8))
        } catch {
            throw ValidationError("not a JSON value: \(text.prefix(40))")
        }
    }
}

extension ChannelCapacity: ExpressibleByArgument {
    public init?(argument: String) { self.init(parsing: argument) }
}

/// The channel options of the command line: the name and, when creating, the capacity.
package struct ChannelOptions: ParsableArguments {
    @OptionGroup package var options: ContainerOptions
    @Argument(help: "The channel name (1-255 bytes, no '/').") package var name: String
    @Option(help: "rendezvous, bounded:N or unbounded; used when the channel does not exist yet (default unbounded).")
    package var capacity: ChannelCapacity?

    package init() {}

    package func open() throws -> SharedChannel<JSONElement> {
        let container = try options.open()
        // The channel layer reads an existing channel's capacity with a plain blocking open;
        // refuse a FIFO or directory planted in its place before it gets there.
        try SharedContainer.validateName(name, what: "a channel name")
        // Opened and closed again at once (the descriptor closes itself); a missing file is a
        // channel not made yet.
        _ = try container.openDescriptorIfPresent("channels/" + name, flags: O_RDONLY)
        if let capacity { return try SharedChannel(container, name: name, capacity: capacity) }
        return try SharedChannel(container, existingOrNewNamed: name, capacity: .unbounded)
    }
}
