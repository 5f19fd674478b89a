import ArgumentParser
import Baton
import BatonCommandSupport
import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `baton-harness role soak`: the role soak test's worker process.
struct RoleWorkers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "role", abstract: "Role test workers.", subcommands: [Soak.self, Yield.self])

    /// A holder that yields once (tests only): acquires at executor priority, says
    /// `{"event":"acquired"}`, releases at the first stop request and says
    /// `{"event":"released"}`, then stays alive for `--linger` seconds, so that no exit of it
    /// (and no signal its parent gets for that) comes right after the release.
    struct Yield: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Holder that releases at the first stop request and stays alive.")
        @OptionGroup var options: ContainerOptions
        @Option var name = "core"
        @Option(transform: ArgumentCheck.seconds) var linger: Double = 60

        func run() async throws {
            let container = try options.open()
            let role = try container.role(name)
            let lease = try await role.acquire(priority: .executor, kind: "yield", deadline: .after(.seconds(30)))
            emit(#"{"event":"acquired"}"#)
            for await _ in lease.stopRequests { break }
            await lease.release()
            emit(#"{"event":"released"}"#)
            try await Task.sleep(for: .seconds(linger))
        }
    }

    /// A soak-test worker (tests only): contends for the role at random and appends its epoch to
    /// a log under a fence check.
    struct Soak: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Soak-test worker.")
        @OptionGroup var options: ContainerOptions
        @Option var name = "core"
        @Option(transform: ArgumentCheck.seconds) var seconds: Double = 10
        @Option var log: String

        func run() async throws {
            let container = try options.open()
            let role = try container.role(name)
            let logFD = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
            guard logFD >= 0 else { throw BatonError(.notWritable, "cannot open the soak log") }
            defer { close(logFD) }
            let end = try Deadline.seconds(seconds)
            var acquired = 0, busy = 0, fenced = 0, preempted = 0
            func append(_ line: String, _ lease: RoleLease) -> Bool {
                // The log is the shared store: its lock is the transaction, the fence is checked in it.
                flock(logFD, LOCK_EX)
                defer { flock(logFD, LOCK_UN) }
                guard (try? lease.validate()) != nil else { return false }
                var text = line + "\n"
                text.withUTF8 { _ = write(logFD, $0.baseAddress, $0.count) }
                return true
            }
            while !end.hasPassed {
                let priority = [RolePriority.executor, RolePriority(50), RolePriority.main].randomElement()!
                let lease: RoleLease
                do {
                    lease = try await role.acquire(priority: priority, kind: "soak", deadline: .after(.milliseconds(Int64.random(in: 20...300))))
                } catch let error as BatonError where error.code == .busy || error.code == .timedOut {
                    busy += 1
                    try await Task.sleep(for: .milliseconds(Int64.random(in: 0...5)))
                    continue
                }
                acquired += 1
                if !append("B \(lease.epoch) \(getpid())", lease) { fenced += 1 }
                let holdFor = Duration.milliseconds(Int64.random(in: 1...30))
                let stopped = await withTaskGroup(of: Bool.self) { group in
                    group.addTask { (try? await Task.sleep(for: holdFor)) == nil }
                    group.addTask {
                        for await _ in lease.stopRequests { return true }
                        return false
                    }
                    defer { group.cancelAll() }
                    return await group.next() ?? false
                }
                if stopped { preempted += 1 }
                if !append("E \(lease.epoch) \(getpid())", lease) { fenced += 1 }
                await lease.release()
                try await Task.sleep(for: .milliseconds(Int64.random(in: 0...5)))
            }
            emit(try jsonLine(JSONValue.object([
                "acquired": .int(acquired), "busy": .int(busy), "fenced": .int(fenced), "preempted": .int(preempted)])))
        }
    }
}
