import Baton
import BatonTestSupport
import Foundation
import Testing

/// `catch BatonError.busy`: the codes are patterns (`BatonError.Code.~=`), as GRDB's
/// `catch DatabaseError.SQLITE_BUSY` is, and they match errors thrown by real operations.
@Suite("Error matching", .serialized, .timeLimit(.minutes(1)))
struct ErrorMatchingTests {
    /// Which `catch` clause took the error.
    enum Caught: Equatable { case busy, timedOut, otherBaton(String), other }

    static func classify(_ body: () async throws -> Void) async -> Caught? {
        do {
            try await body()
            return nil
        } catch BatonError.timedOut {
            return .timedOut
        } catch BatonError.busy {
            return .busy
        } catch let error as BatonError {
            return .otherBaton(error.code.rawValue)
        } catch {
            return .other
        }
    }

    @Test func busyMatchesARoleHeldByAChildProcess() async throws {
        let dir = try TemporaryContainer()
        let role = try SharedContainer(path: dir.path).role()
        let main = try ChildProcess(["role", "acquire", "--role", "main", "--hold", "60"], container: dir.path)
        defer { main.signal(SIGKILL) }
        _ = try await main.line(timeout: 30) { $0.contains("\"acquired\"") }
        let caught = await Self.classify {
            _ = try await role.acquire(priority: .executor, deadline: .after(.milliseconds(100)))
        }
        #expect(caught == .busy)
    }

    @Test func timedOutMatchesAReceiveThatReachesItsDeadline() async throws {
        let dir = try TemporaryContainer()
        let channel = try SharedChannel<Int>(SharedContainer(path: dir.path), name: "empty", capacity: .bounded(1))
        let caught = await Self.classify {
            _ = try await channel.receive(deadline: .after(.milliseconds(50)))
        }
        #expect(caught == .timedOut)
    }

    @Test func aCodeMatchesOnlyBatonErrorsOfThatCode() {
        let busy = BatonError(.busy, "held")
        #expect(BatonError.busy ~= busy)
        #expect(BatonError.Code.busy ~= busy)
        #expect(!(BatonError.timedOut ~= busy))
        #expect(!(BatonError.busy ~= CancellationError()))
        // The same list serves `error.code == .busy` and `switch error.code`.
        #expect(busy.code == .busy && BatonError.busy == BatonError.Code.busy)
        // A code added by another module matches the same way.
        let custom = BatonError.Code("customForTest")
        #expect(custom ~= BatonError(custom, "x"))
    }

    /// The simulator's code is in the one list too: `catch BatonError.simulationFailed`.
    @Test func simulationFailedIsInTheOneList() {
        let failed = BatonError(.simulationFailed, "the app did not report ready")
        #expect(BatonError.simulationFailed ~= failed && BatonError.Code.simulationFailed ~= failed)
        #expect(!(BatonError.simulationFailed ~= BatonError(.systemCallFailed, "x")))
        #expect(BatonError.simulationFailed.rawValue == "simulationFailed")
        do { throw failed } catch BatonError.simulationFailed {} catch { Issue.record("not matched: \(error)") }
    }
}
