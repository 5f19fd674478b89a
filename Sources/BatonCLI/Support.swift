import Dispatch
import Synchronization
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// Waits for SIGTERM or SIGINT without blocking a thread.
///
/// Call ``prepare()`` first thing in a command that waits for it: a signal that arrives before
/// the handlers are in place would kill the process (a test may send SIGTERM as soon as the
/// command says it is ready, while its main task has not reached ``wait()`` yet).
enum TerminationSignal {
    private static let state = Mutex<(fired: Bool, next: Int, waiters: [Int: CheckedContinuation<Void, Never>])>((false, 0, [:]))
    private nonisolated(unsafe) static var sources: [any DispatchSourceSignal] = []
    private static let installed: Void = {
        let queue = DispatchQueue(label: "baton.termination")
        for number in [SIGTERM, SIGINT] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler { TerminationSignal.fire() }
            source.resume()
            sources.append(source)
        }
    }()

    /// Catches SIGTERM and SIGINT from now on (idempotent).
    static func prepare() { _ = installed }

    /// Returns once SIGTERM or SIGINT has arrived (since ``prepare()``), or when the task is
    /// cancelled.
    static func wait() async {
        prepare()
        let id = state.withLock { state -> Int in
            state.next += 1
            return state.next
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.fired || Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }

    private static func fire() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.fired = true
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }
}

/// A JSON value for the command line's machine-readable output.
enum JSONValue: Encodable, Sendable {
    case string(String)
    case int(Int)
    case double(Double)
    case bool(Bool)
    case null
    case array([JSONValue])
    case object([String: JSONValue])

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .string(let value): try container.encode(value)
        case .int(let value): try container.encode(value)
        case .double(let value): try container.encode(value)
        case .bool(let value): try container.encode(value)
        case .null: try container.encodeNil()
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }
}

func jsonLine(_ value: some Encodable) throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return String(decoding: try encoder.encode(value), as: UTF8.self)
}
