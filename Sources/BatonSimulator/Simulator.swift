import Baton
import CBatonShims
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// An iOS-like process model on Linux, for tests and the demo.
///
/// It launches the app and extension processes (the package's own `baton` executable in its
/// `sim-app` and `sim-extension` modes), moves the app between foreground, background and
/// suspension (tell it, wait a grace period, SIGSTOP; later SIGCONT and tell it), enforces the
/// extension's limits (time and resident memory), applies iOS's 0xDEAD10CC rule at each
/// suspension, and records every event in a ``Timeline``.
///
/// ```swift
/// let simulator = try Simulator(configuration: .init(executable: batonPath, container: dir, serverPort: server.port), timeline: timeline)
/// try await withThrowingDiscardingTaskGroup { group in
///     group.addTask { await simulator.run() }      // limits, idle extensions
///     try await simulator.launchApp()
///     await simulator.suspendApp()
///     ...
///     group.cancelAll()
/// }
/// ```
/// The simulator's own model is Linux-only (`/proc`); it is not meant for Apple platforms.
public final class Simulator: Sendable {
    /// Limits and timings.
    public struct Configuration: Sendable {
        /// The `baton` executable to launch in simulator modes.
        public var executable: String
        /// The shared container directory.
        public var container: String
        /// The loopback server's port, passed to the children.
        public var serverPort: UInt16
        /// An extension instance running longer than this gets its process killed (iOS: 30 s).
        public var extensionTimeLimit: Duration = .seconds(30)
        /// An extension process whose memory (as ``memoryMeasure`` counts it) passes this is
        /// killed (iOS: 24 MB).
        public var extensionMemoryLimit: UInt64 = 24 << 20
        /// How the memory limit counts.
        public var memoryMeasure: MemoryMeasure = .dirty
        /// How long the app has to release its locks after `will-suspend` before SIGSTOP.
        public var suspensionGrace: Duration = .seconds(5)
        /// An extension process idle this long is ended, as iOS reclaims it.
        public var extensionIdleLifetime: Duration = .seconds(3)
        /// At most this many instances run at once in one extension process.
        public var instancesPerExtension = 6
        /// How often limits are checked.
        public var watchInterval: Duration = .milliseconds(25)
        /// Extra arguments for the app process (test modes).
        public var appArguments: [String] = []
        /// The 0xDEAD10CC rule applied at each suspension.
        public var rule = DeadLockRule.apple
        /// The program run as the app; nil for Baton's own (`baton sim-app`).
        public var appProgram: Program?
        /// The program run as the notification service extension; nil for Baton's own (`baton sim-extension`).
        public var extensionProgram: Program?
        /// Whether an idle extension process is suspended (and checked against the rule) before
        /// it is told to terminate, rather than told at once.
        public var suspendsIdleExtensions = false
        /// How long before the time limit an extension is told `time-will-expire`.
        public var expiryWarning: Duration = .seconds(3)

        public init(executable: String, container: String, serverPort: UInt16) {
            self.executable = executable
            self.container = container
            self.serverPort = serverPort
        }
    }

    /// A program the simulator runs as the app or an extension, in any language: it follows the
    /// lifecycle protocol on the descriptor `BATON_LIFECYCLE_FD` names.
    public struct Program: Sendable, Hashable, Codable {
        /// The executable (looked up in `PATH` without a slash) and its arguments.
        public var command: [String]
        /// Extra environment variables.
        public var environment: [String: String]

        public init(command: [String], environment: [String: String] = [:]) {
            self.command = command
            self.environment = environment
        }

        public init(from decoder: any Decoder) throws {
            let values = try decoder.container(keyedBy: CodingKeys.self)
            command = try values.decode([String].self, forKey: .command)
            environment = try values.decodeIfPresent([String: String].self, forKey: .environment) ?? [:]
            guard !command.isEmpty else {
                throw DecodingError.dataCorruptedError(forKey: .command, in: values, debugDescription: "a program's command needs at least the executable")
            }
        }
    }

