extension BatonError.Code {
    /// The channel was closed: nothing more can be sent on it.
    public static let closed = Self("closed")
    /// A channel frame failed its format or checksum check, or its payload could not be
    /// decoded as the channel's element type. The frame was skipped; the channel goes on.
    public static let malformedFrame = Self("malformedFrame")
    /// The feature is not available on this platform.
    public static let unsupported = Self("unsupported")
}
