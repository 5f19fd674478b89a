#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A key-value store shared by every process of a container, with the shape of `UserDefaults`,
/// atomic operations across processes and change notifications in every process.
///
/// ```swift
/// let defaults = try SharedDefaults(container, suite: "settings")
/// try defaults.set("dark", forKey: "theme")
/// defaults.string(forKey: "theme")                       // "dark", in any process
/// try defaults.update("launches", as: Int.self) { ($0 ?? 0) + 1 }
/// for try await key in try defaults.changes(forKey: "theme") { ... }
/// ```
///
/// Storage is a memory-mapped append-only log (`.baton/defaults/<suite>.log`) with a CRC-32C per
/// record, compacted when half of it is dead. Reading costs one atomic load and a dictionary
/// lookup when nothing changed; another process's writes are replayed on the next read, without
/// a lock. A write holds a process-shared lock (a `SharedMutex`, taken over when its holder
/// died) for the duration of one append (no lock
/// is held between calls, so there is nothing to release before suspension).
///
/// Durability: a kill -9 at any instant leaves the old or the new value of every key, never a
/// torn one; records that fail their checksum are read around, reported in ``recoveryReport``
/// until acknowledged (a key rolled back to an older value is a loss), and their bytes kept in
/// a quarantine file when a writer repairs the log; a log cut short by another program is
/// extended again at the next write and the loss reported; a
/// full disk makes the write throw `noSpace` and keeps the old value. Writes reach the page
/// cache, not the disk (like `UserDefaults` and MMKV): they survive a crash of the process, not
/// a power loss of the machine.
///
/// Getters (``string(forKey:)``...) do not throw: they return `nil` when the key is absent or
/// stored as another type, and if the log cannot be re-read (an I/O failure) they return the
/// last value this process saw. ``value(_:forKey:)`` throws instead.
///
/// Limits: keys are 1 byte to 1 KiB of UTF-8, values up to 16 MiB.
public final class SharedDefaults: Sendable {
    /// The longest key, in bytes of UTF-8.
    public static let maxKeyBytes = 1024
    /// The largest value, in bytes.
    public static let maxValueBytes = 16 << 20

    let store: DefaultsStore

    /// The suite's name.
    public var suite: String { store.suite }

    /// Opens (creating on first use) a suite of shared defaults in `container`.
    ///
    /// - Parameters:
    ///   - container: The shared container.
    ///   - suite: The suite's name: 1 to 200 bytes, no `/`, not `.` or `..`.
    ///   - lockTimeout: How long a write waits for another process's write before throwing
    ///     `busy` (a write holds the lock for microseconds; this bounds the wait behind a
    ///     process stopped in the middle of one).
    /// - Throws: `invalidName` for a bad suite name; `corrupt` when the files cannot be
    ///   repaired; file-system errors.
    public init(_ container: SharedContainer, suite: String = "standard", lockTimeout: Duration = .seconds(5)) throws {
        store = try DefaultsStore(container: container, suite: suite, lockTimeout: lockTimeout)
    }

    // MARK: - Limits

    static func validate(key: String) throws {
        let count = key.utf8.count
        guard count >= 1 else {
            throw BatonError(.invalidName, "a defaults key may not be empty")
        }
        guard count <= maxKeyBytes else {
            throw BatonError(.tooLarge, "a defaults key may be at most \(maxKeyBytes) bytes of UTF-8; this one is \(count) bytes")
        }
    }

    static func validate(value: DefaultsValue, key: String) throws {
        let count = value.byteCount
        guard count <= maxValueBytes else {
            throw BatonError(.tooLarge, "the value for key \"\(key.prefix(64))\" is \(count) bytes; shared defaults hold values up to \(maxValueBytes) bytes (16 MiB). Keep large data in a file.")
        }
    }

    private func write(_ value: DefaultsValue, forKey key: String) throws {
        try Self.validate(key: key)
        try Self.validate(value: value, key: key)
        try store.write(CollectionOfOne(DefaultsStore.PendingEntry(operation: .set, key: key, value: value)))
    }

    // MARK: - Setting

