import Baton
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A scenario for `baton simulate`: the programs to run as the app and as the notification
/// service extension, the pushes, what the user does, and the chaos, on a seeded schedule.
///
/// ```json
/// {
///   "seconds": 12, "seed": 7, "rule": "apple",
///   "app": {"command": ["./my-core", "--app"]},
///   "extension": {"command": ["python3", "./extension.py"], "environment": {"LOG": "1"}},
///   "limits": {"extension_seconds": 30, "extension_memory_mib": 24, "suspension_grace_ms": 5000, "background_seconds": 5},
///   "pushes": [{"at": 1.5, "id": "m1", "payload": "{\"text\":\"hi\"}"}],
///   "actions": [{"at": 0, "do": "open"}, {"at": 3, "do": "background"}, {"at": 6, "do": "lock"}],
///   "chaos": {"seed": 3, "interval": 2.5}
/// }
/// ```
/// Command arguments that start with `./` or `../` are relative to the scenario file's directory.
public struct Scenario: Sendable, Hashable, Codable {
    /// The length of the scripted part, in seconds (the run then waits for pushes in flight).
    public var seconds: Double = 10
    /// The seed of the chaos schedule.
    public var seed: UInt64 = 1
    /// The 0xDEAD10CC rule (`apple` or `strict`).
    public var rule: DeadLockRule = .apple
    /// The app's program; nil for a scenario without an app.
    public var app: Simulator.Program?
    /// The extension's program; nil for a scenario without pushes.
    public var `extension`: Simulator.Program?
    public var limits = Limits()
    /// Push notifications, each launching or reusing an extension process.
    public var pushes: [Push] = []
    /// What the user does with the app.
    public var actions: [Action] = []
    /// Faults on a seeded schedule; nil for none.
    public var chaos: Chaos?
    /// Require every push to be reported `shown` exactly once (default true).
    public var expectEveryPushShown: Bool = true

    public init() {}

    public init(from decoder: any Decoder) throws {
        let values = try decoder.container(keyedBy: CodingKeys.self)
        seconds = try values.decodeIfPresent(Double.self, forKey: .seconds) ?? 10
        seed = try values.decodeIfPresent(UInt64.self, forKey: .seed) ?? 1
        rule = try values.decodeIfPresent(DeadLockRule.self, forKey: .rule) ?? .apple
        app = try values.decodeIfPresent(Simulator.Program.self, forKey: .app)
        self.extension = try values.decodeIfPresent(Simulator.Program.self, forKey: .extension)
        limits = try values.decodeIfPresent(Limits.self, forKey: .limits) ?? Limits()
        pushes = try values.decodeIfPresent([Push].self, forKey: .pushes) ?? []
        actions = try values.decodeIfPresent([Action].self, forKey: .actions) ?? []
        chaos = try values.decodeIfPresent(Chaos.self, forKey: .chaos)
        expectEveryPushShown = try values.decodeIfPresent(Bool.self, forKey: .expectEveryPushShown) ?? true
    }

    /// The system's limits and timings.
    public struct Limits: Sendable, Hashable, Codable {
        /// An extension instance running longer is killed (iOS: 30 s); `time-will-expire` comes 3 s before.
        public var extensionSeconds: Double = 30
        /// The extension's memory limit in MiB (iOS: 24).
        public var extensionMemoryMib: Int = 24
        /// `dirty` (what iOS counts) or `resident`.
        public var memoryMeasure: String = "dirty"
        /// The time between `will-suspend` and SIGSTOP, in milliseconds.
        public var suspensionGraceMs: Int = 5000
        /// The time the app runs in the background before the system suspends it, in seconds.
        public var backgroundSeconds: Double = 5
        /// An idle extension process is suspended (checked against the rule), then told
        /// `will-terminate`, after this many seconds.
        public var extensionIdleSeconds: Double = 3

        public init() {}

        public init(from decoder: any Decoder) throws {
            let values = try decoder.container(keyedBy: CodingKeys.self)
            let defaults = Limits()
            extensionSeconds = try values.decodeIfPresent(Double.self, forKey: .extensionSeconds) ?? defaults.extensionSeconds
            extensionMemoryMib = try values.decodeIfPresent(Int.self, forKey: .extensionMemoryMib) ?? defaults.extensionMemoryMib
            memoryMeasure = try values.decodeIfPresent(String.self, forKey: .memoryMeasure) ?? defaults.memoryMeasure
            suspensionGraceMs = try values.decodeIfPresent(Int.self, forKey: .suspensionGraceMs) ?? defaults.suspensionGraceMs
            backgroundSeconds = try values.decodeIfPresent(Double.self, forKey: .backgroundSeconds) ?? defaults.backgroundSeconds
            extensionIdleSeconds = try values.decodeIfPresent(Double.self, forKey: .extensionIdleSeconds) ?? defaults.extensionIdleSeconds
        }
    }

