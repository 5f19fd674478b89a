import Baton
import Testing

@Suite("Deadlines from numbers of seconds")
struct DeadlineTests {
    @Test("NaN and negative numbers are invalidArgument", arguments: [Double.nan, -Double.nan, -1, -1e300, -Double.infinity, -Double.leastNonzeroMagnitude])
    func refused(seconds: Double) {
        #expect { _ = try Deadline.seconds(seconds) } throws: { ($0 as? BatonError)?.code == .invalidArgument }
    }

    @Test("numbers past the clock's range saturate to never", arguments: [9.3e9, 1e10, 1e300, Double.greatestFiniteMagnitude, Double.infinity])
    func saturated(seconds: Double) throws {
        #expect(try Deadline.seconds(seconds) == .never)
    }

    @Test("ordinary numbers give a deadline that far ahead")
    func ordinary() throws {
        let deadline = try Deadline.seconds(2)
        let remaining = try #require(deadline.remaining)
        #expect(remaining > .seconds(1.5) && remaining <= .seconds(2))
        #expect(try Deadline.seconds(0).hasPassed)
        #expect(try Deadline.seconds(9e9) != .never)
    }
}
