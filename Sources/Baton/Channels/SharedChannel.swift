#if canImport(FoundationEssentials)
import CBatonShims
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// A CSP channel between tasks and between processes: many senders, many receivers, every
/// element delivered to exactly one receiver.
///
/// ```swift
/// let container = try SharedContainer(at: groupURL)
/// let jobs = try SharedChannel<Job>(container, name: "jobs", capacity: .bounded(64))
/// try await jobs.send(job)                           // in the app
/// for try await job in jobs { try await run(job) }   // in the extension; ends after close()
/// ```
///
/// - ``ChannelCapacity/rendezvous``: `send` returns once a receiver took the element.
/// - ``ChannelCapacity/bounded(_:)``: `send` waits while `n` elements are in the channel.
/// - ``ChannelCapacity/unbounded``: `send` never waits; the channel file grows.
///
/// Every wait is cancellable and has a deadline; a cancelled or timed-out wait leaves the channel
/// as it was (a cancelled `send` did not send, a cancelled `receive` took nothing).
///
/// A receiver *takes* an element, decodes it, then *acknowledges* it. If the receiving process
/// dies in between (even by SIGKILL), the element goes back to the channel: the kernel drops the
/// receiver's lock on its participant byte of the channel file, and the next receiver returns
/// the element. Elements travel as versioned frames checked with CRC-32C; a damaged frame makes
/// one `receive` throw `malformedFrame` and is skipped, and the channel goes on.
///
/// Across processes, the channel is `.baton/channels/<name>` in the container, protected by a
/// `SharedMutex` held for microseconds (a dead holder is found through its owner token); waits
/// sleep on shared words (`AddressWait`: a futex on Linux) through one
/// thread per open channel and direction (receiving, sending), started on the first wait. An
/// unbounded channel's file grows with its backlog and reuses the space of consumed elements. ``init(capacity:)`` makes the same channel inside one
/// process. Elements are encoded as JSON, except `String` (UTF-8 text) and `[UInt8]` or `Data`
/// (raw bytes). Linux only for now.
public final class SharedChannel<Element: Codable & Sendable>: Sendable {
    let log: ChannelLog
    /// Identifies this object's frames: a random start, then one more per frame.
    private let sendIDs = Atomic<UInt64>(UInt64.random(in: 1...UInt64.max))
    private let encoder = JSONEncoder()
    private let decoder = JSONDecoder()
    /// How `Element` travels, decided once from its type.
    private let representation = Representation(Element.self)

    /// How elements are encoded: `String` as UTF-8 text, `[UInt8]` and `Data` as raw bytes,
    /// anything else as JSON.
    enum Representation {
        case text, bytes, data, json

        init(_ type: Element.Type) {
            if type == String.self { self = .text }
            else if type == [UInt8].self { self = .bytes }
            else if type == Data.self { self = .data }
            else { self = .json }
        }
    }

    /// How many elements the channel buffers.
    public var capacity: ChannelCapacity { log.capacity }

    /// The channel's name, or `nil` for an in-process channel.
    public let name: String?

    /// Opens (creating when missing) the channel `name` of a container.
    ///
    /// - Parameters:
    ///   - container: The shared container.
    ///   - name: 1 to 255 bytes, no `/`; the file is `.baton/channels/<name>`.
    ///   - capacity: The capacity; it must match the capacity the channel was created with.
    /// - Throws: `invalidName`; `invalidArgument` when the channel exists with another capacity;
    ///   `corrupt` when its file is not a valid channel; file-system errors.
    public init(_ container: SharedContainer, name: String, capacity: ChannelCapacity) throws {
        log = try ChannelLog(container: container, name: name, capacity: capacity)
        self.name = name
    }

    /// Opens an existing channel with whatever capacity it was created with, or creates it with
    /// `capacity` when it does not exist.
    ///
    /// - Throws: As ``init(_:name:capacity:)``.
    public init(_ container: SharedContainer, existingOrNewNamed name: String, capacity: ChannelCapacity) throws {
        let stored = try ChannelLog.storedCapacity(container: container, name: name)
        log = try ChannelLog(container: container, name: name, capacity: stored ?? capacity)
        self.name = name
    }

    /// A channel between the tasks of this process, with the same behaviour.
    public init(capacity: ChannelCapacity) {
        log = ChannelLog(memoryCapacity: capacity)
        name = nil
    }

