import Baton
import BatonTestSupport
import Foundation
import Testing

@Suite("App lifecycle adapter")
struct AppLifecycleTests {
    @Test("background releases a held lock for another process; active lets this one lock again")
    func backgroundSuspendsContainer() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let lifecycle = AppLifecycle(container: container)
        let lock = try FileLock(container, name: "app.lock")
        let held = try #require(try lock.tryLock())
        #expect(ProcLocks.held(by: getpid(), under: directory.path).count == 1)

        await lifecycle.phaseChanged(to: .inactive)
        #expect(!container.suspension.isSuspended)
        #expect(held.isHeld)

        await lifecycle.phaseChanged(to: .background)
        #expect(lifecycle.isSuspended)
        #expect(container.suspension.isSuspended)
        #expect(!held.isHeld)
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
        // Another process can take it while this one is in the background.
        let other = try ChildProcess(["lock", "hold", "app.lock"], container: directory.path)
        try await other.line(timeout: 30) { $0 == "acquired" }
        other.signal(SIGKILL)
        _ = try? await other.wait()
        #expect(throws: BatonError.self) { _ = try lock.tryLock() }

        await lifecycle.phaseChanged(to: .active)
        #expect(!lifecycle.isSuspended)
        #expect(!container.suspension.isSuspended)
        let again = try #require(try lock.tryLock())
        again.release()
    }

    @Test("repeated and interleaved phases leave the last one in force")
    func interleavedPhases() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let lifecycle = AppLifecycle(container: container)
        await lifecycle.phaseChanged(to: .background)
        await lifecycle.phaseChanged(to: .background)
        await lifecycle.backgroundTimeWillExpire()
        #expect(container.suspension.isSuspended)
        await lifecycle.phaseChanged(to: .active)
        #expect(!container.suspension.isSuspended, "one resume undoes the lifecycle's one suspension")
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<50 {
                group.addTask { await lifecycle.phaseChanged(to: index.isMultiple(of: 2) ? .background : .active) }
            }
        }
        await lifecycle.phaseChanged(to: .active)
        #expect(!lifecycle.isSuspended)
        #expect(!container.suspension.isSuspended)
    }

    @Test("an extension's expiry suspends; the next request resumes (processes are reused)")
    func extensionRequests() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let lifecycle = AppLifecycle(container: container)
        await lifecycle.extensionWillHandleRequest()
        #expect(!container.suspension.isSuspended)
        let lock = try FileLock(container, name: "nse.lock")
        let held = try #require(try lock.tryLock())
        await lifecycle.extensionTimeWillExpire()
        #expect(!held.isHeld)
        #expect(container.suspension.isSuspended)
        await lifecycle.extensionWillHandleRequest()
        #expect(!container.suspension.isSuspended)
    }

    @Test("files Baton creates can be given a protection class (a no-op on Linux)")
    func fileProtectionOption() throws {
        let directory = try TemporaryContainer()
        let options = SharedContainer.Options(fileProtection: .complete)
        let container = try SharedContainer(path: directory.path, options: options)
        #expect(container.options.fileProtection == .complete)
        #expect(SharedContainer.Options().fileProtection == .completeUntilFirstUserAuthentication)
        let held = try #require(try FileLock(container, name: "protected.lock").tryLock())
        held.release()
    }
}
