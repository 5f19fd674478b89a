/// The one line protocol of Baton's loopback fixture (``LoopbackServer`` and ``LoopbackClient``),
/// used by the lifecycle tests and benchmark, the simulator, the inbox's tests and benchmark and
/// the sample extension.
///
/// One command a line, fields separated by one space; payloads in lowercase hex (`-` when empty).
/// ```
/// client -> server   HELLO <name> <pid> <epoch>   this connection is a core: pending messages
///                                                 go to the newest core, which is sent them
///                                                 (then IDLE); its record takes the name, pid
///                                                 and role epoch
///                    PING                         keep-alive, counted in the connection's record
///                    ACK <id>                     stored durably: the server forgets the message
///                    PUSH <id> <hex>              store a message (a known id is ignored) -> OK
///                    STATS                        -> STATS cores=N fetches=N pushes=N acked=N
///                                                    pending=N overlaps=N
///                    DELAY <ms>                   wait this long before each delivery -> OK
/// server -> core     MSG <id> <sent-ns> <hex>     a pending message (sent-ns: CLOCK_MONOTONIC
///                                                 when it reached the server)
///                    IDLE                         nothing more to deliver for now
/// server -> any      OK, STATS ..., ERROR <text>  replies to PUSH, STATS, DELAY, unknown lines
/// ```
/// A message delivered to a core that closes its connection (or is killed) before `ACK` goes to
/// the next core. A core that says `HELLO` while another core's connection is still open 150 ms
/// later is an overlap: two cores running at once.
package enum LoopbackLine: Sendable, Hashable {
    case hello(name: String, pid: Int32, epoch: UInt64)
    case ping
    case ack(id: String)
    case push(id: String, payload: [UInt8])
    case stats
    case delay(milliseconds: Int)
    case message(LoopbackMessage)
    case idle
    case reply(String)

    /// Parses one line (without its newline); nil for a malformed one.
    package init?(_ line: some StringProtocol) {
        let fields = String(line).split(separator: " ", omittingEmptySubsequences: false).map(String.init)
        switch (fields.first, fields.count) {
        case ("HELLO", 4):
            guard let pid = Int32(fields[2]), let epoch = UInt64(fields[3]) else { return nil }
            self = .hello(name: fields[1], pid: pid, epoch: epoch)
        case ("PING", 1): self = .ping
        case ("ACK", 2): self = .ack(id: fields[1])
        case ("PUSH", 3):
            guard let payload = Hex.decode(fields[2]) else { return nil }
            self = .push(id: fields[1], payload: payload)
        case ("STATS", 1): self = .stats
        case ("DELAY", 2):
            guard let milliseconds = Int(fields[1]) else { return nil }
            self = .delay(milliseconds: max(0, milliseconds))
        case ("MSG", 4):
            guard let sent = UInt64(fields[2]), let payload = Hex.decode(fields[3]) else { return nil }
            self = .message(LoopbackMessage(id: fields[1], sent: sent, payload: payload))
        case ("IDLE", 1): self = .idle
        case ("OK", _), ("STATS", _), ("ERROR", _): self = .reply(String(line))
        default: return nil
        }
    }

    /// The line, with its newline.
    package var text: String {
        switch self {
        case .hello(let name, let pid, let epoch): return "HELLO \(name) \(pid) \(epoch)\n"
        case .ping: return "PING\n"
        case .ack(let id): return "ACK \(id)\n"
        case .push(let id, let payload): return "PUSH \(id) \(Hex.encode(payload))\n"
        case .stats: return "STATS\n"
        case .delay(let milliseconds): return "DELAY \(milliseconds)\n"
        case .message(let message): return "MSG \(message.id) \(message.sent) \(Hex.encode(message.payload))\n"
        case .idle: return "IDLE\n"
        case .reply(let text): return text + "\n"
        }
    }
}

/// A message the ``LoopbackServer`` delivers to a core.
package struct LoopbackMessage: Sendable, Hashable {
    /// Its unique id (no spaces).
    package var id: String
    /// When it reached the server (`CLOCK_MONOTONIC` ns).
    package var sent: UInt64
    /// Its content.
    package var payload: [UInt8]

    package init(id: String, sent: UInt64, payload: [UInt8]) {
        self.id = id
        self.sent = sent
        self.payload = payload
    }
}

/// Hex for the loopback protocol.
package enum Hex {
    package static func encode(_ bytes: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 15)])
        }
        return out.isEmpty ? "-" : String(decoding: out, as: UTF8.self)
    }

    package static func decode(_ text: String) -> [UInt8]? {
        if text == "-" { return [] }
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: return c - 48
            case 97...102: return c - 87
            case 65...70: return c - 55
            default: return nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(chars.count / 2)
        var index = 0
        while index < chars.count {
            guard let high = value(chars[index]), let low = value(chars[index + 1]) else { return nil }
            out.append(high << 4 | low)
            index += 2
        }
        return out
    }
}
