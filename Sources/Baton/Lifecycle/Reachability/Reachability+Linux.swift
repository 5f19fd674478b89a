#if os(Linux)
import CBatonShims
import Synchronization

/// Reachability from the Linux kernel: an rtnetlink socket subscribed to link, address and
/// route changes (IPv4 and IPv6), read by one kernel-wait thread per monitor. Each batch of
/// messages recomputes the path from `getifaddrs(3)` (usable = up, running, not loopback,
/// with an address) and publishes it, so a supervisor learns of a change the moment the kernel
/// makes it, without polling.
///
/// The thread stops when the monitor is deinitialized.
public final class NetlinkReachability: Reachability {
    private let core: Core

    /// Opens the rtnetlink socket and starts the monitor.
    /// - Throws: `systemCallFailed` when the socket cannot be opened or bound.
    public init() throws {
        core = try Core()
        let core = self.core
        KernelThread.spawn(name: "baton-netlink") { core.run() }
    }

    deinit { core.stop() }

    public var currentPath: NetworkPath { core.paths.latest ?? NetworkPath(status: .unknown) }

    public func updates() -> AsyncStream<NetworkPath> { core.paths.subscribe() }

    /// The parsed kernel messages from now on, one element per message (for diagnostics).
    public func messages() -> AsyncStream<NetlinkMessage> { core.messages.subscribe() }

    /// The usable interfaces now, from `getifaddrs(3)`.
    static func usableInterfaces() -> [String] {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return [] }
        defer { freeifaddrs(list) }
        var names = Set<String>()
        var entry: UnsafeMutablePointer<ifaddrs>? = first
        while let current = entry {
            defer { entry = current.pointee.ifa_next }
            let flags = current.pointee.ifa_flags
            guard flags & UInt32(IFF_UP) != 0,
                  flags & UInt32(IFF_RUNNING) != 0,
                  flags & UInt32(IFF_LOOPBACK) == 0,
                  let address = current.pointee.ifa_addr else { continue }
            let family = Int32(address.pointee.sa_family)
            guard family == AF_INET || family == AF_INET6 else { continue }
            names.insert(String(cString: current.pointee.ifa_name))
        }
        return names.sorted()
    }

    /// The socket, the wake-up descriptor and the publishers, shared with the thread.
    private final class Core: Sendable {
        let socket: Int32
        /// The read end of a pipe; writing to ``wakeWriter`` stops the thread.
        let wake: Int32
        let wakeWriter: Int32
        let paths: Broadcast<NetworkPath>
        let messages = Broadcast<NetlinkMessage>()

        // RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_IFADDR | RTMGRP_IPV6_ROUTE
        static let groups: UInt32 = 0x1 | 0x10 | 0x40 | 0x100 | 0x400
        static let netlinkRoute: Int32 = 0

        init() throws {
            let fd = try Sys.retrying("socket") {
                libc_socket(AF_NETLINK, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), Self.netlinkRoute)
            }.get("opening an rtnetlink socket")
            // struct sockaddr_nl { sa_family_t nl_family; unsigned short nl_pad; u32 nl_pid; u32 nl_groups; }
            var address = (UInt16(AF_NETLINK), UInt16(0), UInt32(0), Self.groups)
            let bound = withUnsafeBytes(of: &address) { raw in
                Sys.retrying("bind") {
                    libc_bind(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
                }
            }
            do {
                _ = try bound.get("subscribing to rtnetlink link, address and route changes")
            } catch {
                Sys.close(fd)
                throw error
            }
            var pipeEnds: [Int32] = [-1, -1]
            guard pipe(&pipeEnds) == 0 else {
                let code = baton_errno()
                Sys.close(fd)
                throw BatonError.system(SystemCallError(call: "pipe2", errno: code), "starting the network monitor")
            }
            for end in pipeEnds { _ = baton_fcntl_int(end, F_SETFD, FD_CLOEXEC) }
            socket = fd
            wake = pipeEnds[0]
            wakeWriter = pipeEnds[1]
            let interfaces = NetlinkReachability.usableInterfaces()
            paths = Broadcast(initial: NetworkPath(status: interfaces.isEmpty ? .unreachable : .reachable, interfaces: interfaces))
        }

        func stop() {
            Sys.close(wakeWriter) // the thread sees the pipe's end of file
        }

        func run() {
            let capacity = 64 * 1024
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: capacity, alignment: 8)
            defer {
                buffer.deallocate()
                Sys.close(socket)
                Sys.close(wake)
            }
            var generation: UInt64 = 0
            var descriptors = [pollfd(fd: socket, events: Int16(POLLIN), revents: 0),
                               pollfd(fd: wake, events: Int16(POLLIN), revents: 0)]
            while true {
                let ready = poll(&descriptors, 2, -1)
                if ready < 0 {
                    if baton_errno() == EINTR { continue }
                    return
                }
                if descriptors[1].revents != 0 { return }
                guard descriptors[0].revents != 0 else { continue }
                // Drain every datagram that is ready, then publish one path for the batch.
                var parsed: [NetlinkMessage] = []
                var overrun = false
                while true {
                    let count = recv(socket, buffer.baseAddress, capacity, Int32(MSG_DONTWAIT))
                    if count > 0 {
                        parsed += NetlinkMessage.parse(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
                        continue
                    }
                    if count < 0 {
                        let code = baton_errno()
                        if code == EINTR { continue }
                        if code == ENOBUFS { overrun = true; continue } // messages were lost: recompute anyway
                    }
                    break
                }
                guard !parsed.isEmpty || overrun else { continue }
                for message in parsed { messages.yield(message) }
                generation &+= 1
                let interfaces = NetlinkReachability.usableInterfaces()
                paths.yield(NetworkPath(status: interfaces.isEmpty ? .unreachable : .reachable,
                                        interfaces: interfaces, generation: generation))
            }
        }
    }
}

@inline(__always) private func libc_socket(_ domain: Int32, _ type: Int32, _ proto: Int32) -> Int32 { socket(domain, type, proto) }
@inline(__always) private func libc_bind(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 { bind(fd, address, length) }
#endif
