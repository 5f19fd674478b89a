import BatonTestSupport
import Testing

/// The test support's own rules, which every process-spawning test leans on.
@Suite("Test support")
struct TestSupportTests {
    /// A task that looks for a line only after its deadline (resumed late: the cooperative pool
    /// busy with other suites) still finds a line the child printed in time. Before the last
    /// look, `line(timeout:)` threw "timed out" with the line in its own message.
    @Test("a line printed before the deadline is found by a look that comes after it")
    func lineFoundByALateLook() async throws {
        let child = try ChildProcess(["--help"], container: nil)
        #expect(try await child.wait() == 0)
        let line = try await child.line(timeout: 0)
        #expect(!line.isEmpty)
    }
}
