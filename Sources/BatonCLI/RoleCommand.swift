import ArgumentParser
import Baton
import BatonCommandSupport
import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `baton role ...`: acquire a role and watch its status from the command line.
struct RoleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "role",
        abstract: "Acquire a role (main/executor arbitration) or show who holds it.",
        subcommands: [Acquire.self, Status.self]
    )

    struct Acquire: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Acquire a role, hold it, and print one JSON object per line for each event.",
            discussion: """
                Events: acquired, stop-requested, critical-begin, critical-end, suspended, resumed, \
                released, lost, busy, interrupted. Exit status: 0 after a release (SIGTERM or SIGINT \
                releases the role and exits 0; while waiting they stop the wait), 3 on timeout, 4 when \
                busy (held or awaited at a higher priority), 5 when the lease was lost (overtaken, or \
                taken while suspended).
                """)
        @OptionGroup var options: ContainerOptions
        @Argument(help: "The role's name.") var name = "core"
        @Option(help: "main (100) or executor (10).") var role: String?
        @Option(help: "Any integer priority (instead of --role).") var priority: Int?
        @Option(help: "What this process is, shown in the status.") var kind: String?
        @Option(help: "Give up after this many seconds (default: wait forever).", transform: ArgumentCheck.seconds) var timeout: Double?
        @Option(help: "Hold the role this many seconds unless asked to stop (default: release at once).", transform: ArgumentCheck.seconds) var hold: Double?
        @Option(help: "Run a critical section of this many seconds right after acquiring.", transform: ArgumentCheck.seconds) var critical: Double?
        @Flag(help: "Do not release when asked to stop (to be overtaken).") var ignoreStop = false
        @Option(help: "Call suspend() after this many seconds and keep running without any lock.", transform: ArgumentCheck.seconds) var suspendAfter: Double?
        @Option(help: "With --suspend-after: call resume() this many seconds after suspending.", transform: ArgumentCheck.seconds) var resumeAfter: Double?
        @Option(help: "Grace period, in seconds, given to a holder this process preempts.", transform: ArgumentCheck.seconds) var grace: Double?
        @Option(help: "Bound, in seconds, on waiting for a preempted holder's critical section.", transform: ArgumentCheck.seconds) var maxCriticalWait: Double?

        func validate() throws {
            guard (role == nil) != (priority == nil) else {
                throw ValidationError("pass exactly one of --role main|executor and --priority N")
            }
            if let role, role != "main", role != "executor" {
                throw ValidationError("--role must be main or executor")
            }
        }

        enum Outcome: Sendable { case holdElapsed, stopRequested, lost, terminated }

        func run() async throws {
            TerminationSignal.prepare()
            let container = try options.open()
            var roleOptions = RoleOptions()
            if let grace { roleOptions.gracePeriod = .seconds(grace) }
            if let maxCriticalWait { roleOptions.maximumCriticalWait = .seconds(maxCriticalWait) }
            let handle = try container.role(name, options: roleOptions)
            let level: RolePriority = priority.map { RolePriority($0) } ?? (role == "main" ? .main : .executor)
            let lease: RoleLease
            let deadline = try Deadline.option(timeout), kind = self.kind ?? (role ?? "process")
            do {
                // SIGTERM or SIGINT while waiting: stop waiting, holding nothing.
                let acquired = try await withThrowingTaskGroup(of: RoleLease?.self) { group in
                    group.addTask { try await handle.acquire(priority: level, kind: kind, deadline: deadline) }
                    group.addTask {
                        await TerminationSignal.wait()
                        return nil
                    }
                    defer { group.cancelAll() }
                    return try await group.next() ?? nil
                }
                guard let acquired else {
                    emit(try jsonLine(JSONValue.object(["event": .string("interrupted")])))
                    return
                }
                lease = acquired
            } catch let error as BatonError where error.code == .busy || error.code == .timedOut {
                var fields: [String: JSONValue] = ["event": .string("busy"), "code": .string(error.code.rawValue), "message": .string(error.message)]
                if let holder = try? handle.status().holder {
                    fields["holder"] = RoleCommand.json(holder)
                }
                emit(try jsonLine(JSONValue.object(fields)))
                if error.code == .timedOut {
                    throw CommandOutcome.timedOut("role \(name) still held by another process", after: timeout)
                }
                throw CommandOutcome(.busy, "busy: \(error.message)")
            }
            emit(try jsonLine(JSONValue.object(["event": .string("acquired"), "epoch": .int(Int(lease.epoch)), "pid": .int(Int(getpid())), "priority": .int(level.value)])))

            let criticalTask: Task<Void, any Error>? = critical.map { seconds in
                Task {
                    try await lease.withCriticalSection {
                        emit(try jsonLine(JSONValue.object(["event": .string("critical-begin"), "epoch": .int(Int(lease.epoch))])))
                        try await Task.sleep(for: .seconds(seconds))
                    }
                    emit(try jsonLine(JSONValue.object(["event": .string("critical-end"), "epoch": .int(Int(lease.epoch))])))
                }
            }
            let ignoreStop = self.ignoreStop, hold = self.hold, suspendAfter = self.suspendAfter, resumeAfter = self.resumeAfter
            let outcome = try await withThrowingTaskGroup(of: Outcome?.self) { group -> Outcome in
                group.addTask {
                    for await request in lease.stopRequests {
                        emit(try jsonLine(JSONValue.object([
                            "event": .string("stop-requested"), "by": .int(request.priority.value),
                            "pid": .int(Int(request.pid)), "deadline": .string(iso8601(request.deadline))])))
                        if !ignoreStop { return .stopRequested }
                    }
                    if Task.isCancelled { return nil }
                    return lease.isValid || container.suspension.isSuspended ? nil : .lost
                }
                group.addTask {
                    if let hold { try await Task.sleep(for: .seconds(hold)) }
                    return .holdElapsed
                }
                group.addTask {
                    await TerminationSignal.wait()
                    return Task.isCancelled ? nil : .terminated
                }
                if let suspendAfter {
                    group.addTask {
                        try await Task.sleep(for: .seconds(suspendAfter))
                        await container.suspend()
                        emit(try jsonLine(JSONValue.object(["event": .string("suspended")])))
                        guard let resumeAfter else { return nil }
                        try await Task.sleep(for: .seconds(resumeAfter))
                        do {
                            try await container.resume()
                            emit(try jsonLine(JSONValue.object(["event": .string("resumed"), "epoch": .int(Int(lease.epoch))])))
                            return nil
                        } catch let error as BatonError where error.code == .lost {
                            return .lost
                        }
                    }
                }
                defer { group.cancelAll() }
                while let next = try await group.next() {
                    if let next { return next }
                }
                return .holdElapsed
            }
            if outcome != .lost { try? await criticalTask?.value } else { criticalTask?.cancel() }
            let suspended = container.suspension.isSuspended
            if outcome == .lost || (!suspended && !lease.isValid) {
                let current = (try? handle.status().epoch) ?? 0
                await lease.release()
                emit(try jsonLine(JSONValue.object(["event": .string("lost"), "epoch": .int(Int(current)), "held": .int(Int(lease.epoch))])))
                throw CommandOutcome(.ended, "lost: role \(name) was taken by another process (epoch \(current); this process held \(lease.epoch))")
            }
            await lease.release()
            var fields: [String: JSONValue] = ["event": .string("released"), "epoch": .int(Int(lease.epoch))]
            if suspended { fields["suspended"] = .bool(true) }
            emit(try jsonLine(JSONValue.object(fields)))
        }
    }

    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show who holds a role, in what state, and who waits.")
        @OptionGroup var options: ContainerOptions
        @Argument(help: "The role's name.") var name = "core"
        @Flag(help: "Print one JSON object.") var json = false

        func run() async throws {
            let container = try options.open()
            // A role nobody has used reads as free, without creating its files.
            try SharedContainer.validateName(name, what: "a role name")
            var info = stat()
            guard lstat(container.batonPath + "/roles/\(name)", &info) == 0 else {
                if json {
                    emit(try jsonLine(JSONValue.object([
                        "name": .string(name), "holder": .null, "waiters": .array([]), "epoch": .int(0), "heartbeat": .null])))
                } else {
                    emit("role \(name): free (never used)")
                }
                return
            }
            let status = try container.role(name).status()
            if json {
                emit(try jsonLine(RoleCommand.json(status)))
                return
            }
            if let holder = status.holder {
                emit("role \(status.name): held by \(holder.kind) (priority \(holder.priority), pid \(holder.pid)) epoch \(holder.epoch), \(holder.state.rawValue) since \(holder.since)")
                if let stop = holder.stopRequest {
                    emit("  asked to stop by priority \(stop.priority) (pid \(stop.pid)) by \(stop.deadline)")
                }
            } else {
                emit("role \(status.name): free (last epoch \(status.epoch))")
            }
            for waiter in status.waiters {
                emit("  waiting: \(waiter.kind) (priority \(waiter.priority), pid \(waiter.pid)) since \(waiter.since)")
            }
        }
    }

    static func json(_ holder: RoleStatus.Holder) -> JSONValue {
        var fields: [String: JSONValue] = [
            "priority": .int(holder.priority.value), "kind": .string(holder.kind), "pid": .int(Int(holder.pid)),
            "epoch": .int(Int(holder.epoch)), "state": .string(holder.state.rawValue), "since": .string(iso8601(holder.since)),
        ]
        if let stop = holder.stopRequest {
            fields["stop_request"] = .object(["priority": .int(stop.priority.value), "pid": .int(Int(stop.pid)), "deadline": .string(iso8601(stop.deadline))])
        }
        return .object(fields)
    }

    static func json(_ status: RoleStatus) -> JSONValue {
        .object([
            "name": .string(status.name),
            "holder": status.holder.map(json) ?? .null,
            "waiters": .array(status.waiters.map { waiter in
                .object(["priority": .int(waiter.priority.value), "kind": .string(waiter.kind), "pid": .int(Int(waiter.pid)), "since": .string(iso8601(waiter.since))])
            }),
            "epoch": .int(Int(status.epoch)),
            "heartbeat": status.heartbeat.map { .string(iso8601($0)) } ?? .null,
        ])
    }
}
