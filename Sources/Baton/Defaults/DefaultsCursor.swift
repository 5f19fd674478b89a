import CBatonShims
import Synchronization

/// Where an observation of a suite is, and which keys changed since: the part of
/// ``DefaultsStore`` that ``DefaultsWatcher`` uses.
extension DefaultsStore {
    /// Where an observation is: the generation and offset it has seen, and a digest of the value
    /// of every key it watches (so a compaction, which rewrites the file, is compared by value).
    struct Cursor {
        var generation: UInt64
        var offset: Int
        var digests: [String: UInt64]
        let filter: String?
    }

    private static func digest(tag: UInt8, _ bytes: UnsafeRawBufferPointer) -> UInt64 {
        UInt64(Checksum.crc32c(bytes, seed: UInt32(tag))) << 32 | UInt64(truncatingIfNeeded: bytes.count) << 8 | UInt64(tag)
    }

    private static func digests(_ state: State, filter: String?) -> [String: UInt64] {
        var result: [String: UInt64] = [:]
        func add(_ key: String, _ entry: IndexEntry) {
            result[key] = digest(tag: entry.tag, UnsafeRawBufferPointer(start: state.base + entry.valueOffset, count: entry.valueLength))
        }
        if let filter {
            if let entry = state.index[filter] { add(filter, entry) }
        } else {
            for (key, entry) in state.index { add(key, entry) }
        }
        return result
    }

    func makeCursor(filter: String?) throws -> Cursor {
        try state.withLock { state in
            try refresh(&state)
            return Cursor(generation: state.generation, offset: state.length, digests: Self.digests(state, filter: filter), filter: filter)
        }
    }

    /// The keys whose value changed since `cursor`, in the order they changed; moves the cursor.
    func changedKeys(_ cursor: inout Cursor) throws -> [String] {
        try state.withLock { state in
            try refresh(&state)
            var changed: [String] = []
            if cursor.generation == state.generation && cursor.offset <= state.length {
                let base = UnsafeRawPointer(state.base)
                let filterBytes = cursor.filter.map { Array($0.utf8) }
                _ = DefaultsLogFormat.scan(base, from: cursor.offset, to: state.length) { _, entries in
                    for entry in entries where entry.operation != .fence {
                        let keyBytes = UnsafeRawBufferPointer(start: base + entry.keyOffset, count: entry.keyLength)
                        if let wanted = filterBytes, !wanted.elementsEqual(keyBytes) { continue }
                        let key = String(decoding: keyBytes, as: UTF8.self)
                        let digest: UInt64? = entry.operation == .remove ? nil
                            : Self.digest(tag: entry.tag, UnsafeRawBufferPointer(start: base + entry.valueOffset, count: entry.valueLength))
                        if cursor.digests[key] != digest {
                            cursor.digests[key] = digest
                            if !changed.contains(key) { changed.append(key) }
                        }
                    }
                }
            } else {
                let now = Self.digests(state, filter: cursor.filter)
                for (key, digest) in now where cursor.digests[key] != digest { changed.append(key) }
                for key in cursor.digests.keys where now[key] == nil { changed.append(key) }
                cursor.digests = now
            }
            cursor.generation = state.generation
            cursor.offset = state.length
            return changed
        }
    }

    func addWatcher() { baton_add32(meta.watchers, 1) }

    func removeWatcher() {
        while true {
            let current = baton_load32(meta.watchers)
            if current == 0 || baton_cas32(meta.watchers, current, current - 1) != 0 { return }
        }
    }
}
