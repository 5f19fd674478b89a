import CBatonShims
import Synchronization

/// One suite's log, as this process sees it: the current log file mapped, an index of every
/// live key to where its value sits in the mapping, and how far the log has been replayed.
///
/// - Reads check the meta's `committed` word (one atomic load). Unchanged: a dictionary lookup.
///   Changed: replay the new records (or, after a compaction, the new file), with no lock
///   shared with other processes.
/// - Writes take the writer lock (``DefaultsWriteLock``) for one append: catch up, check a
///   condition (compare-and-set, transactions, fences), copy the record into the mapping,
///   checksum it, publish the new `committed` word, release.
/// - When the file is full and at least half of it is dead records, the writer compacts: it
///   writes the live records to a new file, renames it over the log and publishes a new
///   generation; other processes notice the generation and map the new file.
final class DefaultsStore: Sendable {
    /// The size of a new log file, and of a compacted one at least.
    static let initialSize = 256 * 1024
    /// Log files smaller than this are grown rather than compacted (compaction rewrites and
    /// syncs a file; doing it rarely keeps sets cheap).
    static let compactionMinimum = 8 << 20

    let container: SharedContainer
    let suite: String
    let logPath: String
    let meta: DefaultsMeta
    let lockTimeout: Duration
    /// The signal rung after writes while someone observes (see ``DefaultsMeta`` `watchers`).
    let signalName: String

    struct IndexEntry {
        var valueOffset: Int
        var valueLength: Int
        var tag: UInt8
        /// What the key would take in a compacted log.
        var liveSize: Int
        /// The decoded value, kept after the first read (or the write) so repeated gets do
        /// not decode again.
        var cached: DefaultsValue? = nil
    }

    struct State: @unchecked Sendable {
        // @unchecked: `base` points into `log`'s mapping; a State lives only inside the store's
        // `state` Mutex, which serialises every use of it in this process.
        var log: MappedFile {
            didSet { mapped() }
        }
        /// `log.pointer` and `log.size`, copied so the hot paths read plain struct fields (no
        /// dynamic exclusivity check on the class's properties). Updated by ``remap(_:)``.
        var base: UnsafeMutableRawPointer
        var capacity: Int
        /// The log file's full generation (the committed word carries its low 24 bits).
        var generation: UInt64
        /// How far the log has been replayed into `index`.
        var length: Int
        /// The committed word `index` reflects.
        var seen: UInt64
        var index: [String: IndexEntry] = [:]
        /// The highest fencing epoch written per scope.
        var fences: [String: UInt64] = [:]
        var liveBytes = 0
        var report = DefaultsRecoveryReport()
        /// Damaged records were found: the next write compacts them away.
        var needsHealing = false

        init(log: MappedFile, generation: UInt64, length: Int, seen: UInt64) {
            self.log = log
            self.base = log.pointer
            self.capacity = log.size
            self.generation = generation
            self.length = length
            self.seen = seen
        }

        mutating func mapped() {
            base = log.pointer
            capacity = log.size
        }

        /// Maps the log again at `size` bytes.
        mutating func remap(_ size: Int) throws {
            try log.remap(size: size)
            mapped()
        }
    }

    /// Everything this process knows of the suite (internal for the cursor extension).
    let state: Mutex<State>

    init(container: SharedContainer, suite: String, lockTimeout: Duration) throws {
        try SharedContainer.validateName(suite, what: "a defaults suite name", maxBytes: 200)
        self.container = container
        self.suite = suite
        self.lockTimeout = lockTimeout
        self.logPath = "defaults/\(suite).log"
        let prefix = "baton.defaults."
        if prefix.utf8.count + suite.utf8.count <= Signals.maxNameBytes {
            signalName = prefix + suite
        } else {
            signalName = prefix + "#" + String(Self.fnv1a(suite), radix: 16)
        }
        try container.makeDirectory("defaults")
        let meta = DefaultsMeta(file: try MappedFile(container, relativePath: "defaults/\(suite).meta", minimumSize: DefaultsMeta.size))
        self.meta = meta

        var report = DefaultsRecoveryReport()
        let bootID = BootIdentity.bytes
        if !meta.isValid(bootID: bootID) {
            try Self.withInitializationLock(meta.file.fd, suite: suite) {
                guard !meta.isValid(bootID: bootID) else { return }
                let (word, recovery) = try Self.recoverFromDisk(container, logPath: "defaults/\(suite).log", suite: suite)
                report.merge(recovery)
                meta.initialize(bootID: bootID, committed: word)
            }
        }
        var initial = try Self.openCurrent(container, meta: meta, logPath: logPath, suite: suite)
        initial.report.merge(report)
        state = Mutex(initial)
        if initial.needsHealing {
            try state.withLock { state in try withWriterLock(&state) { _ in } }
        }
    }