    /// An executor whose thread sleeps in the kernel on the channel word its task waits for.
    ///
    /// A send or receive that has to wait, made inside
    /// `withTaskExecutorPreference(channel.executor) { ... }`, is woken by the ring of another
    /// process directly on the thread that runs the task: one thread wake-up per hop instead of
    /// two (the doorbell's thread, then a thread of the cooperative pool). On a loaded machine,
    /// where every wake-up waits for a core, that halves the latency of a conversation. One
    /// executor (one thread) per process, shared by every channel; it sleeps on one task's wait
    /// at a time (other waits on it work as anywhere else). Keep the work on it short and never
    /// block in it.
    ///
    /// A send or receive made there that would wake a waiter asleep on the same processor makes
    /// its ring when the task next waits or suspends (at the latest when its turn on the thread
    /// ends), so that the woken process does not take the processor while this task still runs:
    /// another reason to keep the work between two awaits short.
    public var executor: any TaskExecutor { ChannelExecutor.shared }

    // MARK: Sending

    /// Sends an element, waiting for a receiver (rendezvous) or for room (bounded).
    ///
    /// Runs on the caller's executor until it waits (`nonisolated(nonsending)`): called from an
    /// actor, the element is encoded and appended there, without a hop to the global executor
    /// and back. A large `Codable` element is best sent from a task off the main actor.
    ///
    /// - Parameters:
    ///   - element: The element.
    ///   - deadline: When to give up.
    /// - Throws: `closed` when the channel is closed, `timedOut` at the deadline,
    ///   `CancellationError` when the task is cancelled (in both cases nothing was sent).
    @_specialize(exported: true, where Element == String)
    @_specialize(exported: true, where Element == [UInt8])
    @_specialize(exported: true, where Element == Data)
    nonisolated(nonsending) public func send(_ element: Element, deadline: Deadline = .never) async throws {
        switch capacity {
        case .unbounded:
            _ = try append(element, mode: .always)
        case .bounded(let limit):
            while true {
                let seen = log.writable.snapshot()
                if try append(element, mode: .ifRoom(limit)) != nil { return }
                try await log.writable.wait(after: seen, deadline: deadline)
            }
        case .rendezvous:
            // A select of one case: the element is offered under a claim word, so that it is
            // taken at most once, and never after this send gave up (or its process died).
            try await sendRendezvous(element, deadline: deadline)
        }
    }

    /// Encodes `element` and appends its frame. Returns the frame's send id, or `nil` when
    /// `mode` found no room (or no waiting receiver).
    @_specialize(exported: true, where Element == String)
    @_specialize(exported: true, where Element == [UInt8])
    @_specialize(exported: true, where Element == Data)
    func append(_ element: Element, mode: ChannelLog.AppendMode) throws -> UInt64? {
        let (sendID, result) = try append(element, mode: mode, own: nil)
        guard case .appended = result else { return nil }
        return sendID
    }

    /// ``append(_:mode:)`` for a registered select (`own`: see ``ChannelLog/append(payload:coding:sendID:mode:own:)``).
    func append(_ element: Element, mode: ChannelLog.AppendMode, own: ChannelWaiterTable.Waiter?) throws -> (UInt64, ChannelLog.AppendResult) {
        let sendID = sendIDs.wrappingAdd(1, ordering: .relaxed).newValue
        let result = try withPayload(element) { payload, coding in
            try log.append(payload: payload, coding: coding, sendID: sendID, mode: mode, own: own)
        }
        return (sendID, result)
    }

    /// ``trySend(_:)`` for a select; `own` as in ``append(_:mode:own:)``.
    func trySend(_ element: Element, own: ChannelWaiterTable.Waiter?) throws -> ChannelLog.AppendResult {
        switch capacity {
        case .unbounded: return try append(element, mode: .always, own: own).1
        case .bounded(let limit): return try append(element, mode: .ifRoom(limit), own: own).1
        case .rendezvous: return try append(element, mode: .handoff, own: own).1
        }
    }