    /// What the extension memory limit counts.
    public enum MemoryMeasure: String, Sendable, CaseIterable {
        /// Resident memory (`VmRSS`): includes the clean pages of shared libraries (the Swift
        /// runtime, Foundation, SQLite), which iOS does not count.
        case resident
        /// Dirty memory (`Private_Dirty + Shared_Dirty`): the pages the process wrote, the
        /// closest Linux figure to iOS's `phys_footprint`, which its limit applies to.
        case dirty
    }

    /// Where the app is in its life.
    public enum AppPhase: String, Sendable {
        case notRunning = "not-running", foreground, background, suspended
    }

    public let configuration: Configuration
    public let timeline: Timeline

    private struct ExtensionProcess {
        var process: SimulatedProcess
        var instances: [String: UInt64] = [:]
        var idleSince: UInt64
        var exiting = false
        /// Instances told `time-will-expire`.
        var warned: Set<String> = []
    }

    private struct State {
        var app: SimulatedProcess?
        var phase = AppPhase.notRunning
        var appLaunches = 0
        var extensionLaunches = 0
        var extensions: [Int32: ExtensionProcess] = [:]
        var stalled: Set<Int32> = []
        /// Stopped by ``suspend(_:)`` (not by a chaos stall): only ``resume(_:)`` continues them.
        var suspended: Set<Int32> = []
        var coreHolder: Int32?
        var dead10ccKills: [DeadLockKill] = []
        var limitKills: [String: Int] = [:]
        /// Processes killed for a limit: until they are reaped they still read as running, and
        /// the next pass of ``watch()`` must not kill (and count) them again.
        var killedForLimit: Set<Int32> = []
        var peakExtensionResident: UInt64 = 0
        var peakExtensionDirty: UInt64 = 0
        var faultsInjected = 0
        var waiters: [UInt64: Waiter] = [:]
        var nextWaiter: UInt64 = 0
        var pushes = 0
    }

    private struct Waiter {
        var predicate: @Sendable (SimulatorEvent) -> Bool
        var matched: SimulatorEvent?
        var continuation: CheckedContinuation<SimulatorEvent?, Never>?
    }

    /// An event being waited for; register it before causing the event.
    public struct Expectation: Sendable {
        let id: UInt64
    }

    private let state = Mutex(State())

    public init(configuration: Configuration, timeline: Timeline) {
        self.configuration = configuration
        self.timeline = timeline
        signal(SIGPIPE, SIG_IGN)
    }

    // MARK: - Events

    private func record(_ event: SimulatorEvent) {
        timeline.record(event)
        let matched = state.withLock { state -> [CheckedContinuation<SimulatorEvent?, Never>] in
            switch event.kind {
            case .roleAcquired: state.coreHolder = event.pid
            case .roleReleased where state.coreHolder == event.pid: state.coreHolder = nil
            default: break
            }
            if event.kind == .instanceStarted, let message = event.message {
                state.extensions[event.pid]?.instances[message] = event.time
            }
            if event.kind == .instanceFinished, let message = event.message {
                state.extensions[event.pid]?.instances[message] = nil
                if state.extensions[event.pid]?.instances.isEmpty == true { state.extensions[event.pid]?.idleSince = event.time }
            }
            var ready: [CheckedContinuation<SimulatorEvent?, Never>] = []
            for (id, waiter) in state.waiters where waiter.matched == nil && waiter.predicate(event) {
                if let continuation = waiter.continuation {
                    state.waiters[id] = nil
                    ready.append(continuation)
                } else {
                    state.waiters[id]?.matched = event
                }
            }
            return ready
        }
        for continuation in matched { continuation.resume(returning: event) }
    }

    /// Records a simulator-side event (and wakes whoever waits for it).
    private func note(_ kind: SimulatorEvent.Kind, process: String, pid: Int32 = 0, message: String? = nil, detail: String? = nil) {
        record(SimulatorEvent(kind: kind, process: process, pid: pid, message: message, detail: detail))
    }

