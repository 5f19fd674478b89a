import Baton
import CBatonHarness
import CBatonShims
import Foundation
import BatonTestSupport
import Testing

/// The kernel layer's primitives, each on its own, with real processes: wait/wake on a shared
/// word, file events for lock releases, owner tokens and the shared mutex built on them.
@Suite("Kernel layer")
struct KernelTests {
    @Test("a wake on a shared word reaches a sleeper in another process")
    func wakeReachesAnotherProcess() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let map = try MappedFile(container, relativePath: "word", minimumSize: 4096)
        let word = map.pointer.assumingMemoryBound(to: UInt32.self)
        let sleeper = try ChildProcess(harness: ["kernel-test", "wait-word", "--file", "word", "--timeout", "60"], container: directory.path)
        try await sleeper.line(timeout: 30) { $0 == "waiting 0" }
        // Let it go to sleep in the kernel: a store alone does not wake a sleeper.
        try await Task.sleep(for: .milliseconds(200))
        baton_store32(word, 7)
        AddressWait.wakeAll(word)
        let line = try await sleeper.line(timeout: 60) { $0.hasPrefix("woken") || $0 == "timed-out" }
        #expect(line == "woken 7")
    }

    @Test("the cached process id is the process's own, and a forked child asks the kernel again")
    func processIdentifier() {
        let parent = baton_process_id()
        #expect(parent == getpid())
        #expect(baton_process_id() == parent)
        // 0: the child's cached id is its own; 1: it kept the parent's (the fork handler did not run).
        #expect(baton_harness_fork_and_check_process_id(parent) == 0)
    }

    @Test("a wait on a word that nobody rings times out at its deadline")
    func waitTimesOut() {
        let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
        defer { word.deallocate() }
        word.initialize(to: 3)
        let start = ContinuousClock.now
        var outcome = AddressWait.Outcome.woken
        // A wait may return early spuriously: loop as callers do.
        while outcome == .woken, ContinuousClock.now - start < .milliseconds(200) {
            let remaining = (start + .milliseconds(200) - ContinuousClock.now).nanoseconds
            outcome = AddressWait.wait(on: word, expecting: 3, timeoutNanoseconds: max(remaining, 0))
        }
        let elapsed = ContinuousClock.now - start
        #expect(outcome == .timedOut)
        #expect(elapsed >= .milliseconds(200))
        // A wait that never timed out would not return at all; the bound leaves a starved
        // test run's scheduling room (threads of such a run waited seconds for a processor).
        #expect(elapsed < .seconds(30))
    }

    @Test("a flock holder's death wakes a waiter through file events, with no timer")
    func flockHolderDeathWakes() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let holder = try ChildProcess(["lock", "hold", "held.lock"], container: directory.path)
        try await holder.line(timeout: 30) { $0 == "acquired" }
        let subscription = try FileEvents.shared.subscribe(path: container.absolutePath("held.lock"), interest: .lockReleased)
        let seen = subscription.events.snapshot()
        let lock = try FileLock(container, name: "held.lock")
        #expect(try lock.tryLock() == nil)
        holder.signal(SIGKILL)
        // The only wake-up is the kernel's event: the deadline is far away.
        try await subscription.events.wait(after: seen, deadline: .after(.seconds(20)))
        var held = try lock.tryLock()
        // Linux posts the close event just before it drops the lock; the layer delivers it again.
        for _ in 0..<FileEvents.redeliveryDelays.count where held == nil {
            let again = subscription.events.snapshot()
            try await subscription.events.wait(after: again, deadline: .after(.seconds(20)))
            held = try lock.tryLock()
        }
        #expect(held != nil)
    }

    @Test("a wait for file events is cancellable")
    func fileEventWaitIsCancellable() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let file = try container.openDescriptor("quiet.lock", flags: O_RDWR | O_CREAT)
        defer { withExtendedLifetime(file) {} }
        let subscription = try FileEvents.shared.subscribe(path: container.absolutePath("quiet.lock"), interest: .lockReleased)
        let events = subscription.events
        let seen = events.snapshot()
        let task = Task { try await events.wait(after: seen, deadline: .never) }
        try await Task.sleep(for: .milliseconds(100))
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
    }

    @Test("an owner token reads alive while its process lives, dead once it is killed, and its watch fires")
    func ownerTokenLiveness() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let child = try ChildProcess(harness: ["kernel-test", "hold-token"], container: directory.path)
        let line = try await child.line(timeout: 30) { $0.hasPrefix("token ") }
        let token = try #require(UInt64(line.dropFirst("token ".count), radix: 16))
        #expect(container.owners.isAlive(token))
        #expect(container.owners.isAlive(token)) // again, through the descriptor kept by the first look
        #expect(container.owners.isAlive(try container.owners.current()))
        let fired = EventCounter()
        let seen = fired.snapshot()
        let watch = container.owners.watch(token) { fired.notify() }
        #expect(watch != nil)
        child.signal(SIGKILL)
        try await fired.wait(after: seen, deadline: .after(.seconds(20)))
        var alive = container.owners.isAlive(token)
        for _ in 0..<FileEvents.redeliveryDelays.count where alive {
            let again = fired.snapshot()
            try await fired.wait(after: again, deadline: .after(.seconds(20)))
            alive = container.owners.isAlive(token)
        }
        #expect(!alive)
        #expect(!container.owners.isAlive(0x1234_5678)) // never drawn: no file
    }

    @Test("a shared mutex held by a live process times out a waiter; the holder's SIGKILL hands it over as ownerDied")
    func sharedMutexOwnerDeath() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let map = try MappedFile(container, relativePath: "mutex", minimumSize: 4096)
        let holder = try ChildProcess(harness: ["kernel-test", "hold-mutex", "--file", "mutex"], container: directory.path)
        _ = try await holder.line(timeout: 30) { $0.hasPrefix("held ") }
        let mutex = SharedMutex(map.pointer)
        let owners = container.owners
        let token = try owners.enter()
        defer { owners.leave() }
        // The lock calls block: each runs on a thread of its own, not on one of the cooperative
        // pool's two threads (which the other suites need meanwhile).
        @Sendable func lock(within wait: Duration) async throws -> SharedMutex.Acquired? {
            try await onOwnThread { mutex.lock(as: token, tokens: owners, deadline: .after(wait), keepAlive: map) }
        }
        #expect(try await lock(within: .milliseconds(300)) == nil)
        // Stopped, not dead: still its owner's.
        holder.signal(SIGSTOP)
        #expect(try await lock(within: .milliseconds(300)) == nil)
        holder.signal(SIGKILL)
        let start = ContinuousClock.now
        let acquired = try await lock(within: .seconds(60))
        #expect(acquired == .ownerDied)
        // At the death, not at the deadline: half of it is room for a starved run's scheduling.
        #expect(ContinuousClock.now - start < .seconds(30))
        #expect(mutex.currentOwner == token)
        mutex.unlock(as: token)
        #expect(mutex.currentOwner == 0)
        #expect(mutex.lock(as: token, tokens: container.owners, deadline: .after(.seconds(1)), keepAlive: map) == .clean)
        mutex.unlock(as: token)
    }

    @Test("a forged owner in a shared mutex (no such token) is taken over at once")
    func forgedOwnerIsTakenOver() throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let map = try MappedFile(container, relativePath: "mutex", minimumSize: 4096)
        baton_store64(map.pointer.assumingMemoryBound(to: UInt64.self), 0xDEAD_BEEF)
        let token = try container.owners.enter()
        defer { container.owners.leave() }
        #expect(SharedMutex(map.pointer).lock(as: token, tokens: container.owners, deadline: .after(.seconds(5)), keepAlive: map) == .ownerDied)
    }

    @Test("a suspended process's token reads dead to others, and it takes a new one on resume")
    func suspensionReleasesToken() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let observer = try SharedContainer(path: directory.path)
        let before = try container.owners.current()
        #expect(observer.owners.isAlive(before))
        await container.suspend()
        #expect(!observer.owners.isAlive(before))
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
        #expect(throws: BatonError.self) { _ = try container.owners.current() }
        try await container.resume()
        let after = try container.owners.current()
        #expect(after != before)
        #expect(observer.owners.isAlive(after))
    }
}