    /// Sends without waiting.
    ///
    /// On a rendezvous channel this succeeds only when a receiver is waiting at that moment and
    /// this call claims it: the element is then that receiver's (a `select` waiting on several
    /// channels is claimed once, by one of them).
    /// - Returns: `true` when sent, `false` when the channel is full (or no receiver waits).
    /// - Throws: `closed` when the channel is closed.
    @_specialize(exported: true, where Element == String)
    @_specialize(exported: true, where Element == [UInt8])
    @_specialize(exported: true, where Element == Data)
    public func trySend(_ element: Element) throws -> Bool {
        switch capacity {
        case .unbounded: return try append(element, mode: .always) != nil
        case .bounded(let limit): return try append(element, mode: .ifRoom(limit)) != nil
        case .rendezvous: return try append(element, mode: .handoff) != nil
        }
    }

    // MARK: Receiving

    /// Receives the next element, waiting for one.
    ///
    /// Runs on the caller's executor until it waits, and again once woken
    /// (`nonisolated(nonsending)`): called from an actor, the element is decoded there.
    ///
    /// - Parameter deadline: When to give up.
    /// - Returns: The element, or `nil` once the channel is closed and drained.
    /// - Throws: `malformedFrame` for a damaged frame or an element that does not decode (it is
    ///   skipped: the next call goes on with the next element); `timedOut`; `CancellationError`.
    @_specialize(exported: true, where Element == String)
    @_specialize(exported: true, where Element == [UInt8])
    @_specialize(exported: true, where Element == Data)
    nonisolated(nonsending) public func receive(deadline: Deadline = .never) async throws -> Element? {
        if capacity == .rendezvous {
            // A select of one case: registered under a claim word, so that a `trySend` hands it
            // an element only while it waits.
            return try await receiveRendezvous(deadline: deadline)
        }
        // Set once another process was seen holding a taken element: then a wait also watches
        // for processes releasing their owner tokens (a taker may die).
        var deaths: (counter: EventCounter, seen: UInt64)?
        while true {
            let seen = log.readable.snapshot()
            if let counter = deaths?.counter { deaths = (counter, counter.snapshot()) }
            switch try attemptReceive() {
            case .element(let element): return element
            case .end: return nil
            case .retry, .ownClaimed: continue
            case .empty(let othersTaking):
                if othersTaking, try log.recoverDeadTakers() { continue }
                if othersTaking, deaths == nil, let counter = try log.ownerReleases() {
                    // Snapshot the death events before looking again.
                    deaths = (counter, counter.snapshot())
                    continue
                }
                if let deaths {
                    if log.readable.spin(after: seen) { continue }
                    try await waitForArrivalOrDeath(seen: seen, deaths: deaths.counter, deathsSeen: deaths.seen, deadline: deadline)
                } else {
                    try await log.readable.wait(after: seen, deadline: deadline)
                }
            }
        }
    }

    /// Test support: the process kills itself (SIGKILL) right after its next acknowledgement
    /// released the channel's lock.
    package static func killProcessAfterNextAcknowledgeForTesting() {
        ChannelLog.killAfterAcknowledge.store(true, ordering: .relaxed)
    }

    /// Test support: the process kills itself (SIGKILL) after its next operation that owes a
    /// ring released the channel's lock, before it rings.
    package static func killProcessBeforeNextRingForTesting() {
        ChannelLog.killBeforeRing.store(true, ordering: .relaxed)
    }

    /// Receives without waiting.
    /// - Returns: An element, or `nil` when none is ready (or the channel is closed and drained).
    /// - Throws: `malformedFrame` as ``receive(deadline:)``.
    @_specialize(exported: true, where Element == String)
    @_specialize(exported: true, where Element == [UInt8])
    @_specialize(exported: true, where Element == Data)
    public func tryReceive() throws -> Element? {
        while true {
            switch try attemptReceive() {
            case .element(let element): return element
            case .end: return nil
            case .retry, .ownClaimed: continue
            case .empty(let othersTaking):
                if othersTaking, try log.recoverDeadTakers() { continue }
                return nil
            }
        }
    }

    enum Attempt {
        case element(Element)
        case empty(othersTaking: Bool)
        case end
        case retry
        /// The select's own waiter was claimed first (see ``ChannelLog/take(acknowledge:own:addressedTo:_:)``).
        case ownClaimed
    }

