/// The reads and writes of one ``SharedDefaults/transaction(_:)``.
///
/// Reads see the store as it is, plus this transaction's own writes. At commit, every value the
/// transaction read must still be what it read, or the body runs again on fresh values; the
/// writes are then appended as one record, which every process sees all at once or not at all.
public struct DefaultsTransaction {
    let defaults: SharedDefaults
    /// The value each read key had when it was read (`nil`: absent).
    var reads: [String: DefaultsValue?] = [:]
    /// The writes in order, and the latest per key (for reading back).
    var writes: [DefaultsStore.PendingEntry] = []
    var written: [String: DefaultsValue?] = [:]

    init(defaults: SharedDefaults) { self.defaults = defaults }

    /// Reads `key` as `T`.
    /// - Returns: The value, or `nil` when the key is absent (or removed in this transaction).
    /// - Throws: `typeMismatch` when the value is stored as another type.
    public mutating func value<T: Codable>(_ type: T.Type, forKey key: String) throws -> T? {
        try SharedDefaults.validate(key: key)
        let stored: DefaultsValue?
        if let pending = written[key] {
            stored = pending
        } else if let read = reads[key] {
            stored = read
        } else {
            stored = try defaults.store.value(forKey: key, strict: true)
            reads[key] = .some(stored)
        }
        return try stored?.decode(T.self, key: key)
    }

    /// Sets `key` to `value` when the transaction commits.
    /// - Throws: `invalidName` or `tooLarge` past the limits; `invalidArgument` when `value`
    ///   does not encode.
    public mutating func set<T: Codable>(_ value: T, forKey key: String) throws {
        try SharedDefaults.validate(key: key)
        let encoded = try DefaultsValue.encode(value)
        try SharedDefaults.validate(value: encoded, key: key)
        writes.append(DefaultsStore.PendingEntry(operation: .set, key: key, value: encoded))
        written[key] = .some(encoded)
    }

    /// Removes `key` when the transaction commits.
    /// - Throws: `invalidName` when the key is empty or longer than 1 KiB.
    public mutating func removeValue(forKey key: String) throws {
        try SharedDefaults.validate(key: key)
        writes.append(DefaultsStore.PendingEntry(operation: .remove, key: key, value: nil))
        written[key] = .some(nil)
    }
}
