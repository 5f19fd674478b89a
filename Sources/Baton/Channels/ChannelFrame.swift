import CBatonShims

/// The on-disk frame of one channel element: versioned and checksummed.
///
/// ```
/// 0  u32 state      0 ready, 1 taken, 2 done (not covered by the checksum; changes in place)
/// 4  u32 owner      participant slot of the taker while taken
/// 8  u64 take id    unique per take; an acknowledgement must name it
/// 16 u32 tag        "BCF" + format version (1)
/// 20 u32 length     payload bytes
/// 24 u64 send id    random, chosen by the sender (a rendezvous sender finds its frame by it)
/// 32 u32 CRC-32C    of bytes 16..<32, bytes 36..<40 and the payload
/// 36 u32 coding     0 JSON, 1 UTF-8 text (a `String` element), 2 raw bytes (`[UInt8]`, `Data`)
/// 40 payload, then zero padding to a multiple of 8 bytes
/// ```
enum ChannelFrame {
    static let tag: UInt32 = 0x0146_4342 // "BCF\u{1}" little-endian
    static let headerSize = 40
    static let maxPayload = 64 << 20

    enum State: UInt32 { case ready = 0, taken = 1, done = 2 }

    /// How the payload encodes the element.
    enum Coding: UInt32 { case json = 0, text = 1, bytes = 2 }

    static func size(payload length: Int) -> Int { (headerSize + length + 7) & ~7 }

    /// The size of the frame for a payload of `length` bytes.
    /// - Throws: `invalidArgument` when the payload is larger than ``maxPayload``.
    static func checkedSize(payload length: Int) throws -> Int {
        guard length <= maxPayload else {
            throw BatonError(.invalidArgument, "a channel element encodes to \(length) bytes; the limit is \(maxPayload) bytes. Send a reference to the data instead.")
        }
        return size(payload: length)
    }

    /// Writes a complete frame (state ready) of `size` bytes (``size(payload:)``) for `payload`
    /// at `base`.
    static func write(into base: UnsafeMutableRawPointer, size: Int, payload: UnsafeRawBufferPointer, coding: Coding, sendID: UInt64) {
        base.initializeMemory(as: UInt64.self, repeating: 0, count: headerSize / 8)
        base.storeBytes(of: tag.littleEndian, toByteOffset: 16, as: UInt32.self)
        base.storeBytes(of: UInt32(payload.count).littleEndian, toByteOffset: 20, as: UInt32.self)
        base.storeBytes(of: sendID.littleEndian, toByteOffset: 24, as: UInt64.self)
        base.storeBytes(of: coding.rawValue.littleEndian, toByteOffset: 36, as: UInt32.self)
        if payload.count > 0 { base.advanced(by: headerSize).copyMemory(from: payload.baseAddress!, byteCount: payload.count) }
        let padding = size - headerSize - payload.count
        if padding > 0 { base.advanced(by: headerSize + payload.count).initializeMemory(as: UInt8.self, repeating: 0, count: padding) }
        base.storeBytes(of: checksum(UnsafeRawPointer(base), length: payload.count).littleEndian, toByteOffset: 32, as: UInt32.self)
    }

    /// The CRC-32C of a frame at `base` whose payload is `length` bytes.
    static func checksum(_ base: UnsafeRawPointer, length: Int) -> UInt32 {
        var crc = Checksum.crc32c(UnsafeRawBufferPointer(start: base.advanced(by: 16), count: 16))
        crc = Checksum.crc32c(UnsafeRawBufferPointer(start: base.advanced(by: 36), count: 4), seed: crc)
        return Checksum.crc32c(UnsafeRawBufferPointer(start: base.advanced(by: headerSize), count: length), seed: crc)
    }

    /// The frame's extent if its tag and length fit in `available` bytes; `nil` when the
    /// header is damaged.
    static func extent(_ base: UnsafeRawPointer, available: Int) -> Int? {
        guard available >= headerSize,
              UInt32(littleEndian: base.load(fromByteOffset: 16, as: UInt32.self)) == tag else { return nil }
        let length = Int(UInt32(littleEndian: base.load(fromByteOffset: 20, as: UInt32.self)))
        let total = size(payload: length)
        guard length <= maxPayload, total <= available else { return nil }
        return total
    }

    /// Whether the frame's checksum matches.
    static func checksumMatches(_ base: UnsafeRawPointer) -> Bool {
        let length = Int(UInt32(littleEndian: base.load(fromByteOffset: 20, as: UInt32.self)))
        return UInt32(littleEndian: base.load(fromByteOffset: 32, as: UInt32.self)) == checksum(base, length: length)
    }

    static func payloadLength(_ base: UnsafeRawPointer) -> Int {
        Int(UInt32(littleEndian: base.load(fromByteOffset: 20, as: UInt32.self)))
    }

    static func coding(_ base: UnsafeRawPointer) -> Coding? {
        Coding(rawValue: UInt32(littleEndian: base.load(fromByteOffset: 36, as: UInt32.self)))
    }

    static func sendID(_ base: UnsafeRawPointer) -> UInt64 {
        UInt64(littleEndian: base.load(fromByteOffset: 24, as: UInt64.self))
    }
}