    static func fnv1a(_ text: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return hash
    }

    /// Holds the meta file's flock while the meta is (re)built: only the first process after a
    /// boot does this, for a few microseconds.
    private static func withInitializationLock(_ fd: Int32, suite: String, _ body: () throws -> Void) throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while true {
            if try Sys.tryFlock(fd, LOCK_EX).get("locking the meta file of defaults suite \"\(suite)\"") { break }
            guard ContinuousClock.now < deadline else {
                throw BatonError(.busy, "another process has been preparing defaults suite \"\(suite)\" for 10 s; retry later")
            }
            usleep(200)
        }
        defer { _ = Sys.flock(fd, LOCK_UN) }
        try body()
    }

    // MARK: - Opening and recovery

    /// Finds the valid records of the log on disk (creating the log when missing), zeroes any
    /// torn tail and returns the committed word to publish. Caller holds the writer lock or the
    /// meta's initialisation lock.
    static func recoverFromDisk(_ container: SharedContainer, logPath: String, suite: String) throws -> (UInt64, DefaultsRecoveryReport) {
        var report = DefaultsRecoveryReport()
        let fd = try container.openFile(logPath, flags: O_RDWR | O_CREAT)
        let size = Int(try Sys.fstat(fd).get("checking \(logPath)").st_size)
        if size < DefaultsLogFormat.headerSize {
            defer { Sys.close(fd) }
            let result = DefaultsWriteLock.allocate(fd, size: initialSize)
            guard result == 0 else { throw Self.allocationError(result, path: logPath, size: initialSize) }
            var header = [UInt8](repeating: 0, count: DefaultsLogFormat.headerSize)
            header.withUnsafeMutableBytes { DefaultsLogFormat.writeHeader($0.baseAddress!, generation: 1) }
            try header.withUnsafeBytes { try Sys.pwriteAll(fd, $0, at: 0).get("writing the header of \(logPath)") }
            return (DefaultsLogFormat.committedWord(generation: 1, length: DefaultsLogFormat.headerSize), report)
        }
        Sys.close(fd)
        let file = try MappedFile(container, relativePath: logPath, minimumSize: 0, create: false)
        let base = file.pointer
        var generation = DefaultsLogFormat.readHeader(base, size: file.size)
        if generation == nil {
            report.headerRepaired = true
            DefaultsLogFormat.writeHeader(base, generation: 1)
            generation = 1
        }
        let scan = DefaultsLogFormat.scan(base, from: DefaultsLogFormat.headerSize, to: file.size) { _, _ in }
        report.corruptBytes += scan.corruptBytes
        report.corruptRegions += scan.corruptRegions
        if let tail = scan.invalidTailStart {
            // Zero the bytes of the interrupted write so no later scan mistakes them for data.
            var last = file.size
            while last > tail && !DefaultsLogFormat.hasNonZeroByte(base, max(tail, last - 4096)..<last) { last -= 4096 }
            last = max(last, tail)
            if last > tail {
                report.droppedTailBytes += last - tail
                (base + tail).initializeMemory(as: UInt8.self, repeating: 0, count: last - tail)
            }
        }
        return (DefaultsLogFormat.committedWord(generation: generation!, length: scan.end), report)
    }

    /// Maps the log of the generation `committed` names and replays it from the start.
    static func openCurrent(_ container: SharedContainer, meta: DefaultsMeta, logPath: String, suite: String) throws -> State {
        for attempt in 0..<1_000 {
            let word = baton_load64(meta.committed)
            let generation = word >> DefaultsLogFormat.lengthBits
            let length = Int(word & DefaultsLogFormat.lengthMask)
            let file = try MappedFile(container, relativePath: logPath, minimumSize: 0, create: false)
            var headerRepaired = false
            if DefaultsLogFormat.readHeader(file.pointer, size: file.size) == nil && file.size >= DefaultsLogFormat.headerSize {
                // A damaged header (the records after it have their own checksums): the meta
                // says which generation this file is; every process would write the same bytes.
                DefaultsLogFormat.writeHeader(file.pointer, generation: generation)
                headerRepaired = true
            }
            guard let fileGeneration = DefaultsLogFormat.readHeader(file.pointer, size: file.size) else {
                throw BatonError(.corrupt, "\(container.absolutePath(logPath)) is shorter than its header; delete the suite's .meta and .log files while no process uses them")
            }
            guard fileGeneration & DefaultsLogFormat.generationMask == generation else {
                // A compaction renamed a newer file before publishing it: look again.
                if attempt > 10 { usleep(50) }
                continue
            }
            guard length <= file.size, length >= DefaultsLogFormat.headerSize else {
                throw BatonError(.corrupt, "defaults suite \"\(suite)\" says \(length) bytes are committed but its log holds \(file.size); delete the suite's .meta file while no process uses it to rebuild it from the log")
            }
            var state = State(log: file, generation: fileGeneration, length: DefaultsLogFormat.headerSize, seen: word)
            state.report.headerRepaired = headerRepaired
            replay(&state, to: length)
            return state
        }
        throw BatonError(.busy, "the log of defaults suite \"\(suite)\" kept changing generation while being opened; retry")
    }

    /// Applies the records in `state.length..<end` to the index.
    private static func replay(_ state: inout State, to end: Int) {
        let base = UnsafeRawPointer(state.base)
        let scan = DefaultsLogFormat.scan(base, from: state.length, to: end) { _, entries in
            for entry in entries { apply(&state, entry, base: base) }
        }
        var damaged = scan.corruptBytes
        var regions = scan.corruptRegions
        if let tail = scan.invalidTailStart {
            // Committed bytes that are not valid records: damage at the end.
            damaged += end - tail
            regions += 1
        }
        if damaged > 0 {
            state.report.corruptBytes += damaged
            state.report.corruptRegions += regions
            state.needsHealing = true
        }
        state.length = end
    }

    @inline(__always)
    private static func apply(_ state: inout State, _ entry: DefaultsLogFormat.Entry, base: UnsafeRawPointer) {
        let key = String(decoding: UnsafeRawBufferPointer(start: base + entry.keyOffset, count: entry.keyLength), as: UTF8.self)
        switch entry.operation {
        case .set:
            let size = liveSize(keyBytes: entry.keyLength, valueBytes: entry.valueLength)
            let new = IndexEntry(valueOffset: entry.valueOffset, valueLength: entry.valueLength, tag: entry.tag, liveSize: size)
            if let old = state.index.updateValue(new, forKey: key) { state.liveBytes -= old.liveSize }
            state.liveBytes += size
        case .remove:
            if let old = state.index.removeValue(forKey: key) { state.liveBytes -= old.liveSize }
        case .fence:
            guard entry.valueLength == 8 else { return }
            let epoch = UInt64(littleEndian: base.loadUnaligned(fromByteOffset: entry.valueOffset, as: UInt64.self))
            state.fences[key] = max(state.fences[key] ?? 0, epoch)
        }
    }

    @inline(__always)
    static func liveSize(keyBytes: Int, valueBytes: Int) -> Int {
        DefaultsLogFormat.align(DefaultsLogFormat.recordHeaderSize + DefaultsLogFormat.entrySize(keyBytes: keyBytes, valueBytes: valueBytes))
    }

    /// Brings `state` up to the committed word: nothing when it did not change, the new records
    /// when it grew, the whole new file after a compaction.
    @inline(__always)
    func refresh(_ state: inout State) throws {
        let word = baton_load64(meta.committed)
        if word == state.seen { return }
        try catchUp(&state, word)
    }

    private func catchUp(_ state: inout State, _ word: UInt64) throws {
        let generation = word >> DefaultsLogFormat.lengthBits
        let length = Int(word & DefaultsLogFormat.lengthMask)
        if generation != state.generation & DefaultsLogFormat.generationMask || length < state.length {
            let report = state.report
            state = try Self.openCurrent(container, meta: meta, logPath: logPath, suite: suite)
            state.report.merge(report)
            return
        }
        if length > state.capacity {
            try state.remap(try state.log.fileSize())
            guard length <= state.capacity else {
                throw BatonError(.corrupt, "defaults suite \"\(suite)\" says \(length) bytes are committed but its log holds \(state.capacity)")
            }
        }
        Self.replay(&state, to: length)
        state.seen = word
    }

    // MARK: - Reading

    /// The stored value of `key`, after catching up. When catching up fails and `strict` is
    /// false, the last state this process saw is used.
    func value(forKey key: String, strict: Bool) throws -> DefaultsValue? {
        try state.withLock { state in
            if strict { try refresh(&state) } else { try? refresh(&state) }
            guard let position = state.index.index(forKey: key) else { return nil }
            if let cached = state.index.values[position].cached { return cached }
            let entry = state.index.values[position]
            let value = DefaultsValue.decode(tag: entry.tag, bytes: UnsafeRawBufferPointer(start: state.base + entry.valueOffset, count: entry.valueLength))
            state.index.values[position].cached = value
            return value
        }
    }

    /// Every key and value, at one instant.
    func snapshot() throws -> [String: DefaultsValue] {
        try state.withLock { state in
            try refresh(&state)
            var result: [String: DefaultsValue] = [:]
            result.reserveCapacity(state.index.count)
            for (key, entry) in state.index {
                let bytes = UnsafeRawBufferPointer(start: state.base + entry.valueOffset, count: entry.valueLength)
                if let value = DefaultsValue.decode(tag: entry.tag, bytes: bytes) { result[key] = value }
            }
            return result
        }
    }

    func keys() throws -> [String] {
        try state.withLock { state in
            try refresh(&state)
            return Array(state.index.keys)
        }
    }

    /// The highest fencing epoch written for `scope` (0 if none).
    func fenceEpoch(scope: String) throws -> UInt64 {
        try state.withLock { state in
            try refresh(&state)
            return state.fences[scope] ?? 0
        }
    }

    var recoveryReport: DefaultsRecoveryReport { state.withLock { $0.report } }

    /// Checks every committed record of the current log again (a byte may have changed on disk
    /// since it was read) and returns the report, including what this call found.
    func verify() throws -> DefaultsRecoveryReport {
        try state.withLock { state in
            try refresh(&state)
            let scan = DefaultsLogFormat.scan(state.base, from: DefaultsLogFormat.headerSize, to: state.length) { _, _ in }
            var damaged = scan.corruptBytes
            if let tail = scan.invalidTailStart { damaged += state.length - tail }
            if damaged > 0 {
                state.report.corruptBytes += damaged
                state.report.corruptRegions += scan.corruptRegions + (scan.invalidTailStart == nil ? 0 : 1)
                state.needsHealing = true
            }
            return state.report
        }
    }

    /// Whether the stored value of `key` is exactly `expected` (`nil`: absent).
    private static func matches(_ state: State, key: String, expected: DefaultsValue?) -> Bool {
        let entry = state.index[key]
        guard let expected else { return entry == nil }
        guard let entry, entry.tag == expected.tag, entry.valueLength == expected.byteCount else { return false }
        return expected.withBytes { bytes in
            bytes.count == 0 || memcmp(bytes.baseAddress!, state.base + entry.valueOffset, bytes.count) == 0
        }
    }

    // MARK: - Writing

    /// One entry of a record to append.
    struct PendingEntry {
        var operation: DefaultsLogFormat.Operation
        var key: String
        var value: DefaultsValue?
    }

    /// A condition checked under the writer lock, after catching up.
    enum Condition {
        case none
        /// Every key must hold the given value (`nil`: absent).
        case values([String: DefaultsValue?])
        case value(String, DefaultsValue?)
        /// The fence must be valid and not older than the highest epoch stored for its scope.
        case fence(any Fence)
    }

    /// Appends one record holding `entries` when `condition` holds. Returns whether it was
    /// written. Rings the suite's signal when someone observes.
    @discardableResult
    func write(_ entries: some Collection<PendingEntry>, when condition: Condition = .none) throws -> Bool {
        let written = try state.withLock { state in
            try withWriterLock(&state) { state in
                switch condition {
                case .none: break
                case .value(let key, let expected):
                    guard Self.matches(state, key: key, expected: expected) else { return false }
                case .values(let expected):
                    for (key, value) in expected where !Self.matches(state, key: key, expected: value) { return false }
                case .fence(let fence):
                    let highest = state.fences[fence.scope] ?? 0
                    guard fence.epoch >= highest else {
                        throw BatonError(.fenced, "the write to defaults suite \"\(suite)\" carries epoch \(fence.epoch) of \"\(fence.scope)\" but epoch \(highest) already wrote; this process no longer holds that grant")
                    }
                    try fence.validate()
                }
                if entries.isEmpty { return true }
                try append(&state, entries)
                return true
            }
        }
        if written && !entries.isEmpty && baton_load32(meta.watchers) > 0 {
            // The write is committed whatever happens here; a failure to ring (the signal table
            // full) delays observers until the next write that rings, it loses no data.
            try? container.signals.post(signalName)
        }
        return written
    }

    private func withWriterLock<R>(_ state: inout State, _ body: (inout State) throws -> R) throws -> R {
        let (acquired, token) = try DefaultsWriteLock.lock(meta, tokens: container.owners, timeout: lockTimeout, suite: suite)
        defer { DefaultsWriteLock.unlock(meta, token: token, tokens: container.owners) }
        let committed = baton_load64(meta.committed)
        if acquired == .ownerDied || baton_load64(meta.pendingEnd) != committed & DefaultsLogFormat.lengthMask {
            // A writer died in the middle of an append (or of a compaction): find the valid
            // records on disk and publish them. If this fails, the pending-end check brings the
            // next writer back here.
            let (word, recovery) = try Self.recoverFromDisk(container, logPath: logPath, suite: suite)
            baton_store64(meta.pendingEnd, word & DefaultsLogFormat.lengthMask)
            baton_store64(meta.committed, word)
            state.report.merge(recovery)
            state.report.crashRepairs += 1
        }
        try refresh(&state)
        if state.needsHealing {
            try compact(&state, reserving: 0)
            state.needsHealing = false
        }
        return try body(&state)
    }

    /// Copies a record into the mapping and publishes it. Caller holds the writer lock and has
    /// caught up.
    private func append(_ state: inout State, _ entries: some Collection<PendingEntry>) throws {
        var payload = 0
        for entry in entries {
            payload += DefaultsLogFormat.entrySize(keyBytes: entry.key.utf8.count, valueBytes: entry.value?.byteCount ?? 0)
        }
        guard payload <= DefaultsLogFormat.maxPayload else {
            throw BatonError(.tooLarge, "a transaction of \(payload) bytes exceeds the \(DefaultsLogFormat.maxPayload)-byte limit of one write; split it")
        }
        let size = DefaultsLogFormat.align(DefaultsLogFormat.recordHeaderSize + payload)
        try ensureCapacity(&state, size)

        let start = state.length
        baton_store64(meta.pendingEnd, UInt64(start + size))
        let record = state.base + start
        var position = start + DefaultsLogFormat.recordHeaderSize
        for entry in entries {
            var key = entry.key
            let value = entry.value
            let entryStart = position
            let valueOffset = key.withUTF8 { keyBytes in
                let keyRaw = UnsafeRawBufferPointer(keyBytes)
                if let value {
                    return value.withBytes { valueBytes in
                        DefaultsLogFormat.writeEntry(state.base + entryStart, operation: entry.operation, tag: value.tag, key: keyRaw, value: valueBytes)
                    }
                }
                return DefaultsLogFormat.writeEntry(state.base + entryStart, operation: entry.operation, tag: 0, key: keyRaw, value: UnsafeRawBufferPointer(start: nil, count: 0))
            }
            let keyBytes = valueOffset - DefaultsLogFormat.entryHeaderSize
            let valueBytes = value?.byteCount ?? 0
            position += valueOffset + valueBytes
            // The index changes with the record: nobody else sees it before we publish.
            switch entry.operation {
            case .set:
                let live = Self.liveSize(keyBytes: keyBytes, valueBytes: valueBytes)
                let new = IndexEntry(valueOffset: entryStart + valueOffset, valueLength: valueBytes, tag: value!.tag, liveSize: live, cached: value)
                if let old = state.index.updateValue(new, forKey: key) { state.liveBytes -= old.liveSize }
                state.liveBytes += live
            case .remove:
                if let old = state.index.removeValue(forKey: key) { state.liveBytes -= old.liveSize }
            case .fence:
                if case .int(let epoch)? = value {
                    state.fences[key] = max(state.fences[key] ?? 0, UInt64(bitPattern: Int64(epoch)))
                }
            }
        }
        _ = DefaultsLogFormat.sealRecord(record, payloadLength: payload)
        let word = DefaultsLogFormat.committedWord(generation: state.generation, length: start + size)
        baton_store64(meta.committed, word)
        state.length = start + size
        state.seen = word
    }

    /// Makes room for `size` more bytes: maps what another process already allocated, compacts
    /// when at least half the log is dead, or allocates more (a full disk throws here, before
    /// anything is written).
    private func ensureCapacity(_ state: inout State, _ size: Int) throws {
        let needed = state.length + size
        if needed <= state.capacity { return }
        let onDisk = try state.log.fileSize()
        if onDisk >= needed {
            try state.remap(onDisk)
            return
        }
        if state.capacity >= Self.compactionMinimum && (state.liveBytes + size) * 2 < state.length {
            try compact(&state, reserving: size)
            if state.length + size <= state.capacity { return }
        }
        var newSize = max(state.capacity, Self.initialSize)
        while newSize < state.length + size { newSize *= 2 }
        if newSize < state.capacity * 2 && state.length + size > state.capacity { newSize = state.capacity * 2 }
        let result = DefaultsWriteLock.allocate(state.log.fd, size: newSize)
        guard result == 0 else { throw Self.allocationError(result, path: logPath, size: newSize) }
        try state.remap(newSize)
    }

    static func allocationError(_ code: Int32, path: String, size: Int) -> BatonError {
        let cause = SystemCallError(call: FileSpace.allocationCall, errno: code)
        if code == ENOSPC || code == EFBIG || code == EDQUOT {
            return BatonError(.noSpace, "no space to grow \(path) to \(size) bytes; the value was not written and every key keeps its previous value. Free some disk space.", cause: cause)
        }
        return BatonError.system(cause, "allocating \(size) bytes for \(path)")
    }

    /// Writes the live records to a new file and switches every process to it. Caller holds the
    /// writer lock and has caught up.
    private func compact(_ state: inout State, reserving reserve: Int) throws {
        var live = DefaultsLogFormat.headerSize + state.liveBytes + reserve
        if !state.fences.isEmpty {
            live += DefaultsLogFormat.recordHeaderSize + state.fences.keys.reduce(8) { $0 + DefaultsLogFormat.entrySize(keyBytes: $1.utf8.count, valueBytes: 8) }
        }
        var newSize = Self.initialSize
        while newSize < live * 2 { newSize *= 2 }
        let temporary = logPath + ".compacting"
        let fd = try container.openFile(temporary, flags: O_RDWR | O_CREAT | O_TRUNC)
        let result = DefaultsWriteLock.allocate(fd, size: newSize)
        Sys.close(fd)
        guard result == 0 else {
            _ = Sys.unlinkat(container.directory, temporary)
            throw Self.allocationError(result, path: temporary, size: newSize)
        }
        let file: MappedFile
        do {
            file = try MappedFile(container, relativePath: temporary, minimumSize: newSize, create: false)
        } catch {
            _ = Sys.unlinkat(container.directory, temporary)
            throw error
        }
        let generation = state.generation + 1
        DefaultsLogFormat.writeHeader(file.pointer, generation: generation)
        var position = DefaultsLogFormat.headerSize
        let old = state.base
        for (key, entry) in state.index {
            var key = key
            let record = file.pointer + position
            let payload = key.withUTF8 { keyBytes in
                DefaultsLogFormat.writeEntry(
                    record + DefaultsLogFormat.recordHeaderSize, operation: .set, tag: entry.tag,
                    key: UnsafeRawBufferPointer(keyBytes),
                    value: UnsafeRawBufferPointer(start: old + entry.valueOffset, count: entry.valueLength)
                ) + entry.valueLength
            }
            position += DefaultsLogFormat.sealRecord(record, payloadLength: payload)
        }
        if !state.fences.isEmpty {
            let record = file.pointer + position
            var payload = 0
            for (scope, epoch) in state.fences {
                var scope = scope
                var word = epoch.littleEndian
                payload += scope.withUTF8 { scopeBytes in
                    withUnsafeBytes(of: &word) { epochBytes in
                        DefaultsLogFormat.writeEntry(record + DefaultsLogFormat.recordHeaderSize + payload, operation: .fence, tag: 2, key: UnsafeRawBufferPointer(scopeBytes), value: epochBytes) + 8
                    }
                }
            }
            position += DefaultsLogFormat.sealRecord(record, payloadLength: payload)
        }
        do {
            try DurableSync.sync(file.fd).get("syncing \(temporary)")
            try Sys.renameat(container.directory, temporary, container.directory, logPath).get("renaming \(temporary) over \(logPath)")
        } catch {
            _ = Sys.unlinkat(container.directory, temporary)
            throw error
        }
        let word = DefaultsLogFormat.committedWord(generation: generation, length: position)
        baton_store64(meta.pendingEnd, UInt64(position))
        baton_store64(meta.committed, word)
        let report = state.report
        state = State(log: file, generation: generation, length: DefaultsLogFormat.headerSize, seen: word)
        state.report = report
        Self.replay(&state, to: position)
    }
}
