/// One rtnetlink message about interfaces, addresses or routes, as the Linux kernel sent it.
///
/// ``NetlinkReachability`` parses these to learn that the network changed; they are public for
/// diagnostics (``NetlinkReachability/messages()``).
public struct NetlinkMessage: Sendable, Hashable, CustomStringConvertible {
    /// What changed.
    public enum Kind: String, Sendable, Hashable {
        case linkAdded, linkRemoved, addressAdded, addressRemoved, routeAdded, routeRemoved
    }

    /// What changed.
    public var kind: Kind
    /// The interface index (for routes: the output interface, 0 if none was given).
    public var interfaceIndex: Int32
    /// The interface name, when the message carries it (links, some addresses).
    public var interfaceName: String?
    /// For links: whether the interface is up (`IFF_UP`).
    public var isUp: Bool?
    /// For addresses and routes: the address or destination in text form, when present.
    public var address: String?
    /// For addresses and routes: the prefix length.
    public var prefixLength: Int?

    public var description: String {
        var text = "\(kind) if\(interfaceIndex)"
        if let interfaceName { text += " (\(interfaceName))" }
        if let isUp { text += isUp ? " up" : " down" }
        if let address { text += " \(address)/\(prefixLength ?? 0)" }
        return text
    }

    // rtnetlink constants (linux/rtnetlink.h, linux/netlink.h), kept here to avoid a C import.
    static let headerSize = 16
    static let typeDone: UInt16 = 3
    static let typeError: UInt16 = 2
    static let newLink: UInt16 = 16, delLink: UInt16 = 17
    static let newAddress: UInt16 = 20, delAddress: UInt16 = 21
    static let newRoute: UInt16 = 24, delRoute: UInt16 = 25
    static let attributeInterfaceName: UInt16 = 3 // IFLA_IFNAME
    static let attributeAddress: UInt16 = 1       // IFA_ADDRESS
    static let attributeLocal: UInt16 = 2         // IFA_LOCAL
    static let attributeLabel: UInt16 = 3         // IFA_LABEL
    static let attributeDestination: UInt16 = 1   // RTA_DST
    static let attributeOutput: UInt16 = 4        // RTA_OIF

    /// Parses every message of one datagram; messages of other types are skipped, and a
    /// truncated or malformed message ends the parse (never a crash).
    static func parse(_ bytes: UnsafeRawBufferPointer) -> [NetlinkMessage] {
        var messages: [NetlinkMessage] = []
        var offset = 0
        while offset + headerSize <= bytes.count {
            let length = Int(bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
            let type = bytes.loadUnaligned(fromByteOffset: offset + 4, as: UInt16.self)
            guard length >= headerSize, offset + length <= bytes.count else { break }
            let body = UnsafeRawBufferPointer(rebasing: bytes[(offset + headerSize)..<(offset + length)])
            if let message = parseBody(type: type, body) { messages.append(message) }
            if type == typeDone { break }
            offset += align(length)
        }
        return messages
    }

    private static func align(_ value: Int) -> Int { (value + 3) & ~3 }

    private static func parseBody(type: UInt16, _ body: UnsafeRawBufferPointer) -> NetlinkMessage? {
        switch type {
        case newLink, delLink:
            // struct ifinfomsg { u8 family, pad; u16 type; i32 index; u32 flags, change; }
            guard body.count >= 16 else { return nil }
            let index = body.loadUnaligned(fromByteOffset: 4, as: Int32.self)
            let flags = body.loadUnaligned(fromByteOffset: 8, as: UInt32.self)
            var message = NetlinkMessage(kind: type == newLink ? .linkAdded : .linkRemoved, interfaceIndex: index)
            message.isUp = flags & 1 != 0 // IFF_UP
            for (attribute, payload) in attributes(body, from: 16) where attribute == attributeInterfaceName {
                message.interfaceName = string(payload)
            }
            return message
        case newAddress, delAddress:
            // struct ifaddrmsg { u8 family, prefixlen, flags, scope; u32 index; }
            guard body.count >= 8 else { return nil }
            let family = body[0]
            var message = NetlinkMessage(
                kind: type == newAddress ? .addressAdded : .addressRemoved,
                interfaceIndex: Int32(bitPattern: body.loadUnaligned(fromByteOffset: 4, as: UInt32.self)))
            message.prefixLength = Int(body[1])
            var local: String?, address: String?
            for (attribute, payload) in attributes(body, from: 8) {
                switch attribute {
                case attributeLocal: local = format(family: family, payload)
                case attributeAddress: address = format(family: family, payload)
                case attributeLabel: message.interfaceName = string(payload)
                default: break
                }
            }
            message.address = local ?? address
            return message
        case newRoute, delRoute:
            // struct rtmsg { u8 family, dst_len, src_len, tos, table, protocol, scope, type; u32 flags; }
            guard body.count >= 12 else { return nil }
            let family = body[0]
            var message = NetlinkMessage(kind: type == newRoute ? .routeAdded : .routeRemoved, interfaceIndex: 0)
            message.prefixLength = Int(body[1])
            for (attribute, payload) in attributes(body, from: 12) {
                switch attribute {
                case attributeDestination: message.address = format(family: family, payload)
                case attributeOutput where payload.count >= 4:
                    message.interfaceIndex = payload.loadUnaligned(as: Int32.self)
                default: break
                }
            }
            return message
        default:
            return nil
        }
    }

    /// The route attributes (`struct rtattr { u16 len; u16 type; }` + payload) from `start`.
    private static func attributes(_ body: UnsafeRawBufferPointer, from start: Int) -> [(UInt16, UnsafeRawBufferPointer)] {
        var result: [(UInt16, UnsafeRawBufferPointer)] = []
        var offset = start
        while offset + 4 <= body.count {
            let length = Int(body.loadUnaligned(fromByteOffset: offset, as: UInt16.self))
            let type = body.loadUnaligned(fromByteOffset: offset + 2, as: UInt16.self) & 0x3fff
            guard length >= 4, offset + length <= body.count else { break }
            result.append((type, UnsafeRawBufferPointer(rebasing: body[(offset + 4)..<(offset + length)])))
            offset += align(length)
        }
        return result
    }

    private static func string(_ payload: UnsafeRawBufferPointer) -> String {
        String(decoding: payload.prefix { $0 != 0 }, as: UTF8.self)
    }

    private static func format(family: UInt8, _ payload: UnsafeRawBufferPointer) -> String? {
        switch (family, payload.count) {
        case (2, 4): // AF_INET
            return payload.map(String.init).joined(separator: ".")
        case (10, 16): // AF_INET6, uncompressed hex groups
            return stride(from: 0, to: 16, by: 2)
                .map { String(UInt16(payload[$0]) << 8 | UInt16(payload[$0 + 1]), radix: 16) }
                .joined(separator: ":")
        default:
            return nil
        }
    }
}