    /// Takes, decodes and acknowledges one element.
    @_specialize(exported: true, where Element == String)
    @_specialize(exported: true, where Element == [UInt8])
    @_specialize(exported: true, where Element == Data)
    /// `registering`: see ``ChannelLog/take(acknowledge:own:addressedTo:registering:_:)``.
    func attemptReceive(own: ChannelWaiterTable.Waiter? = nil, addressedTo: ChannelWaiterTable.Waiter? = nil, registering: Int? = nil) throws -> Attempt {
        if representation != .json {
            // Text and bytes become the element by copying them out of the channel, which cannot
            // fail: take, copy and acknowledge in one critical section.
            var decoded: Element?
            var failure: (any Error)?
            switch try log.take(acknowledge: true, own: own, addressedTo: addressedTo, registering: registering, { payload, coding in
                do { decoded = try decodeInPlace(payload, coding: coding) } catch { failure = error }
            }) {
            case .taken:
                if let decoded { return .element(decoded) }
                throw BatonError(.malformedFrame, "an element of the channel \(name ?? "(in-process)") does not decode as \(Element.self); it was skipped and the channel goes on", cause: failure)
            case .malformed(let message): throw BatonError(.malformedFrame, message)
            case .empty(let othersTaking): return .empty(othersTaking: othersTaking)
            case .end: return .end
            case .ownClaimed: return .ownClaimed
            }
        }
        var payload: [UInt8] = []
        switch try log.take(own: own, addressedTo: addressedTo, registering: registering, { bytes, _ in payload = [UInt8](bytes) }) {
        case .taken(let taken):
            let element: Element
            do {
                element = try decode(payload, coding: taken.coding)
            } catch {
                _ = try log.acknowledge(taken)
                throw BatonError(.malformedFrame, "an element of the channel \(name ?? "(in-process)") does not decode as \(Element.self); it was skipped and the channel goes on", cause: error)
            }
            return try log.acknowledge(taken) ? .element(element) : .retry
        case .malformed(let message):
            throw BatonError(.malformedFrame, message)
        case .empty(let othersTaking):
            return .empty(othersTaking: othersTaking)
        case .end:
            return .end
        case .ownClaimed:
            return .ownClaimed
        }
    }

    /// Takes an element without acknowledging it: if this process dies before
    /// ``ChannelDelivery/acknowledge()``, the element goes back to the channel.
    package func takeUnacknowledged(deadline: Deadline) async throws -> ChannelDelivery<Element>? {
        while true {
            let seen = log.readable.snapshot()
            var payload: [UInt8] = []
            switch try log.take({ bytes, _ in payload = [UInt8](bytes) }) {
            case .taken(let taken):
                do {
                    return ChannelDelivery(element: try decode(payload, coding: taken.coding), taken: taken, log: log)
                } catch {
                    try log.release(taken)
                    throw BatonError(.malformedFrame, "an element of the channel does not decode as \(Element.self)")
                }
            case .malformed(let message): throw BatonError(.malformedFrame, message)
            case .end: return nil
            case .ownClaimed: continue
            case .empty(let othersTaking):
                if othersTaking, try log.recoverDeadTakers() { continue }
                try await log.readable.wait(after: seen, deadline: deadline)
            }
        }
    }

    /// Test support: holds the channel's cross-process mutex until the process is killed.
    package func holdLockForever(_ locked: () -> Void) throws -> Never {
        try log.holdLockForever(locked)
    }

    /// Waits for an arrival or for a close event on the channel file (a taker may have died);
    /// after a close event, checks the takers a few times (the kernel reports the close a moment
    /// before it drops the dead process's locks).
    private func waitForArrivalOrDeath(seen: UInt32, deaths: EventCounter, deathsSeen: UInt64, deadline: Deadline) async throws {
        let readable = log.readable
        let slice = deadline.earliest(.after(.milliseconds(250)))
        let first: Int
        do {
            first = try await ChannelWaits.first([
                { try await readable.wait(after: seen, deadline: slice, spinning: false) },
                { try await deaths.wait(after: deathsSeen, deadline: slice) },
            ])
        } catch let error as BatonError where error.code == .timedOut {
            if deadline.hasPassed { throw error }
            return
        }
        if first == 1 {
            for delay in [0, 50, 200, 1_000, 4_000] {
                if delay > 0 { try await Task.sleep(for: .microseconds(delay)) }
                if try log.recoverDeadTakers() { return }
            }
        }
    }

    // MARK: Closing

