import Baton

/// The loop of a `watch` subcommand (`baton signal watch`, `baton defaults watch`), once.
///
/// Prints `ready` when `announce` is set (the caller is already observing, so nothing after the
/// line is missed), then takes the `--timeout` deadline and waits for events with `next` until
/// `count` have come, or forever without a count; `show` prints each. A `timedOut` from either
/// ends the command with status 3 (``ExitStatus/timedOut``) and one line on standard error:
/// `timed out: <what(seen)>[ of <count> expected] within <timeout> s`.
///
/// - Parameters:
///   - announce: The command's `--announce`.
///   - count: The command's `--count`: after this many events the command ends with status 0.
///   - timeout: The command's `--timeout` in seconds (checked by ``ArgumentCheck/seconds(_:)``).
///   - what: What was awaited, given how many events came (`"signal x delivered 2 times"`).
///   - next: Waits for the next event until the deadline.
///   - show: Prints an event (one line through ``emit(_:)``).
package func watchLoop<Event>(
    announce: Bool,
    count: Int?,
    timeout: Double?,
    timedOut what: (_ seen: Int) -> String,
    next: (Deadline) async throws -> Event,
    show: (Event) throws -> Void
) async throws {
    if announce { emit("ready") }
    let deadline = try Deadline.option(timeout)
    var seen = 0
    while count.map({ seen < $0 }) ?? true {
        do {
            let event = try await next(deadline)
            seen += 1
            try show(event)
        } catch let error as BatonError where error.code == .timedOut {
            throw CommandOutcome.timedOut("\(what(seen))\(count.map { " of \($0) expected" } ?? "")", after: timeout)
        }
    }
}
