@testable import Baton
import Testing

@Suite("Deadlines")
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
        // Bounded by the time that passed around it, not by a fixed slack: a thread of a
        // starved test run may lose its processor between any two lines.
        let before = ContinuousClock.now
        let deadline = try Deadline.seconds(2)
        let remaining = try #require(deadline.remaining)
        let passed = ContinuousClock.now - before
        #expect(remaining >= .seconds(2) - passed && remaining <= .seconds(2), "\(remaining) left, \(passed) passed")
        #expect(try Deadline.seconds(0).hasPassed)
        #expect(try Deadline.seconds(9e9) != .never)
    }

    @Test("a deadline gives back the instant it was made from, and orders and compares by it")
    func instants() {
        let now = ContinuousClock.now
        let instants = [now, now - .seconds(3600), now + .nanoseconds(1), now + .seconds(86_400 * 365 * 100)]
        for instant in instants {
            #expect(Deadline(instant).instant == instant)
            #expect(Deadline(instant) == Deadline(instant))
            #expect(Deadline(instant).hashValue == Deadline(instant).hashValue)
        }
        #expect(Deadline(now) < Deadline(now + .nanoseconds(1)))
        #expect(!(Deadline(now + .nanoseconds(1)) < Deadline(now)))
        #expect(Deadline(now + .seconds(1)) < .never)
        #expect(!(Deadline.never < Deadline(now)))
        #expect(Deadline(now).earliest(.never) == Deadline(now))
        #expect(Deadline.never.instant == nil && Deadline.never.remaining == nil && !Deadline.never.hasPassed)
        #expect(Deadline(now - .seconds(1)).hasPassed)
        #expect(Deadline(now - .seconds(1)).remaining == .zero)
        #expect(!Deadline(now + .seconds(60)).hasPassed)
    }

    @Test("a kernel sleep until a deadline: no timeout for never, zero once passed, the time left otherwise")
    func sleepTimeouts() {
        #expect(Deadline.never.sleepTimeout == -1)
        #expect(Deadline.after(.seconds(-5)).sleepTimeout == 0)
        let timeout = Deadline.after(.seconds(2)).sleepTimeout
        #expect(timeout > 1_500_000_000 && timeout <= 2_000_000_000)
        let now = KernelWaitThread.now()
        let deadline = Deadline(KernelWaitThread.instant(now + 1000))
        #expect(!deadline.hasPassed(at: now + 999))
        #expect(deadline.hasPassed(at: now + 1000) && deadline.hasPassed(at: now + 5000))
        #expect(!Deadline.never.hasPassed(at: .max))
    }
}
