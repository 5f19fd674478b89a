import CBatonShims

/// Marks a step of a role hand-over (or another chain of wake-ups) in a trace, in builds made
/// with `-Xswiftc -DBATON_TRACE` only; in every other build the call is empty and inlined away.
///
/// Each process writes its events to `$BATON_TRACE_DIR/trace.<pid>` (see
/// `baton_trace_event` in CBatonShims.h), so a run of several processes can be laid on one time
/// line; `scripts/trace-handover.py` does that for `baton bench lifecycle`:
///
/// ```sh
/// swift build -c release -Xswiftc -DBATON_TRACE --product baton   # and baton-harness
/// BATON_TRACE_DIR=$(mktemp -d) .build/release/baton bench lifecycle --conditions idle
/// python3 scripts/trace-handover.py "$BATON_TRACE_DIR"
/// ```
/// - Parameter tag: What happened, at most 15 bytes.
@inline(__always)
package func handOverTrace(_ tag: StaticString) {
    #if BATON_TRACE
    // A string literal's storage ends with a NUL.
    baton_trace_event(UnsafeRawPointer(tag.utf8Start).assumingMemoryBound(to: CChar.self))
    #endif
}
