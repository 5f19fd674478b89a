import Baton
import BatonBench
import Foundation
import BatonTestSupport
import Testing

/// The command line as users meet it (issue 19): one exit-status convention, one line on
/// standard error for an absence or a timeout, one JSON style, checks before long runs, and
/// `baton inspect`. Every test runs the real `baton`.
@Suite("The command line as users meet it")
struct CommandLineProductTests {
    static func object(_ line: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? [:]
    }

    static func event(_ name: String) -> @Sendable (String) -> Bool {
        { line in (object(line)["event"] as? String) == name }
    }

    /// Every regular file under `path` and its bytes, and every other entry by type.
    static func snapshot(_ path: String) -> [String: Data] {
        var result: [String: Data] = [:]
        guard let walker = FileManager.default.enumerator(atPath: path) else { return result }
        while let relative = walker.nextObject() as? String {
            var info = stat()
            guard lstat(path + "/" + relative, &info) == 0 else { continue }
            switch info.st_mode & S_IFMT {
            case S_IFREG: result[relative] = FileManager.default.contents(atPath: path + "/" + relative) ?? Data()
            case S_IFDIR: result[relative + "/"] = Data()
            default: result[relative + " (special)"] = Data()
            }
        }
        return result
    }

    @Test("bench inbox without the sample extension says what is missing and how to build it")
    func benchInboxWithoutItsSample() async throws {
        let missing = FileManager.default.temporaryDirectory.appendingPathComponent("no-baton-extension-sample-\(getpid())").path
        let child = try ChildProcess(rawArguments: ["bench", "inbox", "--quick", "--conditions", "idle"].map { Array($0.utf8) }, container: nil,
                                     environment: ["BATON_EXTENSION_SAMPLE": missing])
        let status = try await child.wait(timeout: 60)
        #expect(status == 66, "exit status \(status): \(child.errorLines)")
        #expect(child.errorLines.contains { $0.contains(missing) && $0.contains("--product baton-extension-sample") }, "\(child.errorLines)")
    }

    /// The roles suite's breakdown of a preemption: the executor stamps when it saw the stop
    /// request and when its release returned, and each round's stamps are its own (read once
    /// the executor wrote them, not left over from the round before).
    @Test("bench roles breaks each preemption down with that round's own stamps")
    func benchRolesBreakdownUsesEachRoundsStamps() async throws {
        let result = try await runBaton(["bench", "roles", "--quick", "--conditions", "idle", "--json"], container: nil, timeout: 120)
        #expect(result.status == 0, "exit status \(result.status): \(result.errors)")
        let notes = (Self.object(result.lines.joined())["notes"] as? [String: String]) ?? [:]
        for key in ["preemption_breakdown", "preemption_default_executor_breakdown"] {
            let note = try #require(notes[key], "no \(key) note in \(notes.keys.sorted())")
            // "... sees the stop request at S us, has released at R us, main holds at H us; ...
            // as request-to-seen/seen-to-released/released-to-held us: a/b/c, ..."
            func figure(after words: String) throws -> Double {
                let tail = try #require(note.range(of: words), "no '\(words)' in \(note)").upperBound
                return try #require(Double(note[tail...].prefix { "0123456789.-".contains($0) }), "no figure after '\(words)' in \(note)")
            }
            // A median keeps the order that holds in every round: the release comes after the
            // stop request is seen.
            #expect(try figure(after: "sees the stop request at ") <= figure(after: "has released at "), "\(key): \(note)")
            // And in every round, which a stamp left over from the round before breaks.
            #expect(try figure(after: "the shortest release from seen to released: ") >= 0, "\(key): \(note)")
            let rows = try #require(note.components(separatedBy: "released-to-held us: ").last).components(separatedBy: ", ")
            for row in rows {
                let steps = row.split(separator: "/").compactMap { Double($0) }
                #expect(steps.count == 3 && steps[1] >= 0, "\(key): a round released before it saw the stop request: \(row)")
            }
        }
    }

