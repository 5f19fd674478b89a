import CBatonShims

/// The on-disk format of a suite's log, `.baton/defaults/<suite>.log`:
///
/// ```
/// header (64 bytes)
///   0 magic "BATNDEF1"   8 version   16 generation (u64)   24 CRC-32C of bytes 0..<24
///   (the generation's low 24 bits are what the meta's `committed` word carries)
/// records, each 8-byte aligned, appended one after another:
///   0 payload length (u32)   4 CRC-32C of the length word and the payload
///   8 payload: entries [op u8][type u8][key length u16][value length u32][key][value]
///     op 1 set, 2 remove, 3 fence (key = scope, value = epoch u64)
/// then zeros up to the file's size (space allocated ahead of time)
/// ```
///
/// A record is the unit of atomicity: a transaction's entries are one record. Which records
/// are committed is said by the meta file's `committed` word (see ``DefaultsMeta``); a record
/// past it was torn by a crash and is never read.
enum DefaultsLogFormat {
    static let magic: UInt64 = 0x3146_4544_4E54_4142 // "BATNDEF1" little-endian
    static let version: UInt32 = 1
    static let headerSize = 64
    static let recordHeaderSize = 8
    static let entryHeaderSize = 8
    /// The committed word holds `generation << lengthBits | length`.
    static let lengthBits: UInt64 = 40
    static let lengthMask: UInt64 = (1 << 40) - 1
    static let generationMask: UInt64 = (1 << 24) - 1
    /// The largest record payload (a transaction of many big values).
    static let maxPayload = Int(UInt32.max) - 64

    enum Operation: UInt8 {
        case set = 1
        case remove = 2
        case fence = 3
    }

    @inline(__always) static func align(_ count: Int) -> Int { (count + 7) & ~7 }

    @inline(__always) static func committedWord(generation: UInt64, length: Int) -> UInt64 {
        (generation & generationMask) << lengthBits | UInt64(length)
    }

    /// Writes a header for `generation` at `base`.
    static func writeHeader(_ base: UnsafeMutableRawPointer, generation: UInt64) {
        base.initializeMemory(as: UInt8.self, repeating: 0, count: headerSize)
        base.storeBytes(of: magic.littleEndian, toByteOffset: 0, as: UInt64.self)
        base.storeBytes(of: version.littleEndian, toByteOffset: 8, as: UInt32.self)
        base.storeBytes(of: generation.littleEndian, toByteOffset: 16, as: UInt64.self)
        base.storeBytes(of: baton_crc32c(0, base, 24).littleEndian, toByteOffset: 24, as: UInt32.self)
    }

    /// The generation in a valid header, or `nil`.
    static func readHeader(_ base: UnsafeRawPointer, size: Int) -> UInt64? {
        guard size >= headerSize,
              UInt64(littleEndian: base.loadUnaligned(fromByteOffset: 0, as: UInt64.self)) == magic,
              UInt32(littleEndian: base.loadUnaligned(fromByteOffset: 8, as: UInt32.self)) == version,
              UInt32(littleEndian: base.loadUnaligned(fromByteOffset: 24, as: UInt32.self)) == baton_crc32c(0, base, 24)
        else { return nil }
        return UInt64(littleEndian: base.loadUnaligned(fromByteOffset: 16, as: UInt64.self))
    }

    /// The size of an entry in a payload.
    @inline(__always) static func entrySize(keyBytes: Int, valueBytes: Int) -> Int {
        entryHeaderSize + keyBytes + valueBytes
    }

    /// Writes one entry at `pointer`; returns the offset of its value relative to `pointer`.
    @inline(__always)
    static func writeEntry(
        _ pointer: UnsafeMutableRawPointer,
        operation: Operation,
        tag: UInt8,
        key: UnsafeRawBufferPointer,
        value: UnsafeRawBufferPointer
    ) -> Int {
        pointer.storeBytes(of: operation.rawValue, toByteOffset: 0, as: UInt8.self)
        pointer.storeBytes(of: tag, toByteOffset: 1, as: UInt8.self)
        pointer.storeBytes(of: UInt16(key.count).littleEndian, toByteOffset: 2, as: UInt16.self)
        pointer.storeBytes(of: UInt32(value.count).littleEndian, toByteOffset: 4, as: UInt32.self)
        if key.count > 0 { (pointer + entryHeaderSize).copyMemory(from: key.baseAddress!, byteCount: key.count) }
        let valueOffset = entryHeaderSize + key.count
        if value.count > 0 { (pointer + valueOffset).copyMemory(from: value.baseAddress!, byteCount: value.count) }
        return valueOffset
    }

    /// Seals a record whose payload (`payloadLength` bytes at `record + 8`) is written: stores
    /// the length and the checksum. Returns the record's aligned size.
    @inline(__always)
    static func sealRecord(_ record: UnsafeMutableRawPointer, payloadLength: Int) -> Int {
        record.storeBytes(of: UInt32(payloadLength).littleEndian, toByteOffset: 0, as: UInt32.self)
        var crc = baton_crc32c(0, record, 4)
        crc = baton_crc32c(crc, record + recordHeaderSize, payloadLength)
        record.storeBytes(of: crc.littleEndian, toByteOffset: 4, as: UInt32.self)
        let size = align(recordHeaderSize + payloadLength)
        // Zero the alignment padding so a rescan sees clean bytes.
        let padding = size - recordHeaderSize - payloadLength
        if padding > 0 { (record + recordHeaderSize + payloadLength).initializeMemory(as: UInt8.self, repeating: 0, count: padding) }
        return size
    }

