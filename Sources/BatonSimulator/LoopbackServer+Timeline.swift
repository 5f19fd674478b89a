import BatonLoopback

extension LoopbackServer {
    /// The loopback server of a simulation: its events go to `timeline`, and `onPush` sends a
    /// push notification for a message no core is connected to take.
    /// - Throws: `systemCallFailed` when the socket cannot be bound.
    public convenience init(timeline: Timeline, onPush: @escaping @Sendable (String) -> Void) throws {
        try self.init(onEvent: { event in
            switch event {
            case .received(let id):
                timeline.record(.sent, process: "server", message: id)
            case .pushed(let id, let again):
                timeline.record(.push, process: "server", message: id, detail: again ? "again" : nil)
            case .delivered(let id, let pid):
                timeline.record(.delivered, process: "server", message: id, detail: "to pid \(pid)")
            case .acknowledged(let id):
                timeline.record(.acknowledged, process: "server", message: id)
            case .coreConnected(let pid, let epoch):
                timeline.record(.connectionOpened, process: "server", epoch: epoch, detail: "pid \(pid)")
            case .coreDisconnected(let pid):
                timeline.record(.connectionClosed, process: "server", detail: "pid \(pid)")
            case .overlap(let pid, let epoch, let others):
                timeline.record(.overlap, process: "server", epoch: epoch, detail: "pid \(pid) connected while pid \(others.map(String.init).joined(separator: ",")) was still connected")
            }
        }, onPush: onPush)
    }
}