    /// Starts looking for the next event that satisfies `predicate`; ``wait(for:timeout:)`` returns it.
    public func expect(_ predicate: @escaping @Sendable (SimulatorEvent) -> Bool) -> Expectation {
        state.withLock { state in
            state.nextWaiter += 1
            state.waiters[state.nextWaiter] = Waiter(predicate: predicate)
            return Expectation(id: state.nextWaiter)
        }
    }

    /// The event an expectation found, waiting for it at most `timeout`; nil if none came.
    public func wait(for expectation: Expectation, timeout: Duration) async -> SimulatorEvent? {
        let id = expectation.id
        return await withTaskGroup(of: SimulatorEvent?.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    let matched = self.state.withLock { state -> SimulatorEvent?? in
                        guard let waiter = state.waiters[id] else { return .some(nil) }
                        if let matched = waiter.matched {
                            state.waiters[id] = nil
                            return .some(matched)
                        }
                        state.waiters[id]?.continuation = continuation
                        return .none
                    }
                    if let matched { continuation.resume(returning: matched) }
                }
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                let waiter = self.state.withLock { $0.waiters.removeValue(forKey: id) }
                waiter?.continuation?.resume(returning: nil)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }

    /// Waits for the next event that satisfies `predicate`; nil after `timeout`.
    public func waitForEvent(timeout: Duration, where predicate: @escaping @Sendable (SimulatorEvent) -> Bool) async -> SimulatorEvent? {
        await wait(for: expect(predicate), timeout: timeout)
    }

    private func processExited(_ process: SimulatedProcess, status: Int32) {
        let kind: SimulatorEvent.Kind = status > 128 ? .killed : .exited
        let detail = status > 128 ? "signal \(status - 128)" : "status \(status)"
        state.withLock { state in
            if state.coreHolder == process.pid { state.coreHolder = nil }
            state.extensions[process.pid] = nil
            state.killedForLimit.remove(process.pid) // its pid may be reused
            state.stalled.remove(process.pid)
            state.suspended.remove(process.pid)
            if state.app === process {
                state.app = nil
                state.phase = .notRunning
            }
        }
        record(SimulatorEvent(kind: kind, process: process.label, pid: process.pid, detail: detail))
    }

    private func spawn(label: String, mode: String, extra: [String] = []) throws -> SimulatedProcess {
        let program: Program? = switch mode {
        case "sim-app": configuration.appProgram
        case "sim-extension": configuration.extensionProgram
        default: nil
        }
        let command = program?.command ?? [configuration.executable, mode, "--container", configuration.container, "--port", String(configuration.serverPort)] + extra
        var environment = program?.environment ?? [:]
        environment["BATON_CONTAINER"] = configuration.container
        environment["BATON_ROLE"] = mode == "sim-extension" ? "extension" : mode == "sim-app" ? "app" : mode
        environment[DeadLockRule.environmentVariable] = configuration.rule.rawValue
        let process = try SimulatedProcess(
            label: label,
            executable: command[0],
            arguments: Array(command.dropFirst()),
            environment: environment,
            onEvent: { [weak self] _, event in self?.record(event) },
            onExit: { [weak self] process, status in self?.processExited(process, status: status) }
        )
        note(.launched, process: label, pid: process.pid)
        return process
    }

    // MARK: - The app

    /// The app's phase now.
    public var appPhase: AppPhase { state.withLock { $0.phase } }
    /// The app's process, if running.
    public var app: SimulatedProcess? { state.withLock { $0.app } }