    @Test("bench notes that differ between the conditions are kept once per condition")
    func benchNotesPerCondition() {
        let merged = BenchCommand.merge([
            (condition: "idle", notes: ["method": "m", "breakdown": "fast"]),
            (condition: "loaded", notes: ["method": "m", "breakdown": "slow", "extra": "x"]),
        ])
        #expect(merged == ["method": "m", "breakdown_idle": "fast", "breakdown_loaded": "slow", "extra_loaded": "x"])
    }

    /// The lifecycle suite measures the hand-over a second time with every process on one
    /// processor, beside a raw floor measured the same way: both rows, each against its own
    /// floor, or a note that says why they are missing (a process that cannot be pinned).
    @Test("bench lifecycle reports the hand-over on one processor beside its own floor, or says why not")
    func benchLifecycleOneProcessorRows() async throws {
        let result = try await runBaton(["bench", "lifecycle", "--quick", "--conditions", "idle", "--json"], container: nil, timeout: 120)
        #expect(result.status == 0, "exit status \(result.status): \(result.errors)")
        let report = Self.object(result.lines.joined())
        let rows = (report["results"] as? [[String: Any]]) ?? []
        let note = (report["notes"] as? [String: String])?["one_processor"] ?? ""
        let pinned = rows.filter { ($0["name"] as? String)?.contains("_one_processor_") == true }
        if note.hasPrefix("not measured") {
            #expect(pinned.isEmpty, "rows without a pin: \(pinned)")
        } else {
            #expect(!note.isEmpty, "no one_processor note: \(report["notes"] ?? "none")")
            let names = Set(pinned.compactMap { $0["name"] as? String })
            for percentile in ["p50", "p99"] {
                for kind in ["preemption_to_connected_one_processor", "preemption_to_connected_signal_thread_one_processor"] {
                    #expect(names.contains("\(kind)_\(percentile)_us"), "\(kind) \(percentile) missing: \(names)")
                }
            }
            for row in pinned {
                #expect(row["floor_name"] as? String == "raw_flock_handover_connect_one_processor_\(((row["name"] as? String) ?? "").contains("_p50_") ? "p50" : "p99")_us", "\(row)")
                #expect(((row["value"] as? Double) ?? 0) > 0 && ((row["floor"] as? Double) ?? 0) > 0, "\(row)")
            }
        }
    }

