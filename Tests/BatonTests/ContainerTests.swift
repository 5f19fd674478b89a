import Baton
import Foundation
import BatonTestSupport
import Testing

@Suite("Shared container validation")
struct ContainerTests {
    private func code(_ body: () throws -> Void) -> BatonError.Code? {
        do { try body(); return nil } catch let error as BatonError { return error.code } catch { return nil }
    }

    @Test("a missing path is notFound")
    func missing() {
        #expect(code { _ = try SharedContainer(path: "/nonexistent/baton-\(UUID())") } == .notFound)
    }

    @Test("a file is notADirectory")
    func notADirectory() throws {
        let directory = try TemporaryContainer()
        let file = directory.path + "/plain"
        _ = FileManager.default.createFile(atPath: file, contents: Data())
        #expect(code { _ = try SharedContainer(path: file) } == .notADirectory)
    }

    @Test("a path too long is pathTooLong")
    func tooLong() {
        let path = "/tmp/" + String(repeating: "a/", count: 2100)
        #expect(code { _ = try SharedContainer(path: path) } == .pathTooLong)
    }

    @Test("a directory owned by another user is refused")
    func otherOwner() throws {
        guard geteuid() == 0 else { return }  // only root can hand a directory to another user
        let directory = try TemporaryContainer()
        let foreign = directory.path + "/foreign"
        try FileManager.default.createDirectory(atPath: foreign, withIntermediateDirectories: false)
        #expect(chown(foreign, 65534, 65534) == 0)
        #expect(code { _ = try SharedContainer(path: foreign) } == .ownedByAnotherUser)
    }

