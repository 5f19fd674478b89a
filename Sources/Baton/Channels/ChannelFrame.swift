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

    /// A complete frame (state ready) for `payload`.
    static func encode(payload: [UInt8], coding: Coding, sendID: UInt64) throws -> [UInt8] {
        guard payload.count <= maxPayload else {
            throw BatonError(.invalidArgument, "a channel element encodes to \(payload.count) bytes; the limit is \(maxPayload) bytes. Send a reference to the data instead.")
        }
        var frame = [UInt8](repeating: 0, count: size(payload: payload.count))
        frame.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: tag.littleEndian, toByteOffset: 16, as: UInt32.self)
            raw.storeBytes(of: UInt32(payload.count).littleEndian, toByteOffset: 20, as: UInt32.self)
            raw.storeBytes(of: sendID.littleEndian, toByteOffset: 24, as: UInt64.self)
            raw.storeBytes(of: coding.rawValue.littleEndian, toByteOffset: 36, as: UInt32.self)
            payload.withUnsafeBytes { source in
                if source.count > 0 { raw.baseAddress!.advanced(by: headerSize).copyMemory(from: source.baseAddress!, byteCount: source.count) }
            }
            raw.storeBytes(of: checksum(raw.baseAddress!, length: payload.count).littleEndian, toByteOffset: 32, as: UInt32.self)
        }
        return frame
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