    /// Sets a Boolean value.
    /// - Parameters:
    ///   - value: The value.
    ///   - key: The key: 1 byte to 1 KiB of UTF-8.
    /// - Throws: `invalidName` for an empty key, `tooLarge` past the limits, `noSpace` on a
    ///   full disk (the old value is kept), `busy` when the writer lock stays held.
    public func set(_ value: Bool, forKey key: String) throws { try write(.bool(value), forKey: key) }
    /// Sets an integer.
    /// - Throws: See the `Bool` overload of `set(_:forKey:)`.
    public func set(_ value: Int, forKey key: String) throws { try write(.int(value), forKey: key) }
    /// Sets a floating-point value.
    /// - Throws: See the `Bool` overload of `set(_:forKey:)`.
    public func set(_ value: Double, forKey key: String) throws { try write(.double(value), forKey: key) }
    /// Sets a string.
    /// - Throws: See the `Bool` overload of `set(_:forKey:)`.
    public func set(_ value: String, forKey key: String) throws { try write(.string(value), forKey: key) }
    /// Sets bytes.
    /// - Throws: See the `Bool` overload of `set(_:forKey:)`.
    public func set(_ value: Data, forKey key: String) throws { try write(.data(Array(value)), forKey: key) }
    /// Sets a date.
    /// - Throws: See the `Bool` overload of `set(_:forKey:)`.
    public func set(_ value: Date, forKey key: String) throws { try write(.date(value), forKey: key) }

    /// Sets any `Codable` value (the basic types natively, others as JSON).
    /// - Throws: See the `Bool` overload of `set(_:forKey:)`; `invalidArgument` when `value` does not encode.
    public func set<T: Codable>(_ value: T, forKey key: String) throws {
        try write(try DefaultsValue.encode(value), forKey: key)
    }

    /// Sets a value through a typed key.
    /// - Throws: See the `Bool` overload of `set(_:forKey:)`.
    public func set<T: Codable>(_ value: T, for key: DefaultsKey<T>) throws {
        try set(value, forKey: key.name)
    }

    /// Sets a value only if `fence` is still the current grant of its scope: the write is
    /// refused when it is no longer valid or a write with a newer epoch of the same scope was
    /// made. The highest epoch per scope is kept in the log, checked and raised in the same
    /// append as the value.
    /// - Throws: `fenced` when the token is stale; see also the `Bool` overload of `set(_:forKey:)`.
    public func set<T: Codable>(_ value: T, forKey key: String, fencedBy fence: some Fence) throws {
        try Self.validate(key: key)
        let encoded = try DefaultsValue.encode(value)
        try Self.validate(value: encoded, key: key)
        try SharedContainer.validateName(fence.scope, what: "a fence scope", maxBytes: Self.maxKeyBytes)
        let entries = [
            DefaultsStore.PendingEntry(operation: .fence, key: fence.scope, value: .int(Int(Int64(bitPattern: fence.epoch)))),
            DefaultsStore.PendingEntry(operation: .set, key: key, value: encoded),
        ]
        try store.write(entries, when: .fence(fence))
    }

    /// Removes `key` (nothing happens when it is absent).
    /// - Throws: `invalidName`/`tooLarge` for a bad key, `busy`, `noSpace`.
    public func removeValue(forKey key: String) throws {
        try Self.validate(key: key)
        try store.write(CollectionOfOne(DefaultsStore.PendingEntry(operation: .remove, key: key, value: nil)), when: .none)
    }

    // MARK: - Getting

    private func stored(_ key: String) -> DefaultsValue? {
        guard (try? Self.validate(key: key)) != nil else { return nil }
        return (try? store.value(forKey: key, strict: false)) ?? nil
    }

    /// The Boolean value of `key`, or `nil` when absent or stored as another type.
    public func bool(forKey key: String) -> Bool? {
        if case .bool(let value)? = stored(key) { return value }
        return nil
    }

    /// The integer value of `key`, or `nil` when absent or stored as another type.
    public func integer(forKey key: String) -> Int? {
        if case .int(let value)? = stored(key) { return value }
        return nil
    }

