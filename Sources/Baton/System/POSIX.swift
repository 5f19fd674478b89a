/// Plain libc calls for Baton's own tools and tests (the CLI, the simulator, test support),
/// spelled the same on Linux and Apple platforms: inside types that declare their own `close`,
/// `read` or `kill`, the libc function needs a module qualifier, and that module is `Glibc` on
/// Linux and `Darwin` on Apple platforms. No retry, no error mapping: see `Sys` for those.
package enum POSIX {
    @discardableResult package static func close(_ fd: Int32) -> Int32 { libcClose(fd) }
    @discardableResult package static func read(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int { libcRead(fd, buffer, count) }
    @discardableResult package static func write(_ fd: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int { libcWrite(fd, buffer, count) }
    @discardableResult package static func kill(_ pid: pid_t, _ signal: Int32) -> Int32 { libcKill(pid, signal) }
    @discardableResult package static func pipe(_ fds: UnsafeMutablePointer<Int32>) -> Int32 { libcPipe(fds) }
    @discardableResult package static func connect(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 { libcConnect(fd, address, length) }
    @discardableResult package static func listen(_ fd: Int32, _ backlog: Int32) -> Int32 { libcListen(fd, backlog) }
    @discardableResult package static func accept(_ fd: Int32, _ address: UnsafeMutablePointer<sockaddr>?, _ length: UnsafeMutablePointer<socklen_t>?) -> Int32 { libcAccept(fd, address, length) }
}

private func libcClose(_ fd: Int32) -> Int32 { close(fd) }
private func libcRead(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int { read(fd, buffer, count) }
private func libcWrite(_ fd: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int { write(fd, buffer, count) }
private func libcKill(_ pid: pid_t, _ signal: Int32) -> Int32 { kill(pid, signal) }
private func libcPipe(_ fds: UnsafeMutablePointer<Int32>) -> Int32 { pipe(fds) }
private func libcConnect(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 { connect(fd, address, length) }
private func libcListen(_ fd: Int32, _ backlog: Int32) -> Int32 { listen(fd, backlog) }
private func libcAccept(_ fd: Int32, _ address: UnsafeMutablePointer<sockaddr>?, _ length: UnsafeMutablePointer<socklen_t>?) -> Int32 { accept(fd, address, length) }
