#if canImport(Darwin)
import CBatonShims
import Darwin
import Dispatch
import Synchronization

/// The Apple-platform signal backend: notify(3). NOT TESTED on Linux CI; kept thin.
///
/// Names are prefixed with `baton.<random id>.` where the id is created once and kept in
/// `.baton/notify-id`, so other apps cannot flood or spoof this container's signals.
final class NotifySignalBackend: SignalBackend {
    private let prefix: String
    private let queue = DispatchQueue(label: "baton.signals")
    var executor: any TaskExecutor { globalConcurrentExecutor }

    init(container: SharedContainer) throws {
        let idFile = "notify-id"
        if let bytes = try container.readFile(idFile), bytes.count == 32 {
            prefix = "baton." + String(decoding: bytes, as: UTF8.self) + "."
        } else {
            let id = (0..<16).map { _ in String(UInt8.random(in: 0...255), radix: 16) }
                .map { $0.count == 1 ? "0" + $0 : $0 }.joined()
            try container.replaceFile(idFile, with: Array(id.utf8))
            prefix = "baton." + id + "."
        }
    }

    private func fullName(_ name: String) -> String { prefix + name }

    func post(_ name: String, state: UInt64?) throws {
        if let state {
            var token: Int32 = 0
            guard notify_register_check(fullName(name), &token) == NOTIFY_STATUS_OK else {
                throw BatonError(.systemCallFailed, "notify_register_check failed for \(name)")
            }
            notify_set_state(token, state)
            notify_cancel(token)
        }
        guard notify_post(fullName(name)) == NOTIFY_STATUS_OK else {
            throw BatonError(.systemCallFailed, "notify_post failed for \(name)")
        }
    }

    func state(of name: String) throws -> UInt64 {
        var token: Int32 = 0
        guard notify_register_check(fullName(name), &token) == NOTIFY_STATUS_OK else {
            throw BatonError(.systemCallFailed, "notify_register_check failed for \(name)")
        }
        defer { notify_cancel(token) }
        var value: UInt64 = 0
        notify_get_state(token, &value)
        return value
    }

    func register(_ observer: SignalObserver) throws -> any SignalRegistration {
        var token: Int32 = 0
        let status = notify_register_dispatch(fullName(observer.name), &token, queue) { [weak observer] token in
            var value: UInt64 = 0
            notify_get_state(token, &value)
            observer?.deliver(state: value)
        }
        guard status == NOTIFY_STATUS_OK else {
            throw BatonError(.systemCallFailed, "notify_register_dispatch failed for \(observer.name)")
        }
        return Registration(token: token)
    }

    private struct Registration: SignalRegistration {
        let token: Int32
        func cancel() { notify_cancel(token) }
    }
}
#endif