    @Test("a read-only directory is notWritable")
    func readOnly() async throws {
        let directory = try TemporaryContainer()
        let readOnly = directory.path + "/ro"
        try FileManager.default.createDirectory(atPath: readOnly, withIntermediateDirectories: false)
        if geteuid() != 0 {
            #expect(chmod(readOnly, 0o500) == 0)
            #expect(code { _ = try SharedContainer(path: readOnly) } == .notWritable)
            return
        }
        // root ignores permission bits: check as an unprivileged user that owns the directory.
        #expect(chmod(directory.path, 0o755) == 0)
        #expect(chown(readOnly, 65534, 65534) == 0)
        #expect(chmod(readOnly, 0o500) == 0)
        // The spawner's pipes are close-on-exec from their creation, so no child another test
        // spawns meanwhile keeps the standard error pipe open.
        let run = try await runProgram("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", ChildProcess.executable,
                                                      "presence", "list", "--container", readOnly])
        let message = run.errors
        if message.contains("failed to execute") {
            // The checkout is not reachable by an unprivileged user here; nothing to check.
            return
        }
        #expect(run.status != 0)
        #expect(message.contains("notWritable"), "stderr: \(message)")
    }

    @Test("a symbolic link in place of .baton is refused")
    func symlinkedBatonDirectory() throws {
        let directory = try TemporaryContainer()
        let elsewhere = try TemporaryContainer()
        try FileManager.default.createSymbolicLink(atPath: directory.path + "/.baton", withDestinationPath: elsewhere.path)
        #expect(code { _ = try SharedContainer(path: directory.path) } == .symbolicLink)
    }

    @Test("a symbolic link inside .baton is never followed")
    func symlinkedFile() throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let target = directory.path + "/target"
        _ = FileManager.default.createFile(atPath: target, contents: Data("keep".utf8))
        try FileManager.default.createSymbolicLink(atPath: directory.path + "/.baton/evil.lock", withDestinationPath: target)
        #expect(code { _ = try FileLock(container, name: "evil.lock").tryLock() } == .symbolicLink)
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "keep")
    }

    @Test("Baton's directory and files get restrictive permissions")
    func permissions() throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        try container.signals.post("x")
        let attributes = try FileManager.default.attributesOfItem(atPath: directory.path + "/.baton")
        #expect((attributes[.posixPermissions] as? Int) == 0o700)
        let file = try FileManager.default.attributesOfItem(atPath: directory.path + "/.baton/signals")
        #expect((file[.posixPermissions] as? Int) == 0o600)
    }

    @Test("names with a path separator or dot-dot are invalidName", arguments: ["a/b", "..", ".", "", "x\u{0}"])
    func badNames(name: String) throws {
        #expect(code { try SharedContainer.validateName(name, what: "a name") } == .invalidName)
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        if name.contains("/") == false {
            #expect(code { _ = try FileLock(container, name: name) } == .invalidName)
        } else {
            #expect(code { _ = try FileLock(container, name: "../escape") } == .invalidName)
        }
    }

    @Test("a container writable by group or others is refused", arguments: [0o770, 0o707, 0o777, 0o1777] as [mode_t])
    func writableByOthers(mode: mode_t) throws {
        let directory = try TemporaryContainer()
        #expect(chmod(directory.path, mode) == 0)
        #expect(code { _ = try SharedContainer(path: directory.path) } == BatonError.Code("writableByOthers"))
    }

    @Test("the command line refuses a world-writable container in one line")
    func writableByOthersCommandLine() async throws {
        let directory = try TemporaryContainer()
        #expect(chmod(directory.path, 0o777) == 0)
        let result = try await runBaton(["signal", "post", "x"], container: directory.path)
        #expect(result.status == 77)
        #expect(result.errors.count == 1 && result.errors.first?.contains("writableByOthers") == true, "\(result.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.path + "/.baton/signals"))
    }

    @Test("a .baton directory or file writable by others is refused")
    func batonDirectoryWritableByOthers() throws {
        let directory = try TemporaryContainer()
        _ = try SharedContainer(path: directory.path)
        #expect(chmod(directory.path + "/.baton", 0o777) == 0)
        #expect(code { _ = try SharedContainer(path: directory.path) } == BatonError.Code("writableByOthers"))
    }

    @Test("Baton's files are 0600 whatever the umask")
    func filesIgnoreTheUmask() async throws {
        let directory = try TemporaryContainer()
        let previous = umask(0)
        defer { umask(previous) }
        let container = try SharedContainer(path: directory.path)
        try container.signals.post("x")
        _ = try FileLock(container, name: "a.lock").tryLock()
        let role = try container.role()
        let lease = try await role.acquire(priority: .main, deadline: .after(.seconds(5)))
        await lease.release()
        let enumerator = try #require(FileManager.default.enumerator(atPath: directory.path + "/.baton"))
        var checked = 0
        while let name = enumerator.nextObject() as? String {
            let attributes = try FileManager.default.attributesOfItem(atPath: directory.path + "/.baton/" + name)
            let permissions = attributes[.posixPermissions] as? Int
            if attributes[.type] as? FileAttributeType == .typeDirectory {
                #expect(permissions == 0o700, "\(name)")
            } else {
                #expect(permissions == 0o600, "\(name) is \(String(permissions ?? 0, radix: 8))")
                checked += 1
            }
        }
        #expect(checked >= 4)
    }

    @Test("a FIFO in place of a channel is refused at once, not waited on")
    func fifoChannel() async throws {
        let directory = try TemporaryContainer()
        _ = try SharedContainer(path: directory.path)
        try FileManager.default.createDirectory(atPath: directory.path + "/.baton/channels", withIntermediateDirectories: true)
        #expect(mkfifo(directory.path + "/.baton/channels/jobs", 0o600) == 0)
        for arguments in [["channel", "send", "jobs", "1", "--timeout", "1"], ["channel", "receive", "jobs", "--timeout", "1"]] {
            // A wait would end in a timeout (the FIFO's open blocks forever, past --timeout):
            // the error that names the FIFO is what shows it was refused, not waited on. (No
            // timed assertion: on a loaded machine the process itself takes seconds to start.)
            let child = try ChildProcess(arguments, container: directory.path)
            let status = try await child.wait(timeout: 60)
            #expect(status == 77, "\(arguments): \(child.lines) \(child.errorLines)")
            #expect(child.errorLines.contains { $0.contains("notARegularFile") }, "\(arguments): \(child.errorLines)")
        }
    }

    @Test("a FIFO or directory in place of a lock file is refused at once")
    func fifoLockFile() throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        #expect(mkfifo(directory.path + "/.baton/fifo.lock", 0o600) == 0)
        #expect(code { _ = try FileLock(container, name: "fifo.lock").tryLock() } == BatonError.Code("notARegularFile"))
        try FileManager.default.createDirectory(atPath: directory.path + "/.baton/dir.lock", withIntermediateDirectories: false)
        #expect(code { _ = try FileLock(container, name: "dir.lock").tryLock() } == BatonError.Code("notARegularFile"))
    }

    @Test("the command line explains a bad container")
    func commandLine() async throws {
        let result = try await runBaton(["presence", "list", "--container", "/nonexistent/x"], container: nil)
        #expect(result.status != 0)
    }

    @Test("a dropped container is freed with its signal thread, mappings and descriptors (signals, presence and a channel used)")
    func droppedContainersAreFreed() async throws {
        let directory = try TemporaryContainer()
        // In this process: freed as soon as the last reference goes, with no wait.
        weak var dropped: SharedContainer?
        do {
            let container = try SharedContainer(path: directory.path)
            dropped = container
            let observation = try container.signals.observe("drop")
            try container.signals.post("drop", state: 7)
            #expect(try await observation.next(deadline: .after(.seconds(30))).state == 7)
            _ = try container.presence.register(kind: "dropped") // without release()
        }
        #expect(dropped == nil, "a dropped container is kept alive by its own parts")
        // In a worker of its own (whose threads and descriptors no parallel test touches): 50
        // containers opened, used and dropped cost no thread, descriptor or mapping each. The
        // worker waits (up to --timeout) for the threads to end, then reports.
        let result = try await runHarness(["kernel-test", "churn-containers", "--rounds", "50", "--timeout", "30"], container: directory.path, timeout: 180)
        try #require(result.status == 0, "\(result.lines) \(result.errors)")
        func figures(_ prefix: String) throws -> [String: Int] {
            let line = try #require(result.lines.first { $0.hasPrefix(prefix + " ") }, "\(result.lines)")
            return Dictionary(uniqueKeysWithValues: line.split(separator: " ").dropFirst().compactMap { field in
                let parts = field.split(separator: "=")
                return parts.count == 2 ? Int(parts[1]).map { (String(parts[0]), $0) } : nil
            })
        }
        let baseline = try figures("baseline")
        let after = try figures("after")
        #expect(after["alive"] == 0, "container objects not freed: \(result.lines)")
        // A little slack (the channel executor's thread ends 2 s after its last job; the
        // runtime opens descriptors of its own); a leak is one thread and several descriptors
        // per container.
        #expect(after["threads", default: .max] <= baseline["threads", default: 0] + 2, "\(result.lines)")
        #expect(after["fds", default: .max] <= baseline["fds", default: 0] + 3, "\(result.lines)")
        #expect(after["maps", default: .max] <= baseline["maps", default: 0], "\(result.lines)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path + "/.baton/presence").isEmpty)
    }

    @Test("a dropped container whose rendezvous channels were used leaves no lock, mapping or descriptor of its files")
    func droppedContainerWithRendezvousChannelsLeavesNothing() async throws {
        let directory = try TemporaryContainer()
        let path = URL(fileURLWithPath: directory.path).resolvingSymlinksInPath().path
        weak var dropped: SharedContainer?
        do {
            let container = try SharedContainer(path: directory.path)
            dropped = container
            let c = try SharedChannel<String>(container, name: "c", capacity: .rendezvous)
            async let received = c.receive(deadline: .after(.seconds(30)))
            try await c.send("once", deadline: .after(.seconds(30)))
            #expect(try await received == "once")
            await #expect { try await select(.receive(from: c) { $0 }, deadline: .after(.milliseconds(20))) } throws: { ($0 as? BatonError)?.code == .timedOut }
        }
        #expect(dropped == nil, "a dropped container is kept alive by its channels")
        /// What this process still has of the container: mappings, descriptors, locks.
        func remains() -> [String] {
            func read(_ file: String) -> String {
                FileHandle(forReadingAtPath: file).map { String(decoding: $0.readDataToEndOfFile(), as: UTF8.self) } ?? ""
            }
            let maps = read("/proc/self/maps").split(separator: "\n").filter { $0.contains(path + "/") }.map { "map " + $0 }
            let fds = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []).compactMap { fd -> String? in
                guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + fd),
                      target == path || target.hasPrefix(path + "/") else { return nil }
                return "fd \(fd) -> \(target)"
            }
            let locks = ProcLocks.held(by: getpid(), under: directory.path).map { "lock \($0)" }
            return maps + fds + locks
        }
        // (Threads let go of what they hold within moments: looked at until clean, for 10 s.)
        let start = ContinuousClock.now
        var left = remains()
        while !left.isEmpty, ContinuousClock.now - start < .seconds(10) {
            try await Task.sleep(for: .milliseconds(20))
            left = remains()
        }
        #expect(left.isEmpty, "\(left)")
    }
}
