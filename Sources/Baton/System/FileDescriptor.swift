/// An open file descriptor with exactly one owner.
///
/// Non-copyable: the descriptor is closed once, by ``close()`` (or ``unlockAndClose()``), or by
/// the end of the owner's lifetime (a local at the end of its scope, a stored property when its
/// object goes away). A second close cannot be written: ``close()`` consumes the value, and the
/// compiler refuses any use after it. Pass ``rawValue`` to a system call while the owner is
/// alive (a borrow); never close that number yourself.
///
/// Modelled on swift-subprocess's `IODescriptor: ~Copyable`.
package struct FileDescriptor: ~Copyable, Sendable {
    /// The descriptor's number, borrowed for a system call made while this value is alive.
    package let rawValue: Int32

    /// Takes ownership of `rawValue`, a descriptor nothing else will close.
    package init(adopting rawValue: Int32) {
        precondition(rawValue >= 0, "FileDescriptor(adopting: \(rawValue)): not a descriptor")
        self.rawValue = rawValue
    }

    /// Closes the descriptor now.
    package consuming func close() {
        Sys.close(rawValue)
        discard self
    }

    /// Releases a `flock` held through this descriptor (`LOCK_UN`), then closes it: the lock is
    /// gone even while a spawned child still shares the open file description (see
    /// `Sys.unlockAndClose`).
    package consuming func unlockAndClose() {
        Sys.unlockAndClose(rawValue)
        discard self
    }

    /// Gives up ownership without closing: the caller now owns (and must close) the number.
    package consuming func release() -> Int32 {
        let rawValue = self.rawValue
        discard self
        return rawValue
    }

    deinit { Sys.close(rawValue) }
}