    /// Closes the channel (for every process): later sends throw `closed`; receivers get the
    /// elements still in the channel, then `nil`.
    /// - Throws: Only if the channel's lock fails.
    public func close() throws { try log.close() }

    /// Whether the channel was closed.
    public var isClosed: Bool { log.isClosed }

    // MARK: Coding

    /// Calls `body` with the encoded element: a `String` as its UTF-8 text, `[UInt8]` and `Data`
    /// as their bytes, anything else as JSON.
    func withPayload<R>(_ element: Element, _ body: (UnsafeRawBufferPointer, ChannelFrame.Coding) throws -> R) throws -> R {
        switch representation {
        case .text:
            var text = Self.identity(element, as: String.self)
            return try text.withUTF8 { try body(UnsafeRawBufferPointer($0), .text) }
        case .bytes:
            return try Self.identity(element, as: [UInt8].self).withUnsafeBytes { try body($0, .bytes) }
        case .data:
            return try Self.identity(element, as: Data.self).withUnsafeBytes { try body($0, .bytes) }
        case .json:
            let encoded: Data
            do {
                encoded = try encoder.encode(element)
            } catch {
                throw BatonError(.invalidArgument, "the element does not encode as JSON: \(type(of: error))")
            }
            return try encoded.withUnsafeBytes { try body($0, .json) }
        }
    }

    /// `value` as `type`, which is its own type (checked).
    private static func identity<T, U>(_ value: T, as type: U.Type) -> U {
        precondition(T.self == U.self)
        return withUnsafePointer(to: value) { $0.withMemoryRebound(to: U.self, capacity: 1) { $0.pointee } }
    }

    /// Decodes a payload in the channel's memory into a `String`, `[UInt8]` or `Data` element
    /// (the element type's own coding), or through JSON for another coding.
    private func decodeInPlace(_ payload: UnsafeRawBufferPointer, coding: ChannelFrame.Coding) throws -> Element {
        switch (representation, coding) {
        case (.text, .text): return Self.identity(String(decoding: payload, as: UTF8.self), as: Element.self)
        case (.bytes, .bytes): return Self.identity([UInt8](payload), as: Element.self)
        case (.data, .bytes): return Self.identity(Data(payload), as: Element.self)
        default: return try decode([UInt8](payload), coding: coding)
        }
    }

    /// Decodes a payload. Text and bytes decode directly into `String`, `[UInt8]` or `Data`, and
    /// through JSON into any other type (a `String` into an enum of JSON values, say).
    func decode(_ payload: [UInt8], coding: ChannelFrame.Coding) throws -> Element {
        switch coding {
        case .json:
            return try decoder.decode(Element.self, from: Data(payload))
        case .text:
            let text = String(decoding: payload, as: UTF8.self)
            if let element = text as? Element { return element }
            return try decoder.decode(Element.self, from: encoder.encode(text))
        case .bytes:
            if let element = payload as? Element { return element }
            if let element = Data(payload) as? Element { return element }
            return try decoder.decode(Element.self, from: encoder.encode(payload))
        }
    }
}

extension SharedChannel: AsyncSequence {
    public typealias Failure = any Error

    public func makeAsyncIterator() -> Iterator { Iterator(channel: self) }

    /// Receives until the channel is closed and drained.
    public struct Iterator: AsyncIteratorProtocol {
        let channel: SharedChannel
        public mutating func next() async throws -> Element? {
            try await channel.receive()
        }
    }
}

/// An element taken from a channel and not yet acknowledged.
package final class ChannelDelivery<Element: Codable & Sendable>: Sendable {
    package let element: Element
    private let taken: ChannelLog.Taken
    private let log: ChannelLog
    private let settled = Mutex(false)

    init(element: Element, taken: ChannelLog.Taken, log: ChannelLog) {
        self.element = element
        self.taken = taken
        self.log = log
    }

    /// Removes the element from the channel for good. `false` when it had gone back already.
    package func acknowledge() throws -> Bool {
        guard settled.withLock({ let was = $0; $0 = true; return !was }) else { return false }
        return try log.acknowledge(taken)
    }

    /// Puts the element back for another receiver.
    package func release() throws {
        guard settled.withLock({ let was = $0; $0 = true; return !was }) else { return }
        try log.release(taken)
    }

    deinit { try? release() }
}