    /// Launches the app (if not running) and brings it to the foreground. An app killed (SIGKILL:
    /// a fault, the system's termination) before it reported ready is left not running.
    /// - Throws: `simulationFailed` when the process cannot start, ends by itself before it
    ///   reports ready, or does not report ready within 20 s.
    public func foregroundApp() async throws {
        let (existing, phase) = state.withLock { ($0.app, $0.phase) }
        if existing != nil, phase == .suspended {
            resumeApp()
        }
        if let existing {
            state.withLock { $0.phase = .foreground }
            note(.foreground, process: existing.label, pid: existing.pid)
            existing.send(ChildCommand(.foreground))
            return
        }
        let number = state.withLock { state -> Int in
            state.appLaunches += 1
            return state.appLaunches
        }
        let label = "app#\(number)"
        // Ready, or gone before it (a start that failed says so at once, with its status, instead
        // of being waited for).
        let readyOrGone = expect { $0.process == label && [.ready, .exited, .killed].contains($0.kind) }
        let process = try spawn(label: label, mode: "sim-app", extra: configuration.appArguments)
        state.withLock { state in
            state.app = process
            state.phase = .foreground
        }
        guard let first = await wait(for: readyOrGone, timeout: .seconds(20)) else {
            process.signal(SIGKILL)
            throw BatonError(.simulationFailed, "the app process \(process.pid) did not report ready within 20 s")
        }
        guard first.kind == .ready else {
            if process.exitStatus == 128 + SIGKILL {
                // Killed by this simulator while it launched: a fault (one due just before the
                // open, run late on a loaded machine), the system's termination. That leaves the
                // app not running, as iOS may leave it, not a failed simulation: the next open
                // launches it again. (Waited for until the 20 s bound before, which failed a
                // seeded chaos run of `baton demo` now and then under load.)
                return
            }
            throw BatonError(.simulationFailed, "the app process \(process.pid) ended (\(first.detail ?? first.kind.rawValue)) before it reported ready; its output is above")
        }
        note(.foreground, process: label, pid: process.pid)
        process.send(ChildCommand(.foreground))
    }

    /// The user leaves the app: it keeps running in the background until suspended.
    public func backgroundApp() {
        guard let app = state.withLock({ state -> SimulatedProcess? in
            guard state.phase == .foreground else { return nil }
            state.phase = .background
            return state.app
        }) else { return }
        note(.background, process: app.label, pid: app.pid)
        app.send(ChildCommand(.background))
    }

    /// Suspends the app as iOS does: `will-suspend`, wait for it to release its locks (at most
    /// the grace period), SIGSTOP, then apply the 0xDEAD10CC rule.
    /// - Returns: Whether the app was killed for holding a lock while suspended.
    @discardableResult
    public func suspendApp() async -> Bool {
        guard let app = state.withLock({ state -> SimulatedProcess? in
            guard state.phase == .foreground || state.phase == .background, let app = state.app else { return nil }
            state.phase = .suspended
            return app
        }) else { return false }
        return await suspend(app)
    }

    /// Suspends any simulated process (the app, or a test's process): tell it, wait for its
    /// `released-locks` report (at most the grace period), SIGSTOP, check `/proc/locks`.
    /// - Returns: Whether it was killed for holding a lock on a file of the container.
    @discardableResult
    public func suspend(_ process: SimulatedProcess) async -> Bool {
        note(.willSuspend, process: process.label, pid: process.pid)
        let label = process.label
        let released = expect { $0.process == label && $0.kind == .releasedLocks }
        let grace = configuration.suspensionGrace.components
        process.send(ChildCommand(.willSuspend, graceMilliseconds: Int(grace.seconds * 1000 + grace.attoseconds / 1_000_000_000_000_000)))
        _ = await wait(for: released, timeout: configuration.suspensionGrace)
        guard process.isRunning else { return false }
        state.withLock { _ = $0.suspended.insert(process.pid) }
        process.signal(SIGSTOP)
        note(.suspended, process: process.label, pid: process.pid)
        return enforceDeadLockRule(process)
    }

    /// iOS's 0xDEAD10CC: a suspended process that holds a lock the rule forbids on a file of
    /// the shared container is killed. Returns whether it was.
    private func enforceDeadLockRule(_ process: SimulatedProcess) -> Bool {
        let container = configuration.container
        let held = ProcFS.heldLocks(of: process.pid, under: container)
        let violations = configuration.rule.violations(held) { ProcFS.header(of: container + "/" + $0) }
        guard !violations.isEmpty else { return false }
        process.signal(SIGKILL)
        let kill = DeadLockKill(process: process.label, pid: process.pid, rule: configuration.rule, violations: violations)
        state.withLock { $0.dead10ccKills.append(kill) }
        note(.dead10cc, process: process.label, pid: process.pid, detail: kill.description)
        return true
    }