    /// The floating-point value of `key` (an integer is converted), or `nil` when absent or
    /// stored as another type.
    public func double(forKey key: String) -> Double? {
        switch stored(key) {
        case .double(let value)?: return value
        case .int(let value)?: return Double(value)
        default: return nil
        }
    }

    /// The string value of `key`, or `nil` when absent or stored as another type.
    public func string(forKey key: String) -> String? {
        if case .string(let value)? = stored(key) { return value }
        return nil
    }

    /// The bytes of `key`, or `nil` when absent or stored as another type.
    public func data(forKey key: String) -> Data? {
        if case .data(let bytes)? = stored(key) { return Data(bytes) }
        return nil
    }

    /// The date value of `key`, or `nil` when absent or stored as another type.
    public func date(forKey key: String) -> Date? {
        if case .date(let value)? = stored(key) { return value }
        return nil
    }

    /// The value of `key` decoded as `T`.
    /// - Returns: The value, or `nil` when the key is absent.
    /// - Throws: `typeMismatch` when it is stored as another type; `invalidName`/`tooLarge`
    ///   for a bad key; a ``BatonError`` when the log cannot be read.
    public func value<T: Codable>(_ type: T.Type, forKey key: String) throws -> T? {
        try Self.validate(key: key)
        return try store.value(forKey: key, strict: true)?.decode(T.self, key: key)
    }

    /// The stored value of `key` as it is, whatever its type, or `nil` when absent.
    /// - Throws: See ``value(_:forKey:)``.
    public func storedValue(forKey key: String) throws -> DefaultsValue? {
        try Self.validate(key: key)
        return try store.value(forKey: key, strict: true)
    }

    /// `value(type, forKey: key)`, or `nil` when absent, stored as another type, or unreadable.
    public subscript<T: Codable>(key: String, as type: T.Type) -> T? {
        try? value(type, forKey: key)
    }

    /// The value of a typed key, or `nil` when absent, stored as another type, or unreadable.
    public subscript<T: Codable>(key: DefaultsKey<T>) -> T? {
        try? value(T.self, forKey: key.name)
    }

    /// Every key, in no particular order.
    /// - Throws: a ``BatonError`` when the log cannot be read.
    public func keys() throws -> [String] { try store.keys() }

    /// Every key, in no particular order (empty when the log cannot be read; see ``keys()``).
    public var allKeys: [String] { (try? store.keys()) ?? [] }

    /// Every key and its value, at one instant.
    /// - Throws: a ``BatonError`` when the log cannot be read.
    public func dictionaryRepresentation() throws -> [String: DefaultsValue] { try store.snapshot() }

    // MARK: - Atomic operations

    /// Sets `key` to `new` (removes it when `nil`) only if it currently holds `expected`
    /// (absent when `nil`), atomically across processes.
    /// - Returns: Whether the value was replaced.
    /// - Throws: See the `Bool` overload of `set(_:forKey:)`.
    public func compareAndSet<T: Codable>(_ key: String, expected: T?, new: T?) throws -> Bool {
        try Self.validate(key: key)
        let expectedValue = try expected.map { try DefaultsValue.encode($0) }
        let newValue = try new.map { try DefaultsValue.encode($0) }
        if let newValue { try Self.validate(value: newValue, key: key) }
        let entry = DefaultsStore.PendingEntry(operation: newValue == nil ? .remove : .set, key: key, value: newValue)
        return try store.write(CollectionOfOne(entry), when: .value(key, expectedValue))
    }

    /// Replaces the value of `key` with `transform(old)` atomically across processes (`nil` in:
    /// absent; `nil` out: remove).
    ///
    /// `transform` runs without any lock held, and runs again when another process changed the
    /// key in the meantime (optimistic concurrency): keep side effects out of it.
    /// - Returns: The value written.
    /// - Throws: what `transform` throws; `typeMismatch` when the key holds another type;
    ///   `busy` when other writers kept changing the key for longer than the lock timeout.
    @discardableResult
    public func update<T: Codable>(_ key: String, as type: T.Type, _ transform: (T?) throws -> T?) throws -> T? {
        try Self.validate(key: key)
        let deadline = ContinuousClock.now + store.lockTimeout
        while true {
            let current = try store.value(forKey: key, strict: true)
            let new = try transform(try current?.decode(T.self, key: key))
            let newValue = try new.map { try DefaultsValue.encode($0) }
            if let newValue { try Self.validate(value: newValue, key: key) }
            let entry = DefaultsStore.PendingEntry(operation: newValue == nil ? .remove : .set, key: key, value: newValue)
            if try store.write(CollectionOfOne(entry), when: .value(key, current)) { return new }
            guard ContinuousClock.now < deadline else {
                throw BatonError(.busy, "key \"\(key.prefix(64))\" of defaults suite \"\(suite)\" kept changing under update for \(store.lockTimeout); retry later")
            }
        }
    }

