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
    /// How often, at most, a write (or a catch-up with another process's writes, on a guarded
    /// mapping) checks that the log was not cut short under it (one fstat).
    static let sizeCheckInterval: UInt64 = 1_000_000

    let container: SharedContainer
    let suite: String
    let logPath: String
    let meta: DefaultsMeta
    let lockTimeout: Duration
    /// The signal rung after writes while someone observes (see ``DefaultsMeta`` `watchers`).
    let signalName: String
    /// This store's ``sizeCheckInterval`` (nanoseconds): longer in a test, which then counts
    /// the checks without depending on how fast the machine runs.
    let sizeCheckNanoseconds = Atomic<UInt64>(DefaultsStore.sizeCheckInterval)

    /// Whether a size check made at `checkedAt` is older than ``sizeCheckNanoseconds`` at `now`
    /// (both monotonic nanoseconds): the rule writes and catch-ups share.
    private func isSizeCheckDue(since checkedAt: UInt64, now: UInt64) -> Bool {
        now &- checkedAt >= sizeCheckNanoseconds.load(ordering: .relaxed)
    }
    /// How many times this process caught up with another process's writes, and how many of
    /// those checked the log's size with an fstat (for tests: see ``sizeCheckInterval``).
    let catchUps = Atomic<Int>(0)
    let catchUpSizeChecks = Atomic<Int>(0)

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
        /// Counters of what this process repaired (crash repairs, torn tails, headers).
        var report = DefaultsRecoveryReport()
        /// Damage found by the last full read of the log and not yet repaired: reported, read
        /// around, and repaired by the next write (under the writer lock).
        var pending: [DefaultsLoss] = []
        /// The committed word disagreed with the log: `index` holds the log's valid records.
        var wordDisagrees = false
        /// When a write or a catch-up last checked the log's size (``sizeCheckInterval``).
        var sizeCheckedAt: UInt64 = 0
        /// The mapping, and how far into it, this process faulted pages in for writing ahead of
        /// the appends (``prefaultAhead()``); a new mapping starts from its committed end.
        var prefaulted: (base: UnsafeMutableRawPointer, end: Int)?
        /// Whether the next write must repair the log first.
        var needsHealing: Bool { !pending.isEmpty }

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
            signalName = prefix + "#" + String(FNV1a.hash(suite), radix: 16)
        }
        try container.makeDirectory("defaults")
        let meta = DefaultsMeta(file: try MappedFile(container, relativePath: "defaults/\(suite).meta", minimumSize: DefaultsMeta.size))
        self.meta = meta

        var report = DefaultsRecoveryReport()
        let bootID = BootIdentity.bytes
        if !meta.isValid(bootID: bootID) {
            try Self.withInitializationLock(meta, suite: suite) {
                guard !meta.isValid(bootID: bootID) else { return }
                // The old meta's word (from before a reboot) tells committed bytes from a torn write.
                let previous = meta.file.size >= DefaultsMeta.size ? baton_load64(meta.committed) : nil
                let (word, recovery, loss) = try Self.recoverFromDisk(container, logPath: "defaults/\(suite).log", suite: suite, committedWord: previous)
                report = recovery
                if let loss { try DefaultsLossFile.append([loss], container, suite: suite) }
                meta.initialize(bootID: bootID, committed: word)
            }
        }
        var initial = try Self.openCurrent(container, meta: meta, logPath: logPath, suite: suite)
        initial.report.droppedTailBytes += report.droppedTailBytes
        initial.report.headerRepaired = initial.report.headerRepaired || report.headerRepaired
        // Damage found here is reported and read around; only a write repairs it.
        for loss in initial.pending {
            container.diagnostics.report(.defaultsDamageFound, level: .warning, "defaults suite \(suite): \(loss)")
        }
        state = Mutex(initial)
    }

    /// How long a process waits for another to finish initialising a suite's meta before it
    /// says `busy` (a running initialiser holds the lock for microseconds: a wait this long
    /// means it is stopped in the middle).
    static let initializationPatience: Duration = .seconds(10)

    /// Holds the meta file's flock while the meta is (re)built: only the first process after a
    /// boot does this, for a few microseconds. A waiter sleeps on the meta's release word
    /// (``RingingFlock``), woken by the release.
    private static func withInitializationLock(_ meta: DefaultsMeta, suite: String, _ body: () throws -> Void) throws {
        try RingingFlock.withLock(
            meta.file.fd, releaseWord: meta.initializationReleases, patience: initializationPatience,
            what: "locking the meta file of defaults suite \"\(suite)\"",
            busy: { BatonError(.busy, "another process has been preparing defaults suite \"\(suite)\" for \(initializationPatience) (stopped in the middle?); retry later") },
            body)
    }

    // MARK: - Opening and recovery

    /// Finds the valid records of the log on disk (creating the log when missing), zeroes any
    /// invalid tail and returns the committed word to publish. Caller holds the writer lock or
    /// the meta's initialisation lock.
    ///
    /// `committedWord` is the word the meta held: tail bytes before its length were committed,
    /// so dropping them is a loss, returned with a quarantine copy of the log as it was; tail
    /// bytes past it are an interrupted write (no loss). `nil`: unknown, every non-zero tail byte
    /// is kept in quarantine before it is zeroed.
    static func recoverFromDisk(
        _ container: SharedContainer, logPath: String, suite: String, committedWord: UInt64?
    ) throws -> (UInt64, DefaultsRecoveryReport, DefaultsLoss?) {
        var report = DefaultsRecoveryReport()
        let logFile = try container.openDescriptor(logPath, flags: O_RDWR | O_CREAT)
        let fd = logFile.rawValue
        let size = Int(try Sys.fstat(fd).get("checking \(logPath)").st_size)
        if size < DefaultsLogFormat.headerSize {
            let result = DefaultsWriteLock.allocate(fd, size: initialSize)
            guard result == 0 else { throw Self.allocationError(result, path: logPath, size: initialSize) }
            var header = [UInt8](repeating: 0, count: DefaultsLogFormat.headerSize)
            header.withUnsafeMutableBytes { DefaultsLogFormat.writeHeader($0.baseAddress!, generation: 1) }
            try header.withUnsafeBytes { try Sys.pwriteAll(fd, $0, at: 0).get("writing the header of \(logPath)") }
            return (DefaultsLogFormat.committedWord(generation: 1, length: DefaultsLogFormat.headerSize), report, nil)
        }
        logFile.close()
        let file = try MappedFile(container, relativePath: logPath, minimumSize: 0, create: false)
        let base = file.pointer
        var generation = DefaultsLogFormat.readHeader(base, size: file.size)
        if generation == nil {
            report.headerRepaired = true
            DefaultsLogFormat.writeHeader(base, generation: 1)
            generation = 1
        }
        var committedLength: Int?
        if let committedWord, committedWord >> DefaultsLogFormat.lengthBits == generation! & DefaultsLogFormat.generationMask {
            committedLength = Int(committedWord & DefaultsLogFormat.lengthMask)
        }
        let scan = DefaultsLogFormat.scan(base, from: DefaultsLogFormat.headerSize, to: file.size) { _, _ in }
        var loss: DefaultsLoss?
        if let tail = scan.invalidTailStart {
            // Zero the bytes of the interrupted write so no later scan mistakes them for data.
            var last = file.size
            while last > tail && !DefaultsLogFormat.hasNonZeroByte(base, max(tail, last - 4096)..<last) { last -= 4096 }
            last = max(last, tail)
            if last > tail {
                if tail < (committedLength ?? Int.max) {
                    // Committed bytes (or bytes nobody can vouch for) that are not valid records:
                    // kept before they are dropped.
                    let copy = try DefaultsLossFile.quarantine(base, count: last, container, suite: suite)
                    var found = DefaultsLoss(kind: .corruptTail, offset: tail, byteCount: last - tail,
                                             detail: committedLength == nil
                                                ? "found while rebuilding the suite's meta; the valid records before it were kept"
                                                : "the valid records before it were kept and the damaged bytes dropped from the log")
                    let keys = DefaultsLogFormat.salvage(base, tail..<last)
                    found.lostKeys = Array(Set(keys.filter { $0.0 == .set }.map(\.1))).sorted()
                    found.keysUnknown = keys.isEmpty
                    found.quarantineFile = copy
                    loss = found
                } else {
                    report.droppedTailBytes += last - tail
                }
                (base + tail).initializeMemory(as: UInt8.self, repeating: 0, count: last - tail)
            }
        }
        return (DefaultsLogFormat.committedWord(generation: generation!, length: scan.end), report, loss)
    }

    /// Maps the log of the generation `committed` names and replays it from the start, checking
    /// the word against the log: the log's checksummed records win. A word that disagrees with
    /// them (another generation, a length past the file, or not on a record boundary, valid
    /// records past it) is reported and the log read as it is. Writes nothing but a damaged
    /// 64-byte header (which every process would rewrite identically).
    ///
    /// - Parameter truncatedFrom: the size this process had mapped when it found the file
    ///   shorter (cut by another program), for the report.
    static func openCurrent(_ container: SharedContainer, meta: DefaultsMeta, logPath: String, suite: String, truncatedFrom: Int? = nil) throws -> State {
        var previous: UInt64?
        var stable = 0
        for attempt in 0..<1_000 {
            let word = baton_load64(meta.committed)
            let pendingEnd = baton_load64(meta.pendingEnd)
            let generation = word >> DefaultsLogFormat.lengthBits
            let length = Int(word & DefaultsLogFormat.lengthMask)
            // A log cut shorter than its header by another program (even to 0 bytes, which
            // cannot be mapped) is extended with zeros to the header's size: nothing is left
            // there to destroy, the header is then rewritten below, and the missing committed
            // records are reported as a loss (the committed word and the pending end say where
            // they ended).
            let file = try MappedFile(container, relativePath: logPath, minimumSize: DefaultsLogFormat.headerSize, create: false)
            guard file.size >= DefaultsLogFormat.headerSize else {
                throw BatonError(.corrupt, "\(container.absolutePath(logPath)) is shorter than its header (cut short by another program?); the next write to suite \"\(suite)\" rebuilds it and reports the loss")
            }
            var headerRepaired = false
            if DefaultsLogFormat.readHeader(file.pointer, size: file.size) == nil {
                // A damaged header (the records after it have their own checksums): the meta
                // says which generation this file is; every process would write the same bytes.
                DefaultsLogFormat.writeHeader(file.pointer, generation: generation)
                headerRepaired = true
            }
            guard let fileGeneration = DefaultsLogFormat.readHeader(file.pointer, size: file.size) else {
                throw BatonError(.corrupt, "the header of \(container.absolutePath(logPath)) cannot be repaired")
            }
            if fileGeneration & DefaultsLogFormat.generationMask != generation {
                // A compaction renamed a newer file before publishing it: look again. A word that
                // stays put while disagreeing is damaged (or its writer stopped): read the log.
                if word == previous { stable += 1 } else { previous = word; stable = 0 }
                if stable < 20 {
                    if attempt > 10 { usleep(50) }
                    continue
                }
                return fromLog(file, generation: fileGeneration, word: word, pendingEnd: pendingEnd, truncatedFrom: truncatedFrom, headerRepaired: headerRepaired,
                               why: "names generation \(generation), the log is generation \(fileGeneration & DefaultsLogFormat.generationMask)")
            }
            guard length >= DefaultsLogFormat.headerSize, length <= file.size else {
                return fromLog(file, generation: fileGeneration, word: word, pendingEnd: pendingEnd, truncatedFrom: truncatedFrom, headerRepaired: headerRepaired,
                               why: "says \(length) bytes are committed, the log holds \(file.size)")
            }
            var state = State(log: file, generation: fileGeneration, length: DefaultsLogFormat.headerSize, seen: word)
            state.report.headerRepaired = headerRepaired
            let scan = replay(&state, to: length)
            guard scan.invalidTailStart == nil else {
                return fromLog(file, generation: fileGeneration, word: word, pendingEnd: pendingEnd, truncatedFrom: truncatedFrom, headerRepaired: headerRepaired,
                               why: "says \(length) bytes are committed, but the bytes before that do not end with a whole record")
            }
            // Valid records past the committed end (and past a write in progress) mean the word
            // went back: they would be lost, or a removed key come back, if it were believed.
            // (A write in progress holds the writer lock; with the lock free there is none.)
            let writing = SharedMutex(meta.lockMemory).currentOwner != 0
            let inFlight = writing && pendingEnd >= UInt64(length) && pendingEnd <= UInt64(file.size) ? Int(pendingEnd) : length
            if inFlight < file.size, DefaultsLogFormat.hasNonZeroByte(file.pointer, inFlight..<file.size) {
                let beyond = DefaultsLogFormat.scan(file.pointer, from: DefaultsLogFormat.align(inFlight), to: file.size) { _, _ in }
                if beyond.end > DefaultsLogFormat.align(inFlight) {
                    // A writer may have appended meanwhile: look again unless the words stayed put.
                    if baton_load64(meta.committed) != word || baton_load64(meta.pendingEnd) != pendingEnd { continue }
                    return fromLog(file, generation: fileGeneration, word: word, pendingEnd: pendingEnd, truncatedFrom: truncatedFrom, headerRepaired: headerRepaired,
                                   why: "says \(length) bytes are committed, but valid records follow up to \(beyond.end)")
                }
            }
            state.pending = damage(state, scan.regions)
            return state
        }
        throw BatonError(.busy, "the log of defaults suite \"\(suite)\" kept changing generation while being opened; retry")
    }

    /// The state the log's own records give, when the committed word disagrees with them: every
    /// valid record of the file, replayed; the disagreement and any damage reported.
    ///
    /// The committed word alone cannot tell "the log lost committed records" (cut short or
    /// zeroed by another program) from "the word is damaged". The pending end, written before
    /// every commit and equal to the committed end after it, can: when both name the same end
    /// and the log's valid records stop short of it, committed records are missing, and that is
    /// reported as a loss, never as a mere disagreement.
    private static func fromLog(_ file: MappedFile, generation: UInt64, word: UInt64, pendingEnd: UInt64, truncatedFrom: Int?, headerRepaired: Bool, why: String) -> State {
        let claimed = Int(word & DefaultsLogFormat.lengthMask)
        var state = State(log: file, generation: generation, length: DefaultsLogFormat.headerSize, seen: word)
        state.report.headerRepaired = headerRepaired
        let scan = replay(&state, to: file.size)
        state.length = scan.end
        state.wordDisagrees = true
        var losses = damage(state, scan.regions)
        if let truncatedFrom {
            var loss = DefaultsLoss(kind: .truncated, offset: file.size, byteCount: max(0, min(claimed, truncatedFrom) - file.size),
                                    detail: "found by a reader (the log was \(truncatedFrom) bytes); the next write extends it again and keeps the records before the cut")
            loss.keysUnknown = true
            losses.append(loss)
        } else if let tail = scan.invalidTailStart, claimed > tail, claimed <= file.size,
                  DefaultsLogFormat.hasNonZeroByte(file.pointer, tail..<claimed) {
            var loss = DefaultsLoss(kind: .corruptTail, offset: tail, byteCount: claimed - tail,
                                    detail: "found by this process, not repaired yet: the next write repairs the log and keeps these bytes")
            classify(&loss, state, DefaultsLogFormat.salvage(file.pointer, tail..<claimed), before: tail)
            losses.append(loss)
        } else if pendingEnd == UInt64(claimed), claimed > scan.end, generation & DefaultsLogFormat.generationMask == word >> DefaultsLogFormat.lengthBits {
            var loss = DefaultsLoss(kind: claimed > file.size ? .truncated : .corruptTail, offset: scan.end, byteCount: claimed - scan.end,
                                    detail: "the committed word and the pending end agree that \(claimed) bytes were committed, but the log's valid records end at \(scan.end) (the log holds \(file.size) bytes): committed records were cut off or zeroed by another program")
            loss.keysUnknown = true
            losses.append(loss)
        } else {
            losses.append(DefaultsLoss(kind: .committedWordDisagreed, offset: 0, byteCount: 0,
                                       detail: "the committed word (generation \(word >> DefaultsLogFormat.lengthBits), \(claimed) bytes) \(why); the log's checksummed records were read instead (they end at \(scan.end))"))
        }
        state.pending = losses
        return state
    }

    /// Describes the damaged regions found by a replay of the whole log into `state`.
    private static func damage(_ state: State, _ regions: [Range<Int>]) -> [DefaultsLoss] {
        regions.map { region in
            var loss = DefaultsLoss(kind: .corruptRecord, offset: region.lowerBound, byteCount: region.count,
                                    detail: "found by this process, not repaired yet: the next write repairs the log and keeps these bytes")
            classify(&loss, state, DefaultsLogFormat.salvage(state.base, region), before: region.lowerBound)
            return loss
        }
    }

    /// Sorts the keys a damaged record held by what its loss did to them.
    private static func classify(_ loss: inout DefaultsLoss, _ state: State, _ entries: [(DefaultsLogFormat.Operation, String)], before offset: Int) {
        loss.keysUnknown = entries.isEmpty
        var seen = Set<String>()
        for (operation, key) in entries where seen.insert(key).inserted {
            let current = state.index[key]
            switch operation {
            case .set:
                if let current { if current.valueOffset < offset { loss.rolledBackKeys.append(key) } } else { loss.lostKeys.append(key) }
            case .remove:
                if let current, current.valueOffset < offset { loss.resurrectedKeys.append(key) }
            case .fence: break
            }
        }
    }

    /// Applies the records in `state.length..<end` to the index; returns what the scan found.
    @discardableResult
    private static func replay(_ state: inout State, to end: Int) -> DefaultsLogFormat.Scan {
        let base = UnsafeRawPointer(state.base)
        let scan = DefaultsLogFormat.scan(base, from: state.length, to: end) { _, entries in
            for entry in entries { apply(&state, entry, base: base) }
        }
        state.length = end
        return scan
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
        // The check that the log was not cut short under this process (by another program):
        // one fstat, when another process wrote (not per read), and then at most once per
        // ``sizeCheckInterval``, shared with this process's writes, unless the log outgrew the
        // mapping (the size is needed to map more) or the mapping is unguarded (a touch past
        // the cut would raise SIGBUS). A cut that a touch of a guarded mapping reaches first is
        // repaired by the mapping guard with zeros, which the replay's checksums find below
        // (the log is then read again from the start, and the loss reported). A watcher catches
        // up once per change, and the fstat was about a tenth of a set's way to it (0.9 µs of
        // 9.5 µs, traced).
        catchUps.add(1, ordering: .relaxed)
        let now = baton_monotonic_ns()
        var size: Int?
        if length > state.capacity || !state.log.isGuarded || isSizeCheckDue(since: state.sizeCheckedAt, now: now) {
            catchUpSizeChecks.add(1, ordering: .relaxed)
            let checked = try state.log.fileSize()
            state.sizeCheckedAt = now
            if checked < state.capacity {
                do {
                    try reopen(&state, truncatedFrom: state.capacity)
                } catch {
                    // Keep nothing that points past the cut.
                    state.index = state.index.filter { $0.value.cached != nil }
                    throw error
                }
                return
            }
            size = checked
        }
        if generation != state.generation & DefaultsLogFormat.generationMask || length < state.length || state.wordDisagrees {
            try reopen(&state)
            return
        }
        if length > state.capacity, let size {
            try state.remap(size)
            guard length <= state.capacity else { try reopen(&state); return }
        }
        let scan = Self.replay(&state, to: length)
        if scan.invalidTailStart != nil || scan.corruptRegions > 0 {
            // Damage, or a word that does not match the log: read it all again, checked.
            try reopen(&state)
            return
        }
        state.seen = word
    }

    /// Reads the current log again from the start (checking the word against it), keeping this
    /// process's counters.
    private func reopen(_ state: inout State, truncatedFrom: Int? = nil) throws {
        let counters = state.report
        state = try Self.openCurrent(container, meta: meta, logPath: logPath, suite: suite, truncatedFrom: truncatedFrom)
        state.report.droppedTailBytes += counters.droppedTailBytes
        state.report.crashRepairs += counters.crashRepairs
        state.report.headerRepaired = state.report.headerRepaired || counters.headerRepaired
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

    /// This process's counters, the losses recorded in the suite, and the damage this process
    /// found that no writer has repaired yet.
    var recoveryReport: DefaultsRecoveryReport {
        let recorded = DefaultsLossFile.read(container, suite: suite)
        return state.withLock { Self.report($0, recorded: recorded) }
    }

    private static func report(_ state: State, recorded: [DefaultsLoss]) -> DefaultsRecoveryReport {
        var report = state.report
        report.losses = recorded + state.pending
        for loss in state.pending where loss.kind == .corruptRecord || loss.kind == .corruptTail {
            report.corruptBytes += loss.byteCount
            report.corruptRegions += 1
        }
        return report
    }

    /// Reads the whole log again (a byte may have changed on disk since it was read), checks
    /// every record and the committed word against it, and returns the report. Repairs nothing.
    func verify() throws -> DefaultsRecoveryReport {
        let recorded = DefaultsLossFile.read(container, suite: suite)
        return try state.withLock { state in
            try reopen(&state)
            return Self.report(state, recorded: recorded)
        }
    }

    /// Repairs what is pending (recording it), then forgets every recorded loss.
    /// Returns the report as it was just before.
    func acknowledgeRecovery() throws -> DefaultsRecoveryReport {
        try state.withLock { state in
            try withWriterLock(&state) { state in
                let acknowledged = Self.report(state, recorded: DefaultsLossFile.read(container, suite: suite))
                try DefaultsLossFile.clear(container, suite: suite)
                state.report = DefaultsRecoveryReport()
                return acknowledged
            }
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
        let (written, prefault) = try state.withLock { state -> (Bool, Bool) in
            let written = try withWriterLock(&state) { state in
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
            // (Decided here, under the lock this write holds anyway: most writes need nothing.)
            return (written, written && !entries.isEmpty && Self.prefaultRange(state) != nil)
        }
        if written && !entries.isEmpty && baton_load32(meta.watchers) > 0 {
            // The write is committed whatever happens here; a failure to ring (the signal table
            // full) delays observers until the next write that rings, it loses no data.
            try? container.signals.post(signalName)
        }
        if prefault { prefaultAhead() }
        return written
    }

    static let pageSize = max(4096, baton_page_size())

    /// The part of the log ``prefaultAhead()`` would fault in for `state`: from where this
    /// mapping was faulted in (or the log's end) to the end of the page after the one the log
    /// ends in; `nil` when that is done.
    private static func prefaultRange(_ state: State) -> (from: Int, to: Int)? {
        let target = min(state.capacity, (state.length / pageSize + 2) * pageSize)
        var from = state.length
        if let prefaulted = state.prefaulted, prefaulted.base == state.base { from = max(from, prefaulted.end) }
        return from < target ? (from, target) : nil
    }

    /// Faults in for writing, after a write has rung its watchers, the log's pages up to the end
    /// of the page after the one the log now ends in, so that the next appends find them ready.
    ///
    /// The first write to a page of a shared file mapping is a page fault in which the file
    /// system allocates and zeroes the page: 20-40 us on ext4 here. Taken inside an append, once
    /// every page of records (every 128 sets of a small key), it sat between the set and its
    /// watchers' wake-up, and made the p99 of a set seen by a watcher in another process. Here
    /// it is taken once per page, after the ring: the same faults, off that path.
    ///
    /// It writes the first byte of each page past the log's end back unchanged
    /// (`baton_touch_for_write`) under the writer lock, which owns those bytes. It only
    /// tries the lock, and never takes it over from a dead owner (that repair is the next
    /// writer's); it skips a log other than the one this process has mapped (a compaction's new
    /// file is faulted in by its own writes) and a file cut shorter than the mapping (checked
    /// with an `fstat` unless a write checked within ``sizeCheckInterval``, as appends are).
    /// Nothing here can fail the write, which has committed.
    private func prefaultAhead() {
        state.withLock { state in
            let page = Self.pageSize
            guard let (from, target) = Self.prefaultRange(state), let token = try? container.owners.enter() else { return }
            defer { container.owners.leave() }
            let mutex = SharedMutex(meta.lockMemory)
            // `tokens: nil`: a held lock is only ever waited for, so with a deadline already
            // reached (`.after(.zero)`) this is a try.
            guard mutex.lock(as: token, tokens: nil, deadline: .after(.zero), keepAlive: meta.file) != nil else { return }
            defer { mutex.unlock(as: token) }
            let committed = baton_load64(meta.committed)
            let end = Int(committed & DefaultsLogFormat.lengthMask)
            guard committed >> DefaultsLogFormat.lengthBits == state.generation & DefaultsLogFormat.generationMask,
                  baton_load64(meta.pendingEnd) == UInt64(end), end <= state.capacity else { return }
            // The writers' check that the file was not cut short (``sizeCheckInterval``), shared
            // with them: a touch past a cut would only make the mapping guard extend the file
            // again, hiding the cut from that check.
            let now = baton_monotonic_ns()
            if isSizeCheckDue(since: state.sizeCheckedAt, now: now) {
                guard let size = try? state.log.fileSize(), size >= state.capacity else { return }
                state.sizeCheckedAt = now
            }
            // Bytes from `end` on belong to the lock holder; a page that starts before it holds
            // records already (written, so faulted in, by whoever appended them).
            var offset = (max(from, end) + page - 1) / page * page
            while offset < target {
                baton_touch_for_write(state.base + offset)
                offset += page
            }
            state.prefaulted = (state.base, max(target, end))
        }
    }

    private func withWriterLock<R>(_ state: inout State, _ body: (inout State) throws -> R) throws -> R {
        let (acquired, token) = try DefaultsWriteLock.lock(meta, tokens: container.owners, timeout: lockTimeout, suite: suite)
        defer { DefaultsWriteLock.unlock(meta, token: token, tokens: container.owners) }
        var committed = baton_load64(meta.committed)
        let now = baton_monotonic_ns()
        if isSizeCheckDue(since: state.sizeCheckedAt, now: now),
           committed >> DefaultsLogFormat.lengthBits == state.generation & DefaultsLogFormat.generationMask || state.wordDisagrees {
            // One fstat before touching the mapping: a log cut short by another program would
            // fault (SIGBUS) on the append. At most once per interval (a system call costs more
            // than a set), so a writer that sets now and then checks every time and one in a
            // tight loop about once a millisecond; a cut inside that window still faults.
            state.sizeCheckedAt = now
            let size = try state.log.fileSize()
            if size < state.capacity {
                try repairTruncation(&state, size: size, committed: committed)
                committed = baton_load64(meta.committed)
            }
        }
        if acquired == .ownerDied || baton_load64(meta.pendingEnd) != committed & DefaultsLogFormat.lengthMask {
            // A writer died in the middle of an append (or of a compaction), or the words
            // disagree: find the valid records on disk and publish them. If this fails, the
            // pending-end check brings the next writer back here.
            let (word, recovery, loss) = try Self.recoverFromDisk(container, logPath: logPath, suite: suite, committedWord: committed)
            var losses = loss.map { [$0] } ?? []
            if acquired != .ownerDied && word != committed {
                losses.append(DefaultsLoss(kind: .committedWordDisagreed, offset: 0, byteCount: 0, detail: "the committed word said \(committed & DefaultsLogFormat.lengthMask) bytes (generation \(committed >> DefaultsLogFormat.lengthBits)) and the pending end \(baton_load64(meta.pendingEnd)); the log's checksummed records end at \(word & DefaultsLogFormat.lengthMask) (generation \(word >> DefaultsLogFormat.lengthBits)); the word was republished from them, no record dropped"))
            }
            try DefaultsLossFile.append(losses, container, suite: suite)
            baton_store64(meta.pendingEnd, word & DefaultsLogFormat.lengthMask)
            baton_store64(meta.committed, word)
            state.report.droppedTailBytes += recovery.droppedTailBytes
            state.report.headerRepaired = state.report.headerRepaired || recovery.headerRepaired
            if acquired == .ownerDied { state.report.crashRepairs += 1 }
        }
        try refresh(&state)
        if state.needsHealing { try heal(&state) }
        return try body(&state)
    }

    /// Repairs the damage the last read found: keeps a copy of the log as it is, records the
    /// losses in the suite, then compacts the valid records into a new log. Caller holds the
    /// writer lock and has caught up.
    private func heal(_ state: inout State) throws {
        var losses = state.pending
        if losses.contains(where: \.lostData) {
            var end = state.length
            for loss in losses where loss.kind == .corruptRecord || loss.kind == .corruptTail { end = max(end, loss.offset + loss.byteCount) }
            let copy = try DefaultsLossFile.quarantine(state.base, count: min(end, state.capacity), container, suite: suite)
            for index in losses.indices where losses[index].lostData { losses[index].quarantineFile = copy }
        }
        for index in losses.indices {
            if losses[index].kind == .committedWordDisagreed {
                losses[index].detail += "; a writer republished the word from the log (no record dropped)"
            } else if losses[index].detail.hasPrefix("found by") {
                losses[index].detail = "a writer kept the valid records and dropped the damaged bytes from the log"
            }
        }
        // Recorded before the compaction drops anything: a crash in between reports twice,
        // never not at all.
        try DefaultsLossFile.append(losses, container, suite: suite)
        try compact(&state, reserving: 0)
        for loss in losses {
            container.diagnostics.report(.defaultsRepaired, level: loss.lostData ? .warning : .notice, "defaults suite \(suite) repaired: \(loss)")
        }
    }

    /// The log was cut short by another program under this process: extend it again (zeros), so
    /// no process that maps it faults, recover the records before the cut, and record the loss.
    /// Caller holds the writer lock.
    private func repairTruncation(_ state: inout State, size: Int, committed: UInt64) throws {
        let cut = state.length
        let affected = state.index.compactMap { $0.value.valueOffset + $0.value.valueLength > size ? $0.key : nil }
        try FileSpace.reserve(state.log.fd, from: size, to: state.capacity, path: container.absolutePath(logPath))
        let (word, _, tail) = try Self.recoverFromDisk(container, logPath: logPath, suite: suite, committedWord: committed)
        baton_store64(meta.pendingEnd, word & DefaultsLogFormat.lengthMask)
        baton_store64(meta.committed, word)
        try reopen(&state)
        var loss = DefaultsLoss(kind: .truncated, offset: size, byteCount: max(0, cut - size),
                                detail: "a writer extended the log again and kept the records before the cut; the values after it are gone")
        for key in affected.sorted() {
            if state.index[key] != nil { loss.rolledBackKeys.append(key) } else { loss.lostKeys.append(key) }
        }
        loss.quarantineFile = tail?.quarantineFile
        try DefaultsLossFile.append([loss], container, suite: suite)
        // What the reopen found about the cut is in `loss`; other damage stays pending.
        state.pending.removeAll { $0.kind == .committedWordDisagreed || ($0.kind == .corruptTail && $0.offset >= size - 8) }
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
        let created = try container.openDescriptor(temporary, flags: O_RDWR | O_CREAT | O_TRUNC)
        let result = DefaultsWriteLock.allocate(created.rawValue, size: newSize)
        created.close()
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
        Self.replay(&state, to: position) // fresh: no damage, no pending loss
    }
}
