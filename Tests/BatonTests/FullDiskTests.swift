import Baton
import Foundation
import Synchronization
import BatonTestSupport
import Testing

/// A container on a file system that fills up: a 4 MiB tmpfs mounted for the test (root), or,
/// where mounting is not allowed, a file-size limit (`RLIMIT_FSIZE`) on the `baton` children,
/// which makes growing a file fail with `EFBIG` the way a full disk fails with `ENOSPC`.
final class SmallDisk: Sendable {
    let path: String
    let mounted: Bool
    private let directory: TemporaryContainer
    /// The size limit of the fallback, in 512-byte blocks (0 once "filled").
    private let limitBlocks = Mutex(8192)

    init() throws {
        directory = try TemporaryContainer()
        path = directory.path
        let allowMount = ProcessInfo.processInfo.environment["BATON_TEST_NO_MOUNT"] == nil
        mounted = allowMount && geteuid() == 0 && Self.run("/bin/mount", ["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", directory.path]) == 0
        print("full-disk test: \(mounted ? "4 MiB tmpfs at \(path)" : "no mount allowed here, RLIMIT_FSIZE fallback (files capped at 4 MiB, 0 bytes of growth once full)")")
    }

    deinit { if mounted { _ = Self.run("/bin/umount", ["-l", path]) } }

    static func run(_ tool: String, _ arguments: [String]) -> Int32 {
        (try? runProgram(tool, arguments))?.status ?? -1
    }

    /// Takes every free byte with a filler file (tmpfs), or lowers the size limit to the files'
    /// current sizes (no file may grow).
    func fill() throws {
        guard mounted else {
            limitBlocks.withLock { $0 = 0 }
            return
        }
        // Close-on-exec: a child spawned meanwhile by another test must not keep the filler alive.
        let fd = open(path + "/filler", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        defer { close(fd) }
        let chunk = [UInt8](repeating: 0xAB, count: 64 * 1024)
        while chunk.withUnsafeBytes({ write(fd, $0.baseAddress!, $0.count) }) > 0 {}
    }

    func free() {
        unlink(path + "/filler")
        limitBlocks.withLock { $0 = 8192 }
    }

    /// Runs `baton <arguments>` in the container (under the size limit when not mounted).
    func baton(_ arguments: [String]) async throws -> (status: Int32, lines: [String], errors: [String]) {
        if mounted { return try await runBaton(arguments, container: path) }
        // ulimit -f counts 512-byte blocks; SIGXFSZ ignored so the call fails with EFBIG.
        // sh -c SCRIPT baton ARGS: the script sees baton as $0 and ARGS as "$@".
        let blocks = limitBlocks.withLock { $0 }
        let child = try ChildProcess(
            rawArguments: arguments.map { Array($0.utf8) }, container: path,
            program: "/bin/sh", programArguments: ["-c", "ulimit -f \(blocks); trap '' XFSZ; exec \"$0\" \"$@\""])
        let status = try await child.wait(timeout: 30)
        return (status, child.lines, child.errorLines)
    }
}

@Suite("Full disk")
struct FullDiskTests {
    static let commands: [[String]] = [
        ["signal", "post", "fresh-name"],
        ["defaults", "set", "theme", "dark"],
        ["role", "acquire", "core", "--role", "executor", "--hold", "0", "--timeout", "2"],
        ["channel", "send", "jobs", "1"],
        ["inbox", "put", "call-1", "hello"],
    ]

    @Test("every store refuses to start on a full disk with noSpace (no crash), then works once space is freed")
    func fullFromTheStart() async throws {
        let disk = try SmallDisk()
        try disk.fill()
        for command in Self.commands {
            let result = try await disk.baton(command)
            #expect(result.status > 0 && result.status < 128, "\(command) exited \(result.status): \(result.errors)")
            #expect(result.errors.joined().contains("noSpace"), "\(command): \(result.errors)")
        }
        disk.free()
        for command in Self.commands {
            let result = try await disk.baton(command)
            #expect(result.status == 0, "\(command) after freeing space: \(result.status) \(result.errors)")
        }
    }

    @Test("a store that must grow on a full disk throws noSpace and keeps every value it had")
    func growthKeepsOldData() async throws {
        let disk = try SmallDisk()
        #expect(try await disk.baton(["defaults", "set", "kept", "v1"]).status == 0)
        #expect(try await disk.baton(["channel", "send", "jobs", "\"first\""]).status == 0)
        try disk.fill()
        // Values of 64 KiB until the log cannot grow.
        let big = String(repeating: "x", count: 64 * 1024)
        var stored = 0
        var refused: (status: Int32, errors: [String])?
        for index in 0..<200 {
            let result = try await disk.baton(["defaults", "set", "big\(index)", big])
            if result.status != 0 { refused = (result.status, result.errors); break }
            stored += 1
        }
        let failure = try #require(refused, "the defaults log never ran out of space")
        #expect(failure.status > 0 && failure.status < 128, "exit \(failure.status): \(failure.errors)")
        #expect(failure.errors.joined().contains("noSpace"), "\(failure.errors)")
        #expect(try await disk.baton(["defaults", "get", "kept"]).lines == ["v1"])
        for index in 0..<stored {
            #expect(try await disk.baton(["defaults", "get", "big\(index)"]).lines.first?.count == big.count)
        }
        // The channel: elements of 64 KiB until the log cannot grow; every accepted one arrives.
        var sent = 1
        var channelRefused: (status: Int32, errors: [String])?
        for _ in 0..<200 {
            let result = try await disk.baton(["channel", "send", "jobs", "\"\(big)\""])
            if result.status != 0 { channelRefused = (result.status, result.errors); break }
            sent += 1
        }
        let channelFailure = try #require(channelRefused, "the channel never ran out of space")
        #expect(channelFailure.status > 0 && channelFailure.status < 128, "exit \(channelFailure.status)")
        #expect(channelFailure.errors.joined().contains("noSpace"), "\(channelFailure.errors)")
        disk.free()
        let received = try await disk.baton(["channel", "receive", "jobs", "--count", "\(sent)", "--timeout", "10"])
        #expect(received.status == 0)
        #expect(received.lines.count == sent)
        #expect(received.lines.first == "\"first\"")
    }
}
