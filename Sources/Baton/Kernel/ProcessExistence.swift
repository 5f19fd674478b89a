/// Whether a process id still names a process: used only to clean up files named after a
/// process (a role's `holder-<pid>-…` and `waiter-<pid>-…` lock files) once it is gone. Liveness
/// and ownership are never decided by a pid (see ``OwnerTokens``): a reused pid, or a sandbox
/// that will not say, only leaves a small file behind longer.
///
/// `kill(pid, 0)` on both kernels (`ProcessExistence+Linux.swift`,
/// `ProcessExistence+Darwin.swift`): gone only on `ESRCH`. On Apple platforms a sandboxed app
/// may get `EPERM` for another app's or extension's process; that answer counts as "exists", so
/// the file stays (a leak of one small file per crashed process, never a wrong removal).
package enum ProcessExistence {}
