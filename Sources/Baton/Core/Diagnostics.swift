import Logging

/// What Baton repaired or decided on its own, reported through the container's optional
/// swift-log `Logger` (``SharedContainer/logger``): recoveries, take-overs, overtaken holders,
/// rebuilt tables, skipped dead tickets and refused stale epochs. Nothing is logged without a
/// logger, and nothing is logged on a fast path: each event is a rare repair or decision.
///
/// Every message carries the metadata `baton.event` (one of ``Event``'s raw values) so that a
/// log handler can count or filter events, and `baton.container` (the container's path).
package struct Diagnostics: Sendable {
    /// The kinds of event Baton reports.
    package enum Event: String, Sendable {
        /// A signal table that failed its checks (or was truncated) was replaced.
        case signalTableRebuilt = "signal_table_rebuilt"
        /// A channel's header was repaired after a holder died inside its lock, or its words failed their checks.
        case channelRepaired = "channel_repaired"
        /// A role's holder was dead or suspended; another process took the role.
        case roleTakenOver = "role_taken_over"
        /// A role's holder ignored a stop request past its grace period and was overtaken.
        case roleHolderOvertaken = "role_holder_overtaken"
        /// This process's lease of a role was lost (overtaken, or taken while it was suspended).
        case roleLeaseLost = "role_lease_lost"
        /// A write fenced by a stale epoch was refused.
        case staleEpochRefused = "stale_epoch_refused"
        /// The database writer queue skipped the ticket of a dead, suspended or vanished writer.
        case deadTicketSkipped = "dead_ticket_skipped"
        /// Damage was found in a defaults suite (reported until acknowledged).
        case defaultsDamageFound = "defaults_damage_found"
        /// A defaults writer repaired a suite, keeping the dropped bytes in a quarantine file.
        case defaultsRepaired = "defaults_repaired"
        /// A shared database's checkpoint thread cannot open or use a connection of its own
        /// (an encrypted database, say): its checkpoints run in the writers' calls.
        case checkpointsInWriterCalls = "checkpoints_in_writer_calls"
    }

    /// How serious an event is (so that the engines need not import swift-log).
    package enum Severity: Sendable {
        /// A repair or decision that worked as designed (`Logger.Level.notice`).
        case notice
        /// Something was lost, refused or overridden (`Logger.Level.warning`).
        case warning

        var level: Logger.Level { self == .notice ? .notice : .warning }
    }

    let logger: Logger?
    let container: String

    /// Logs `event` (default severity `notice`: a repair that worked); the message is built
    /// only when the logger takes that level.
    package func report(_ event: Event, level severity: Severity = .notice, _ message: @autoclosure () -> String) {
        guard let logger, logger.logLevel <= severity.level else { return }
        logger.log(level: severity.level, "\(message())", metadata: ["baton.event": "\(event.rawValue)", "baton.container": "\(container)"])
    }
}