    /// Resumes the suspended app: SIGCONT, then tell it.
    public func resumeApp() {
        guard let app = state.withLock({ state -> SimulatedProcess? in
            guard state.phase == .suspended, let app = state.app else { return nil }
            state.phase = .background
            return app
        }) else { return }
        resume(app)
    }

    /// Resumes a process suspended with ``suspend(_:)``.
    public func resume(_ process: SimulatedProcess) {
        let stalled = state.withLock { state -> Bool in
            state.suspended.remove(process.pid)
            return state.stalled.contains(process.pid)
        }
        if !stalled { process.signal(SIGCONT) }
        note(.resumed, process: process.label, pid: process.pid)
        process.send(ChildCommand(.resume))
    }

    /// The system terminates the app (SIGKILL), as iOS does to suspended apps it needs memory from.
    public func terminateApp() async {
        guard let app = state.withLock({ $0.app }) else { return }
        note(.fault, process: app.label, pid: app.pid, detail: "terminated by the system")
        let gone = expect { $0.pid == app.pid && ($0.kind == .killed || $0.kind == .exited) }
        app.signal(SIGKILL)
        _ = await wait(for: gone, timeout: .seconds(5))
    }

    // MARK: - Extensions

    /// A push arrived: hand it to a running extension process with room, or launch one.
    public func push(_ message: String, payload: String? = nil) {
        let target = state.withLock { state -> SimulatedProcess? in
            state.pushes += 1
            let candidates = state.extensions.values.filter {
                !$0.exiting && !state.stalled.contains($0.process.pid) && $0.instances.count < configuration.instancesPerExtension
            }
            guard let chosen = candidates.min(by: { $0.process.pid < $1.process.pid }) else { return nil }
            state.extensions[chosen.process.pid]?.instances[message] = baton_monotonic_ns()
            return chosen.process
        }
        if let target, target.send(ChildCommand(.push, message: message, payload: payload)) {
            note(.push, process: target.label, pid: target.pid, message: message)
            return
        }
        do {
            let number = state.withLock { state -> Int in
                state.extensionLaunches += 1
                return state.extensionLaunches
            }
            let process = try spawn(label: "extension#\(number)", mode: "sim-extension")
            state.withLock { state in
                var record = ExtensionProcess(process: process, idleSince: baton_monotonic_ns())
                record.instances[message] = baton_monotonic_ns()
                state.extensions[process.pid] = record
            }
            note(.push, process: process.label, pid: process.pid, message: message)
            process.send(ChildCommand(.push, message: message, payload: payload))
        } catch {
            note(.error, process: "simulator", message: message, detail: "could not launch an extension: \(error)")
        }
    }

    /// Launches an extension process with no push (tests).
    public func launchExtension() throws -> SimulatedProcess {
        let number = state.withLock { state -> Int in
            state.extensionLaunches += 1
            return state.extensionLaunches
        }
        let process = try spawn(label: "extension#\(number)", mode: "sim-extension")
        state.withLock { $0.extensions[process.pid] = ExtensionProcess(process: process, idleSince: baton_monotonic_ns() + 3_600_000_000_000) }
        return process
    }

    /// Launches any simulator mode of the executable as a tracked process (tests).
    public func launch(label: String, mode: String, arguments: [String] = []) throws -> SimulatedProcess {
        try spawn(label: label, mode: mode, extra: arguments)
    }

    // MARK: - Faults

