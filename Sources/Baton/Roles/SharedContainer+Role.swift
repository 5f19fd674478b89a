extension SharedContainer {
    /// The role `name` of this container (see ``Role``).
    /// - Parameters:
    ///   - name: The role's name, `core` by default.
    ///   - options: Grace period and critical-section bound used when this process preempts.
    /// - Throws: `invalidName`, file-system errors.
    public func role(_ name: String = "core", options: RoleOptions = RoleOptions()) throws -> Role {
        try Role(self, name: name, options: options)
    }
}
