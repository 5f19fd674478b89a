import Baton
import Foundation
import BatonTestSupport
import Testing

@Suite("File locks across processes")
struct FileLockTests {
    @Test("an exclusive lock held by another process blocks tryLock and times out a wait")
    func exclusion() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let holder = try ChildProcess(["lock", "hold", "locks/a.lock"], container: directory.path)
        try await holder.line(timeout: 30) { $0 == "acquired" }
        let lock = try FileLock(container, name: "locks/a.lock")
        #expect(try lock.tryLock() == nil)
        await #expect { _ = try await lock.lock(deadline: .after(.milliseconds(300))) } throws: {
            ($0 as? BatonError)?.code == .timedOut
        }
        #expect(try lock.tryLock(.shared) == nil)
    }

    @Test("a waiter gets the lock as soon as the holder is killed")
    func killedHolderReleases() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let holder = try ChildProcess(["lock", "hold", "b.lock"], container: directory.path)
        try await holder.line(timeout: 30) { $0 == "acquired" }
        let lock = try FileLock(container, name: "b.lock")
        async let waited = lock.lock(deadline: .after(.seconds(30)))
        try await Task.sleep(for: .milliseconds(100))
        holder.signal(SIGKILL)
        let held = try await waited
        #expect(held.isHeld)
        #expect(ProcLocks.held(by: getpid(), under: directory.path).count == 1)
        held.release()
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
    }

    @Test("a waiting child gets the lock when this process releases it")
    func releaseWakesOtherProcess() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let held = try #require(try FileLock(container, name: "c.lock").tryLock())
        let waiter = try ChildProcess(["lock", "hold", "c.lock", "--timeout", "30", "--hold", "0"], container: directory.path)
        try await Task.sleep(for: .milliseconds(200))
        #expect(waiter.lines.isEmpty)
        held.release()
        try await waiter.line(timeout: 30) { $0 == "acquired" }
        #expect(try await waiter.wait() == 0)
    }

    @Test("shared locks coexist and exclude an exclusive one")
    func sharedLocks() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let reader = try ChildProcess(["lock", "hold", "d.lock", "--shared"], container: directory.path)
        try await reader.line(timeout: 30) { $0 == "acquired" }
        let lock = try FileLock(container, name: "d.lock")
        let mine = try #require(try lock.tryLock(.shared))
        #expect(try lock.tryLock(.exclusive) == nil)
        mine.release()
    }

    @Test("a cancelled wait ends promptly and leaves no lock behind")
    func cancellation() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let holder = try ChildProcess(["lock", "hold", "e.lock"], container: directory.path)
        try await holder.line(timeout: 30) { $0 == "acquired" }
        let lock = try FileLock(container, name: "e.lock")
        let task = Task { try await lock.lock(deadline: .never) }
        try await Task.sleep(for: .milliseconds(100))
        task.cancel()
        await #expect(throws: CancellationError.self) { _ = try await task.value }
        holder.signal(SIGKILL)
        _ = try await holder.wait()
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
    }

    @Test("suspension releases held locks and refuses new ones until resume")
    func suspension() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let held = try #require(try FileLock(container, name: "f.lock").tryLock())
        await container.suspend()
        #expect(!held.isHeld)
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
        #expect { _ = try FileLock(container, name: "f.lock").tryLock() } throws: { ($0 as? BatonError)?.code == .suspended }
        try await container.resume()
        #expect(try FileLock(container, name: "f.lock").tryLock() != nil)
    }
}