    /// Injects one fault into the process its target names, if there is one now.
    /// - Returns: Whether a process was hit.
    @discardableResult
    public func inject(_ fault: FaultPlan.Fault) async -> Bool {
        let victim = state.withLock { state -> SimulatedProcess? in
            let app = state.app.flatMap { state.suspended.contains($0.pid) ? nil : $0 }
            let holder = state.coreHolder.flatMap { pid in app?.pid == pid ? app : state.extensions[pid]?.process }
            let oldestExtension = state.extensions.values.map(\.process).filter { !state.stalled.contains($0.pid) }.min { $0.pid < $1.pid }
            // The named target first; when it does not exist now, an extension (the app is
            // hit only when named or holding the core, so that its scripted life still shows).
            let order: [SimulatedProcess?] = switch fault.target {
            case .app: [app]
            case .extension: [oldestExtension, holder]
            case .coreHolder: [holder, oldestExtension]
            }
            return order.compactMap { $0 }.first { $0.isRunning && !state.stalled.contains($0.pid) }
        }
        guard let victim else {
            note(.fault, process: "simulator", detail: "\(fault) skipped: no such process now")
            return false
        }
        state.withLock { $0.faultsInjected += 1 }
        switch fault.action {
        case .kill:
            note(.fault, process: victim.label, pid: victim.pid, detail: "SIGKILL (\(fault.target.rawValue))")
            victim.signal(SIGKILL)
        case .stall(let milliseconds):
            note(.stalled, process: victim.label, pid: victim.pid, detail: "SIGSTOP for \(milliseconds) ms (\(fault.target.rawValue))")
            state.withLock { _ = $0.stalled.insert(victim.pid) }
            victim.signal(SIGSTOP)
            try? await Task.sleep(for: .milliseconds(milliseconds))
            let stillSuspended = state.withLock { state -> Bool in
                state.stalled.remove(victim.pid)
                return state.suspended.contains(victim.pid)
            }
            if !stillSuspended { victim.signal(SIGCONT) }
            note(.continued, process: victim.label, pid: victim.pid)
        }
        return true
    }

    /// Injects each fault of `plan` at its time after `start`, until the plan ends or the task is cancelled.
    public func run(_ plan: FaultPlan, from start: ContinuousClock.Instant) async {
        await withTaskGroup(of: Void.self) { faults in
            for fault in plan.faults {
                try? await Task.sleep(until: start + .milliseconds(Int(fault.at * 1000)), clock: .continuous)
                if Task.isCancelled { break }
                faults.addTask { await self.inject(fault) }
            }
        }
    }

    // MARK: - Watching

    /// Enforces the extension limits and ends idle extension processes until cancelled.
    public func run() async {
        await withDiscardingTaskGroup { group in
            while !Task.isCancelled {
                for process in watch() {
                    group.addTask { await self.retire(process) }
                }
                try? await Task.sleep(for: configuration.watchInterval)
            }
        }
    }

    /// Ends an idle extension process as iOS does: suspended first (and checked against the
    /// 0xDEAD10CC rule), then told to terminate.
    private func retire(_ process: SimulatedProcess) async {
        guard !(await suspend(process)), process.isRunning else { return }
        resume(process)
        process.send(ChildCommand(.exit))
    }

