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
    func readOnly() throws {
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
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups", ChildProcess.executable,
                             "presence", "list", "--container", readOnly]
        // Standard error goes to a file, not a pipe: a child that another test spawns meanwhile
        // may inherit the pipe's write end and keep it open, and reading to the end would then
        // block this test (and a thread of the shared pool) until that child exits.
        let errorsPath = directory.path + "/stderr.txt"
        #expect(FileManager.default.createFile(atPath: errorsPath, contents: nil))
        let errors = try FileHandle(forWritingTo: URL(fileURLWithPath: errorsPath))
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        try errors.close()
        let message = (try? String(contentsOfFile: errorsPath, encoding: .utf8)) ?? ""
        if message.contains("failed to execute") {
            // The checkout is not reachable by an unprivileged user here; nothing to check.
            return
        }
        #expect(process.terminationStatus != 0)
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

    @Test("the command line explains a bad container")
    func commandLine() async throws {
        let result = try await runBaton(["presence", "list", "--container", "/nonexistent/x"], container: nil)
        #expect(result.status != 0)
    }
}