    /// One push notification.
    public struct Push: Sendable, Hashable, Codable {
        /// Seconds after the start.
        public var at: Double
        /// The message id (reported back with `shown`).
        public var id: String
        /// The payload handed to the extension (a string; often JSON).
        public var payload: String?

        public init(at: Double, id: String, payload: String? = nil) {
            (self.at, self.id, self.payload) = (at, id, payload)
        }
    }

    /// One user (or system) action on the app.
    public struct Action: Sendable, Hashable, Codable {
        /// Seconds after the start.
        public var at: Double
        /// What happens.
        public var `do`: Step

        public init(at: Double, do step: Step) {
            self.at = at
            self.do = step
        }
    }

    /// What the user or the system does to the app.
    public enum Step: String, Sendable, Hashable, Codable {
        /// The user opens the app: launched if needed (resumed if suspended), in the foreground.
        case open
        /// The user leaves the app: background, then suspended after `background_seconds`.
        case background
        /// The system suspends the app now (`will-suspend`, grace period, SIGSTOP, the rule).
        case suspend
        /// The user locks the phone: background and suspension at once.
        case lock
        /// The system terminates the app (SIGKILL, as it does to suspended apps).
        case terminate
    }

    /// Seeded faults: SIGKILL and SIGSTOP stalls of the app and extensions (see ``FaultPlan``).
    public struct Chaos: Sendable, Hashable, Codable {
        public var seed: UInt64?
        /// The mean seconds between faults.
        public var interval: Double?

        public init(seed: UInt64? = nil, interval: Double? = nil) {
            self.seed = seed
            self.interval = interval
        }
    }

    /// The fault schedule: empty without chaos.
    public var faultPlan: FaultPlan {
        guard let chaos else { return FaultPlan(faults: []) }
        return FaultPlan.random(seed: chaos.seed ?? seed, window: (seconds * 0.05)...(seconds * 0.8), interval: chaos.interval ?? max(1.0, seconds / 14))
    }

    /// Reads a scenario file; relative program paths (`./x`, `../x`) become relative to its directory.
    /// - Throws: `invalidArgument` naming the file and what is wrong with it.
    public static func load(_ path: String) throws -> Scenario {
        guard let bytes = ProcFS.read(path) else {
            throw BatonError(.invalidArgument, "cannot read the scenario file \(path)")
        }
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        var scenario: Scenario
        do {
            scenario = try decoder.decode(Scenario.self, from: Data(bytes.utf8))
        } catch {
            throw BatonError(.invalidArgument, "the scenario file \(path) is not valid: \(describeDecodingError(error))")
        }
        let directory = path.contains("/") ? String(path[..<path.lastIndex(of: "/")!]) : "."
        func resolve(_ program: Simulator.Program?) -> Simulator.Program? {
            guard var program else { return nil }
            program.command = program.command.map { $0.hasPrefix("./") || $0.hasPrefix("../") ? directory + "/" + $0 : $0 }
            return program
        }
        scenario.app = resolve(scenario.app)
        scenario.extension = resolve(scenario.extension)
        return scenario
    }

    /// The actions in time order, with the system's own: a backgrounded app is suspended after
    /// `background_seconds` unless another action came first.
    public var timedActions: [Action] {
        let sorted = actions.sorted { $0.at < $1.at }
        var result = sorted
        for (index, action) in sorted.enumerated() where action.do == .background {
            let due = action.at + limits.backgroundSeconds
            if !sorted[(index + 1)...].contains(where: { $0.at <= due }) { result.append(Action(at: due, do: .suspend)) }
        }
        return result.sorted { $0.at < $1.at }
    }

    /// Performs one action on the app.
    static func perform(_ step: Step, on simulator: Simulator) async throws {
        switch step {
        case .open:
            try await simulator.foregroundApp()
        case .background:
            simulator.backgroundApp()
        case .suspend:
            await simulator.suspendApp()
        case .lock:
            simulator.backgroundApp()
            await simulator.suspendApp()
        case .terminate:
            await simulator.terminateApp()
        }
    }
}