    @Test("each class of outcome has its own exit status, the same in every subcommand")
    func exitStatusClasses() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        // 0: success.
        #expect(try await runBaton(["defaults", "set", "present", "1"], container: path).status == 0)
        // 1: absent, said in one line.
        let absent = try await runBaton(["defaults", "get", "missing"], container: path)
        #expect(absent.status == 1)
        #expect(absent.errors.count == 1 && absent.errors[0].contains("missing"), "\(absent.errors)")
        // 3: timed out, in every waiting command, said in one line.
        for arguments in [
            ["signal", "watch", "quiet", "--timeout", "0.2"],
            ["defaults", "watch", "k", "--timeout", "0.2"],
            ["channel", "receive", "empty", "--timeout", "0.2"],
        ] {
            let result = try await runBaton(arguments, container: path)
            #expect(result.status == 3, "\(arguments): \(result.status)")
            #expect(result.errors.count == 1 && result.errors[0].hasPrefix("timed out"), "\(arguments): \(result.errors)")
        }
        let lockHolder = try ChildProcess(["lock", "hold", "locks/x"], container: path)
        _ = try await lockHolder.line(timeout: 30) { $0 == "acquired" }
        let lockTimeout = try await runBaton(["lock", "hold", "locks/x", "--timeout", "0.2"], container: path)
        #expect(lockTimeout.status == 3)
        #expect(lockTimeout.errors.count == 1 && lockTimeout.errors[0].hasPrefix("timed out"), "\(lockTimeout.errors)")
        lockHolder.signal(SIGTERM)
        #expect(try await lockHolder.wait() == 0)
        // 4: busy.
        let main = try ChildProcess(["role", "acquire", "--role", "main", "--hold", "60"], container: path)
        _ = try await main.line(timeout: 30, matching: Self.event("acquired"))
        let busy = try await runBaton(["role", "acquire", "--role", "executor", "--timeout", "0.3"], container: path)
        #expect(busy.status == 4, "\(busy.lines) \(busy.errors)")
        main.signal(SIGTERM)
        _ = try await main.wait()
        // 5: ended by the other side.
        #expect(try await runBaton(["channel", "close", "done"], container: path).status == 0)
        let closed = try await runBaton(["channel", "send", "done", "1"], container: path)
        #expect(closed.status == 5)
        #expect(closed.errors.count == 1, "\(closed.errors)")
        // 6: damaged data.
        let text = path + "/notes.sqlite"
        #expect(FileManager.default.createFile(atPath: text, contents: Data("not a database, only text that is long enough for a header\n".utf8)))
        #expect(try await runBaton(["db", "check", text], container: path).status == 6)
        // 64: invalid input, with the subcommand's usage.
        let negative = try await runBaton(["signal", "post", "x", "--state", "-1"], container: path)
        #expect(negative.status == 64)
        #expect(negative.errors.first?.contains("negative") == true, "\(negative.errors)")
        let missingRole = try await runBaton(["role", "acquire"], container: path)
        #expect(missingRole.status == 64)
        #expect(missingRole.errors.count == 1 && missingRole.errors[0].contains("usage: baton role acquire"), "\(missingRole.errors)")
        #expect(negative.errors.count == 1 && negative.errors[0].contains("usage: baton signal post"), "\(negative.errors)")
        let badJSON = try await runBaton(["defaults", "set", "j", "{x", "--type", "json"], container: path)
        #expect(badJSON.status == 64)
        #expect(badJSON.errors.first?.contains("not valid JSON") == true && badJSON.errors.allSatisfy { !$0.contains("DecodingError") }, "\(badJSON.errors)")
        // 66: not found.
        #expect(try await runBaton(["signal", "post", "x", "--container", path + "/nowhere"], container: nil).status == 66)
        let gone = try ChildProcess(["presence", "list"], container: path)
        _ = try await gone.wait()
        let expire = try await runBaton(["lifecycle", "expire", "--pid", String(gone.pid)], container: path)
        #expect(expire.status == 66, "\(expire.lines) \(expire.errors)")
        // 70: internal failure, here `simulationFailed` (a simulated app that cannot start).
        let unstartable = try TemporaryContainer()
        let scenario = unstartable.path + "/unstartable.json"
        #expect(FileManager.default.createFile(atPath: scenario, contents: Data(#"{"seconds": 1, "rule": "apple", "app": {"command": ["/nonexistent/baton-test-program"]}, "actions": [{"at": 0, "do": "open"}]}"#.utf8)))
        let failed = try await runBaton(["simulate", scenario], container: unstartable.path)
        #expect(failed.status == 70, "\(failed.lines) \(failed.errors)")
        #expect(failed.errors.count == 1 && failed.errors[0].hasPrefix("Error: simulationFailed: cannot start"), "\(failed.errors)")
        // 77: refused for safety.
        let shared = try TemporaryContainer()
        #expect(chmod(shared.path, 0o777) == 0)
        #expect(try await runBaton(["signal", "post", "x"], container: shared.path).status == 77)
        // And the table is in `baton --help`.
        let help = try await runBaton(["--help"], container: nil)
        for status in ["0 ", "1 ", "3 ", "4 ", "5 ", "6 ", "64", "66", "70", "77"] {
            #expect(help.lines.contains { $0.trimmingCharacters(in: .whitespaces).hasPrefix(status) }, "status \(status) missing from --help")
        }
    }

    @Test("every --json output has snake_case keys and ISO 8601 times")
    func jsonStyle() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        let holder = try ChildProcess(["role", "acquire", "--role", "executor", "--hold", "60", "--ignore-stop"], container: path)
        _ = try await holder.line(timeout: 30, matching: Self.event("acquired"))
        let waiter = try ChildProcess(["role", "acquire", "--role", "main", "--hold", "0", "--timeout", "60", "--grace", "30"], container: path)
        let presence = try ChildProcess(["presence", "hold", "--kind", "app"], container: path)
        _ = try await presence.line(timeout: 30) { $0.hasPrefix("registered") }
        #expect(try await runBaton(["inbox", "put", "m1", "hello"], container: path).status == 0)
        #expect(try await runBaton(["defaults", "set", "k", "v"], container: path).status == 0)
        // The stop request is visible once the waiter asked.
        _ = try await holder.line(timeout: 30, matching: Self.event("stop-requested"))
        var outputs: [(String, String)] = []
        for arguments in [
            ["role", "status", "--json"], ["presence", "list", "--json"], ["inbox", "list", "--json"],
            ["db", "check", path + "/baton-inbox.sqlite", "--json"], ["inspect", "--json"], ["defaults", "verify"],
        ] {
            let result = try await runBaton(arguments, container: path)
            #expect(result.status == 0, "\(arguments): \(result.errors)")
            for line in result.lines { outputs.append((arguments.joined(separator: " "), line)) }
        }
        for line in holder.lines { outputs.append(("role acquire", line)) }
        var timeFields = 0
        func check(_ value: Any, _ command: String, key: String?) {
            if let object = value as? [String: Any] {
                for (name, inner) in object {
                    #expect(name.range(of: "^[a-z][a-z0-9_]*$", options: .regularExpression) != nil, "\(command): key \(name)")
                    check(inner, command, key: name)
                }
            } else if let array = value as? [Any] {
                for inner in array { check(inner, command, key: key) }
            } else if let key, ["since", "deadline", "heartbeat", "received_at", "expires_at"].contains(key) {
                timeFields += 1
                #expect((value as? String)?.range(of: #"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"#, options: .regularExpression) != nil, "\(command): \(key) = \(value)")
            }
        }
        for (command, line) in outputs {
            let parsed = try #require(try? JSONSerialization.jsonObject(with: Data(line.utf8)), "\(command): \(line)")
            check(parsed, command, key: nil)
        }
        #expect(timeFields >= 6, "the outputs hold times: since, deadline, heartbeat, received_at, expires_at")
        holder.signal(SIGTERM)
        waiter.signal(SIGTERM)
        presence.signal(SIGTERM)
        // Gone before the container is removed (each deletes its own lock files on the way out).
        for child in [holder, waiter, presence] { _ = try await child.wait() }
    }

    @Test("demo and simulate check --container and --timeline before spawning anything")
    func demoChecksFirst() async throws {
        for arguments in [
            ["demo", "--seconds", "3", "--container", "/nonexistent/baton-demo"],
            ["demo", "--seconds", "3", "--timeline", "/nonexistent/dir/timeline.html"],
        ] {
            let child = try ChildProcess(arguments, container: nil)
            let status = try await child.wait(timeout: 60)
            #expect(status == 66 || status == 64, "\(arguments): \(status)")
            // Nothing was spawned: the run's header (printed before the first child) never came,
            // and no child's error was printed (the old failure: 22 children, each printing the
            // same error, then "did not report ready" 20 s later). No timed bound: a loaded
            // machine starts processes slowly.
            #expect(!child.lines.contains { $0.hasPrefix("baton demo:") }, "\(arguments) started the run: \(child.lines)")
            #expect(child.errorLines.count == 1 && child.errorLines[0].contains("/nonexistent"), "\(arguments): \(child.errorLines)")
        }
    }

    @Test("role acquire releases the role and exits 0 on SIGTERM, like presence hold")
    func roleAcquireTerminates() async throws {
        let directory = try TemporaryContainer()
        let holder = try ChildProcess(["role", "acquire", "--role", "main", "--hold", "600"], container: directory.path)
        _ = try await holder.line(timeout: 30, matching: Self.event("acquired"))
        holder.signal(SIGTERM)
        #expect(try await holder.wait() == 0)
        #expect(holder.lines.contains(where: Self.event("released")), "\(holder.lines)")
        let status = try await runBaton(["role", "status", "--json"], container: directory.path)
        #expect(Self.object(status.lines.first ?? "")["holder"] is NSNull, "\(status.lines)")
        // A waiter stops waiting.
        let main = try ChildProcess(["role", "acquire", "--role", "main", "--hold", "600"], container: directory.path)
        _ = try await main.line(timeout: 30, matching: Self.event("acquired"))
        let waiter = try ChildProcess(["role", "acquire", "--role", "executor", "--timeout", "600"], container: directory.path)
        let role = try SharedContainer(path: directory.path).role()
        try await within(30, "the waiter to queue") {
            while try !role.status().waiters.contains(where: { $0.pid == waiter.pid }) { try await Task.sleep(for: .milliseconds(20)) }
        }
        waiter.signal(SIGTERM)
        #expect(try await waiter.wait() == 0)
        main.signal(SIGTERM)
        #expect(try await main.wait() == 0)
    }

    @Test("reading an unknown suite or role creates no file")
    func readingCreatesNothing() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        #expect(try await runBaton(["defaults", "set", "k", "v"], container: path).status == 0)
        #expect(try await runBaton(["role", "acquire", "--role", "main"], container: path).status == 0)
        let before = Set(Self.snapshot(path).keys.filter { !$0.hasPrefix(".baton/owners/") })
        #expect(try await runBaton(["defaults", "get", "k", "--suite", "unknown"], container: path).status == 1)
        #expect(try await runBaton(["defaults", "list", "--suite", "unknown", "--json"], container: path).lines == ["{}"])
        #expect(try await runBaton(["defaults", "verify", "--suite", "unknown"], container: path).status == 66)
        #expect(try await runBaton(["role", "status", "unknown"], container: path).status == 0)
        #expect(try await runBaton(["role", "status", "unknown", "--json"], container: path).status == 0)
        let after = Set(Self.snapshot(path).keys.filter { !$0.hasPrefix(".baton/owners/") })
        #expect(after == before, "created: \(after.subtracting(before).sorted())")
    }

    @Test("inspect reports a populated container: a held role, a live process, defaults, a channel, a database")
    func inspectPopulated() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        #expect(try await runBaton(["defaults", "set", "greeting", "hello", "--suite", "app"], container: path).status == 0)
        #expect(try await runBaton(["channel", "send", "jobs", "1"], container: path).status == 0)
        #expect(try await runBaton(["channel", "send", "jobs", "2"], container: path).status == 0)
        #expect(try await runBaton(["inbox", "put", "m1", "hello"], container: path).status == 0)
        let holder = try ChildProcess(["role", "acquire", "--role", "main", "--kind", "app", "--hold", "60"], container: path)
        _ = try await holder.line(timeout: 30, matching: Self.event("acquired"))
        let presence = try ChildProcess(["presence", "hold", "--kind", "widget"], container: path)
        _ = try await presence.line(timeout: 30) { $0.hasPrefix("registered") }
        let before = Self.snapshot(path)

        let result = try await runBaton(["inspect", "--json"], container: path)
        #expect(result.status == 0, "\(result.errors)")
        let report = Self.object(result.lines.first ?? "")
        let roles = report["roles"] as? [[String: Any]] ?? []
        let core = try #require(roles.first { $0["name"] as? String == "core" })
        let roleHolder = try #require(core["holder"] as? [String: Any])
        #expect((roleHolder["pid"] as? Int).map(Int32.init) == holder.pid)
        #expect(roleHolder["alive"] as? Bool == true && roleHolder["kind"] as? String == "app" && roleHolder["priority"] as? Int == 100)
        let processes = report["processes"] as? [[String: Any]] ?? []
        #expect(processes.contains { ($0["pid"] as? Int).map(Int32.init) == presence.pid && $0["kind"] as? String == "widget" })
        let suites = report["defaults"] as? [[String: Any]] ?? []
        #expect(suites.contains { $0["suite"] as? String == "app" && $0["keys"] as? [String] == ["greeting"] }, "\(suites)")
        let channels = report["channels"] as? [[String: Any]] ?? []
        #expect(channels.contains { $0["name"] as? String == "jobs" && $0["depth"] as? Int == 2 && $0["capacity"] as? String == "unbounded" }, "\(channels)")
        let databases = report["databases"] as? [[String: Any]] ?? []
        #expect(databases.contains { ($0["path"] as? String)?.hasSuffix("/baton-inbox.sqlite") == true && $0["commits"] as? Int == 1 }, "\(databases)")
        let signals = report["signals"] as? [String: Any] ?? [:]
        #expect((signals["names_used"] as? Int ?? 0) >= 1)
        let locks = report["locks"] as? [[String: Any]] ?? []
        #expect(locks.contains { ($0["pid"] as? Int).map(Int32.init) == presence.pid && $0["kind"] as? String == "widget" }, "\(locks)")
        #expect((report["damage"] as? [Any])?.isEmpty == true)
        // The text form says the same.
        let text = try await runBaton(["inspect"], container: path)
        #expect(text.status == 0)
        #expect(text.lines.contains { $0.contains("core: held by app (pid \(holder.pid)") }, "\(text.lines)")
        #expect(Self.snapshot(path) == before, "inspect changed the container")
        holder.signal(SIGTERM)
        presence.signal(SIGTERM)
        // Gone before the container is removed (each deletes its own lock files on the way out).
        for child in [holder, presence] { _ = try await child.wait() }
    }

    @Test("inspect reports damaged files, does not crash, and changes nothing")
    func inspectDamaged() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        #expect(try await runBaton(["defaults", "set", "first", "one"], container: path).status == 0)
        #expect(try await runBaton(["defaults", "set", "second", "two"], container: path).status == 0)
        #expect(try await runBaton(["channel", "send", "jobs", "1"], container: path).status == 0)
        #expect(try await runBaton(["role", "acquire", "--role", "main"], container: path).status == 0)
        #expect(try await runBaton(["signal", "post", "ping"], container: path).status == 0)
        let baton = path + "/.baton"
        func scribble(_ file: String, at offset: UInt64, _ bytes: String) throws {
            let handle = try #require(FileHandle(forWritingAtPath: baton + "/" + file))
            try handle.seek(toOffset: offset)
            handle.write(Data(bytes.utf8))
            try handle.close()
        }
        try scribble("defaults/standard.log", at: 72, "XXXXXXXXXXXXXXXX")  // inside the first record
        try scribble("channels/jobs", at: 0, "garbage")
        try scribble("signals", at: 0, "garbage!")
        #expect(truncate(baton + "/roles/core/record", 100) == 0)
        #expect(mkfifo(baton + "/channels/fifo", 0o600) == 0)
        let before = Self.snapshot(path)

        let child = try ChildProcess(["inspect", "--json"], container: path)
        let status = try await child.wait(timeout: 30)
        #expect(status == 6, "\(child.errorLines)")
        #expect(child.errorLines.count == 1 && child.errorLines[0].hasPrefix("damaged"), "\(child.errorLines)")
        let report = Self.object(child.lines.first ?? "")
        let damaged = Set((report["damage"] as? [[String: Any]] ?? []).compactMap { $0["file"] as? String })
        for file in ["defaults/standard.log", "channels/jobs", "channels/fifo", "signals", "roles/core/record"] {
            #expect(damaged.contains(file), "\(file) not reported: \(damaged)")
        }
        let suites = report["defaults"] as? [[String: Any]] ?? []
        #expect(suites.first?["keys"] as? [String] == ["second"], "the intact record is still read: \(suites)")
        let text = try await runBaton(["inspect"], container: path)
        #expect(text.status == 6)
        #expect(text.lines.contains { $0.contains("DAMAGED") })
        #expect(Self.snapshot(path) == before, "inspect changed the container")
    }
}