    /// One entry of a record, as offsets into the mapping.
    struct Entry {
        var operation: Operation
        var tag: UInt8
        var keyOffset: Int
        var keyLength: Int
        var valueOffset: Int
        var valueLength: Int
    }

    /// Checks the record at `offset` (length, checksum, entries) and returns its aligned size and
    /// entries; `nil` when the bytes there are not a valid record.
    static func record(at offset: Int, in base: UnsafeRawPointer, limit: Int, entries: inout [Entry]) -> Int? {
        guard offset + recordHeaderSize <= limit else { return nil }
        let length = Int(UInt32(littleEndian: base.loadUnaligned(fromByteOffset: offset, as: UInt32.self)))
        guard length >= entryHeaderSize + 1, length <= limit - offset - recordHeaderSize else { return nil }
        let stored = UInt32(littleEndian: base.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self))
        var crc = baton_crc32c(0, base + offset, 4)
        crc = baton_crc32c(crc, base + offset + recordHeaderSize, length)
        guard crc == stored else { return nil }
        entries.removeAll(keepingCapacity: true)
        var position = offset + recordHeaderSize
        let end = position + length
        while position < end {
            guard end - position >= entryHeaderSize,
                  let operation = Operation(rawValue: base.load(fromByteOffset: position, as: UInt8.self))
            else { return nil }
            let tag = base.load(fromByteOffset: position + 1, as: UInt8.self)
            let keyLength = Int(UInt16(littleEndian: base.loadUnaligned(fromByteOffset: position + 2, as: UInt16.self)))
            let valueLength = Int(UInt32(littleEndian: base.loadUnaligned(fromByteOffset: position + 4, as: UInt32.self)))
            guard keyLength >= 1, valueLength <= end - position - entryHeaderSize - keyLength else { return nil }
            let keyOffset = position + entryHeaderSize
            entries.append(Entry(operation: operation, tag: tag, keyOffset: keyOffset, keyLength: keyLength,
                                 valueOffset: keyOffset + keyLength, valueLength: valueLength))
            position = keyOffset + keyLength + valueLength
        }
        return align(recordHeaderSize + length)
    }

    /// What a scan found.
    struct Scan {
        /// The end of the last valid record.
        var end: Int
        /// Bytes in invalid regions that are followed by valid records (corruption).
        var corruptBytes = 0
        /// How many such regions.
        var corruptRegions = 0
        /// Those regions.
        var regions: [Range<Int>] = []
        /// Where invalid bytes after the last valid record start, if any (a torn tail, or
        /// corruption of the last records).
        var invalidTailStart: Int?
    }

    /// Walks the records in `from..<to`, calling `body` for each valid one. Invalid bytes are
    /// skipped 8 at a time until a valid record starts again.
    static func scan(
        _ base: UnsafeRawPointer,
        from: Int,
        to: Int,
        _ body: (_ recordOffset: Int, _ entries: [Entry]) -> Void
    ) -> Scan {
        var result = Scan(end: from)
        var entries: [Entry] = []
        var position = from
        var invalidStart: Int?
        while position + recordHeaderSize <= to {
            if let size = record(at: position, in: base, limit: to, entries: &entries) {
                if let start = invalidStart {
                    result.corruptBytes += position - start
                    result.corruptRegions += 1
                    result.regions.append(start..<position)
                    invalidStart = nil
                }
                body(position, entries)
                position += size
                result.end = position
            } else {
                if invalidStart == nil { invalidStart = position }
                position += 8
            }
        }
        if invalidStart == nil, position < to { invalidStart = position }
        result.invalidTailStart = invalidStart
        return result
    }

    /// The entries a damaged record at `range.lowerBound` seems to hold (its checksum failed):
    /// read leniently from its length word, for the report only. Empty when nothing readable.
    static func salvage(_ base: UnsafeRawPointer, _ range: Range<Int>) -> [(Operation, String)] {
        guard range.count >= recordHeaderSize + entryHeaderSize + 1 else { return [] }
        let length = Int(UInt32(littleEndian: base.loadUnaligned(fromByteOffset: range.lowerBound, as: UInt32.self)))
        let end = range.lowerBound + recordHeaderSize + min(length, range.count - recordHeaderSize)
        var position = range.lowerBound + recordHeaderSize
        var result: [(Operation, String)] = []
        while end - position >= entryHeaderSize {
            guard let operation = Operation(rawValue: base.load(fromByteOffset: position, as: UInt8.self)) else { break }
            let keyLength = Int(UInt16(littleEndian: base.loadUnaligned(fromByteOffset: position + 2, as: UInt16.self)))
            let valueLength = Int(UInt32(littleEndian: base.loadUnaligned(fromByteOffset: position + 4, as: UInt32.self)))
            guard keyLength >= 1, keyLength <= end - position - entryHeaderSize,
                  let key = String(validating: UnsafeRawBufferPointer(start: base + position + entryHeaderSize, count: keyLength), as: UTF8.self)
            else { break }
            if operation != .fence { result.append((operation, key)) }
            guard valueLength <= end - position - entryHeaderSize - keyLength else { break }
            position += entryHeaderSize + keyLength + valueLength
        }
        return result
    }

    /// Whether any byte in `range` of `base` is not zero.
    static func hasNonZeroByte(_ base: UnsafeRawPointer, _ range: Range<Int>) -> Bool {
        var index = range.lowerBound
        while index + 8 <= range.upperBound {
            if base.loadUnaligned(fromByteOffset: index, as: UInt64.self) != 0 { return true }
            index += 8
        }
        while index < range.upperBound {
            if base.load(fromByteOffset: index, as: UInt8.self) != 0 { return true }
            index += 1
        }
        return false
    }
}