/// Nothing above the kernel layer may use a primitive Apple platforms lack, or be
/// platform-conditional: the code that ships on iOS is the code these tests run.
@Suite("Kernel layer boundary")
struct KernelBoundaryTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Linux-only primitives (code, not comments).
    static let linuxOnly = [
        #"\bfutex"#, #"F_OFD_"#, #"pthread_mutexattr_setrobust"#, #"pthread_mutex_consistent"#, #"EOWNERDEAD"#,
        #"robust_mutex"#, #"\bpidfd"#, #"inotify"#, #""/proc/"#, #"ofd_"#, #"SYS_"#, #"prctl"#, #"posix_fallocate"#, #"fdatasync"#,
    ]
    /// Platform conditionals.
    static let conditionals = [#"#if\s+os\("#, #"canImport\(Glibc\)"#, #"canImport\(Darwin\)"#, #"canImport\(Musl\)"#, #"__linux__"#, #"__APPLE__"#]

    /// Files of the library that may hold OS-specific code: the kernel layer's per-platform
    /// files and the adapters to Apple frameworks and Linux's netlink.
    static func isPlatformFile(_ relative: String) -> Bool {
        let name = (relative as NSString).lastPathComponent
        if relative.hasPrefix("Sources/CBatonShims/platform/") { return true }
        if relative == "Sources/CBatonShims/include/CBatonShims.h" { return true } // selects the platform header
        if relative == "Sources/Baton/Kernel/Platform.swift" { return true }
        if relative.hasPrefix("Sources/Baton/Kernel/") && (name.contains("+Linux.") || name.contains("+Darwin.")) { return true }
        for adapter in ["+UIKit.", "+SwiftUI.", "+UserNotifications.", "+Network."] where name.contains(adapter) { return true }
        // Adapters: rtnetlink reachability (Linux), NSFileCoordinator (Apple).
        return ["Reachability+Linux.swift", "FileCoordination+Darwin.swift", "FileCoordination+Linux.swift"].contains(name)
    }

    /// The code of a file without its comments (line comments; block comments are not used).
    static func code(of path: String) throws -> [(line: Int, text: String)] {
        let text = try String(contentsOfFile: path, encoding: .utf8)
        return text.split(separator: "\n", omittingEmptySubsequences: false).enumerated().compactMap { index, line in
            var line = String(line)
            if let range = line.range(of: "//") { line = String(line[..<range.lowerBound]) }
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.hasPrefix("*") || trimmed.hasPrefix("/*") { return nil }
            return line.isEmpty ? nil : (index + 1, line)
        }
    }

    static func libraryFiles() throws -> [String] {
        var files: [String] = []
        for module in ["Sources/Baton", "Sources/BatonDatabase", "Sources/CBatonShims"] {
            let base = root.appendingPathComponent(module).path
            guard let walker = FileManager.default.enumerator(atPath: base) else { continue }
            for case let relative as String in walker where [".swift", ".h", ".c"].contains(where: relative.hasSuffix) {
                files.append(module + "/" + relative)
            }
        }
        return files.sorted()
    }

    static func violations(patterns: [String], allowed: (String) -> Bool) throws -> [String] {
        let regexes = try patterns.map { try NSRegularExpression(pattern: $0) }
        var found: [String] = []
        for relative in try libraryFiles() where !allowed(relative) {
            for (number, line) in try code(of: root.appendingPathComponent(relative).path) {
                let range = NSRange(line.startIndex..., in: line)
                if regexes.contains(where: { $0.firstMatch(in: line, range: range) != nil }) {
                    found.append("\(relative):\(number): \(line.trimmingCharacters(in: .whitespaces))")
                }
            }
        }
        return found
    }

    @Test("no Linux-only primitive outside the kernel layer's Linux files")
    func noLinuxOnlyPrimitives() throws {
        #expect(try Self.libraryFiles().count > 50, "the source tree was not found at \(Self.root.path)")
        let found = try Self.violations(patterns: Self.linuxOnly) { relative in
            let name = (relative as NSString).lastPathComponent
            return (relative.hasPrefix("Sources/Baton/Kernel/") && name.contains("+Linux."))
                || relative == "Sources/CBatonShims/platform/CBatonShims+Linux.h"
                || name == "Reachability+Linux.swift"
        }
        #expect(found.isEmpty, "Linux-only primitives above the kernel layer:\n\(found.joined(separator: "\n"))")
    }

    @Test("no platform conditional outside the kernel layer's per-platform files and the adapters")
    func noPlatformConditionals() throws {
        let found = try Self.violations(patterns: Self.conditionals, allowed: Self.isPlatformFile)
        #expect(found.isEmpty, "platform conditionals above the kernel layer:\n\(found.joined(separator: "\n"))")
    }

    @Test("the boundary check finds a planted primitive (it can fail)")
    func boundaryCheckCanFail() throws {
        let planted = FileManager.default.temporaryDirectory.appendingPathComponent("baton-planted-\(getpid()).swift")
        try "let x = 1\n_ = syscall(SYS_futex, 0) // a call\n#if os(Linux)\n#endif\n".write(to: planted, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: planted) }
        let lines = try Self.code(of: planted.path).map(\.text)
        let linux = try Self.linuxOnly.map { try NSRegularExpression(pattern: $0) }
        let conditionals = try Self.conditionals.map { try NSRegularExpression(pattern: $0) }
        func matches(_ regexes: [NSRegularExpression]) -> Bool {
            lines.contains { line in regexes.contains { $0.firstMatch(in: line, range: NSRange(line.startIndex..., in: line)) != nil } }
        }
        #expect(matches(linux))
        #expect(matches(conditionals))
    }
}