    /// Runs `body` and applies its writes as one record: every process sees all of them or none.
    ///
    /// The values `body` reads must be unchanged when it commits; when another process changed
    /// one of them, `body` runs again on fresh values (it runs without any lock held). Keep side
    /// effects out of it.
    /// - Throws: what `body` throws (nothing is written then); `busy` when other writers kept
    ///   conflicting for longer than the lock timeout; see also the `Bool` overload of `set(_:forKey:)`.
    public func transaction(_ body: (inout DefaultsTransaction) throws -> Void) throws {
        let deadline = ContinuousClock.now + store.lockTimeout
        while true {
            var transaction = DefaultsTransaction(defaults: self)
            try body(&transaction)
            if transaction.writes.isEmpty { return }
            if try store.write(transaction.writes, when: .values(transaction.reads)) { return }
            guard ContinuousClock.now < deadline else {
                throw BatonError(.busy, "a transaction on defaults suite \"\(suite)\" kept conflicting with other writers for \(store.lockTimeout); retry later")
            }
        }
    }

    /// The highest fencing epoch written for `scope` through ``set(_:forKey:fencedBy:)`` (0 if
    /// none).
    /// - Throws: a ``BatonError`` when the log cannot be read.
    public func fenceEpoch(scope: String) throws -> UInt64 { try store.fenceEpoch(scope: scope) }

    // MARK: - Notifications

    /// The keys that change from now on, in any process.
    /// - Throws: `capacityExceeded` when the container's signal table is full.
    public func changes() throws -> DefaultsChanges {
        DefaultsChanges(watcher: try DefaultsWatcher(store: store, key: nil))
    }

    /// `key` each time its value changes from now on, in any process.
    /// - Throws: `invalidName`/`tooLarge` for a bad key; see ``changes()``.
    public func changes(forKey key: String) throws -> DefaultsChanges {
        try Self.validate(key: key)
        return DefaultsChanges(watcher: try DefaultsWatcher(store: store, key: key))
    }

    // MARK: - Integrity

    /// What is wrong or was repaired: the losses recorded in the suite and not yet acknowledged
    /// (``DefaultsRecoveryReport/losses``, the same in every process), damage this process found
    /// that no writer has repaired yet, and this process's crash repairs.
    ///
    /// A process that only reads never rewrites the files: it reads around damage and reports
    /// it here; the next write repairs it, keeping the dropped bytes in a quarantine file.
    public var recoveryReport: DefaultsRecoveryReport { store.recoveryReport }

    /// Reads the whole log again, checks every record's checksum and the meta's committed word
    /// against the records, and returns the updated ``recoveryReport``. Repairs nothing; recorded
    /// losses stay reported until ``acknowledgeRecovery()``.
    /// - Throws: a ``BatonError`` when the log cannot be read.
    public func verify() throws -> DefaultsRecoveryReport { try store.verify() }

    /// Repairs damage not yet repaired (under the writer lock, keeping what it drops in a
    /// quarantine file), then forgets every recorded loss: ``recoveryReport`` and ``verify()``
    /// are clean again in every process (until new damage). Quarantine files
    /// (`.baton/defaults/<suite>.quarantine-<n>`) are kept; delete them when done with them.
    /// - Returns: The report as it was, with every loss just acknowledged.
    /// - Throws: `busy` when the writer lock stays held; file-system errors.
    @discardableResult
    public func acknowledgeRecovery() throws -> DefaultsRecoveryReport { try store.acknowledgeRecovery() }
}
