/// A typed key of ``SharedDefaults``: the name and the value's type in one constant.
///
/// ```swift
/// extension DefaultsKey where Value == Int {
///     static let launchCount = DefaultsKey("launchCount")
/// }
/// try defaults.set(3, for: .launchCount)
/// let count = defaults[.launchCount]      // Int?
/// ```
public struct DefaultsKey<Value: Codable>: Sendable, Hashable {
    /// The key's name in the store.
    public let name: String

    /// Creates a typed key.
    /// - Parameter name: 1 byte to 1 KiB of UTF-8.
    public init(_ name: String) { self.name = name }
}