    /// Checks the limits; returns the idle extension processes to suspend before they end.
    private func watch() -> [SimulatedProcess] {
        var retiring: [SimulatedProcess] = []
        let now = baton_monotonic_ns()
        let extensions = state.withLock { Array($0.extensions.values) }
        let timeLimit = UInt64(configuration.extensionTimeLimit.components.seconds) * 1_000_000_000
            + UInt64(configuration.extensionTimeLimit.components.attoseconds / 1_000_000_000)
        let idleLimit = UInt64(configuration.extensionIdleLifetime.components.seconds) * 1_000_000_000
            + UInt64(configuration.extensionIdleLifetime.components.attoseconds / 1_000_000_000)
        for record in extensions where record.process.isRunning {
            let process = record.process
            let resident = ProcFS.residentMemory(of: process.pid)
            let dirty = ProcFS.dirtyMemory(of: process.pid)
            state.withLock { state in
                state.peakExtensionResident = max(state.peakExtensionResident, resident?.peak ?? 0)
                state.peakExtensionDirty = max(state.peakExtensionDirty, dirty ?? 0)
            }
            let counted = configuration.memoryMeasure == .resident ? resident?.resident : dirty
            if let counted, counted > configuration.extensionMemoryLimit {
                kill(process, reason: "memory", detail: "\(configuration.memoryMeasure.rawValue) memory \(counted >> 20) MiB passed the limit of \(configuration.extensionMemoryLimit >> 20) MiB")
                continue
            }
            if let oldest = record.instances.values.min(), now > oldest, now - oldest > timeLimit {
                kill(process, reason: "time", detail: "an instance ran longer than \(configuration.extensionTimeLimit)")
                continue
            }
            let warning = UInt64(configuration.expiryWarning.components.seconds) * 1_000_000_000
            for (message, started) in record.instances where !record.warned.contains(message) && now > started && now - started + warning > timeLimit {
                state.withLock { _ = $0.extensions[process.pid]?.warned.insert(message) }
                note(.timeWillExpire, process: process.label, pid: process.pid, message: message)
                process.send(ChildCommand(.timeWillExpire, message: message))
            }
            if record.instances.isEmpty, !record.exiting, now > record.idleSince, now - record.idleSince > idleLimit,
               !state.withLock({ $0.stalled.contains(process.pid) }) {
                state.withLock { $0.extensions[process.pid]?.exiting = true }
                if configuration.suspendsIdleExtensions {
                    retiring.append(process)
                } else {
                    process.send(ChildCommand(.exit))
                }
            }
        }
        return retiring
    }

    private func kill(_ process: SimulatedProcess, reason: String, detail: String) {
        let first = state.withLock { state -> Bool in
            guard state.killedForLimit.insert(process.pid).inserted else { return false }
            state.limitKills[reason, default: 0] += 1
            return true
        }
        guard first else { return }
        note(.limit, process: process.label, pid: process.pid, detail: detail)
        process.signal(SIGKILL)
    }

    /// Ends every process: `exit` to each, then SIGKILL after a moment.
    public func shutdown() async {
        let processes = state.withLock { state -> [SimulatedProcess] in
            (state.app.map { [$0] } ?? []) + state.extensions.values.map(\.process)
        }
        for process in processes {
            process.signal(SIGCONT)
            process.send(ChildCommand(.exit))
        }
        for _ in 0..<100 where processes.contains(where: \.isRunning) {
            try? await Task.sleep(for: .milliseconds(20))
        }
        for process in processes where process.isRunning { process.signal(SIGKILL) }
        for _ in 0..<100 where processes.contains(where: \.isRunning) {
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    // MARK: - Figures

    /// Processes killed at suspension for holding a lock in the container.
    public var deadLockKills: Int { state.withLock { $0.dead10ccKills.count } }
    /// Each 0xDEAD10CC kill, with the locks that caused it.
    public var deadLockKillRecords: [DeadLockKill] { state.withLock { $0.dead10ccKills } }
    /// Extension processes killed for passing a limit, by reason (`memory`, `time`).
    public var limitKills: [String: Int] { state.withLock { $0.limitKills } }
    /// The highest resident memory seen in any extension process (VmHWM), in bytes.
    public var peakExtensionResidentMemory: UInt64 { state.withLock { $0.peakExtensionResident } }
    /// The highest dirty memory seen in any extension process, in bytes.
    public var peakExtensionDirtyMemory: UInt64 { state.withLock { $0.peakExtensionDirty } }
    /// Faults that hit a process.
    public var faultsInjected: Int { state.withLock { $0.faultsInjected } }
    /// Launches so far.
    public var launches: (apps: Int, extensions: Int) { state.withLock { ($0.appLaunches, $0.extensionLaunches) } }
    /// Pushes received.
    public var pushes: Int { state.withLock { $0.pushes } }
    /// The pid holding the core role now, as the children reported.
    public var coreHolder: Int32? { state.withLock { $0.coreHolder } }
}
