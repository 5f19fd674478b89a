#!/usr/bin/env python3
"""Lays the hand-over traces of `baton bench lifecycle` or `baton bench roles` on one time line.

Build with the trace points compiled in, run the bench with BATON_TRACE_DIR set, then read:

    swift build -c release -Xswiftc -DBATON_TRACE --product baton
    swift build -c release -Xswiftc -DBATON_TRACE --product baton-harness
    export BATON_TRACE_DIR=$(mktemp -d)
    .build/release/baton bench lifecycle --conditions idle
    python3 scripts/trace-handover.py "$BATON_TRACE_DIR"

Each process wrote trace.<pid> (records of 32 bytes: monotonic ns, thread, 16-byte tag; see
Sources/CBatonShims/trace.c). The bench process is the one that wrote `bench.start`; a hand-over
runs from its `bench.start` to its `bench.connected`, and holds the events of every process in
between. For each preempted worker (one per measurement: global executor, then signal thread),
this prints, over that worker's sampled hand-overs (the bench's warm-up rounds left out: each
kind's first block and the first rounds of every later block), the median time of each event
since `bench.start` (an event that happens several times in a hand-over is numbered), the step
from the event before, and the process: B the bench (the new holder), W the preempted worker.
The raw floor's hand-overs (`floor.start` to `floor.connected`) are summed up the same way.

Traces of `baton bench roles` (its process wrote `roles.start`) give its preemptions instead,
from `roles.start` (main calls acquire) to `roles.held`, for each preempted worker (signal
thread, then global executor), its first 40 rounds (the bench's warm-up) left out.

Both end with the watches of a held arbiter lock (RoleDirectory.withArbiterSoon), and with
`--slowest N` each summary also lays out its N slowest hand-overs event by event:

    python3 scripts/trace-handover.py --slowest 3 "$BATON_TRACE_DIR"

and with `--typical N`, the N hand-overs nearest the median the same way.
"""
import collections
import glob
import statistics
import struct
import sys


def load(directory):
    events, bench = [], None
    for path in glob.glob(directory + "/trace.*"):
        pid = int(path.rsplit(".", 1)[1])
        data = open(path, "rb").read()
        for offset in range(0, len(data), 32):
            ns, thread = struct.unpack_from("<QQ", data, offset)
            if ns == 0:
                break
            tag = data[offset + 16:offset + 32].split(b"\0")[0].decode()
            events.append((ns, pid, thread, tag))
            if tag in ("bench.start", "roles.start"):
                bench = pid
    events.sort()
    return events, bench


def spans(events, start, end, only=None):
    result, current = [], None
    for event in events:
        if only is not None and event[1] not in only:
            continue
        if event[3] == start:
            current = [event]
        elif current is not None:
            current.append(event)
            if event[3] == end:
                result.append(current)
                current = None
    return result


# The bench's unsampled rounds (LifecycleBench.measureHandOvers): every kind's first block is a
# warm-up, and every later block starts with this many.
BLOCK_WARM_UP = 3
# The roles bench's unsampled rounds (RolesBench.preemption: a tenth of 400).
ROLES_WARM_UP = 40


def sampled(kinds):
    """Keeps the hand-overs the bench samples: `kinds` maps a kind to its rounds; the kinds run in
    alternating blocks, so a round of another kind between two rounds of one ends a block."""
    ordered = sorted((r[0][0], kind, index) for kind, rounds in kinds.items() for index, r in enumerate(rounds))
    keep = {kind: [] for kind in kinds}
    blocks = collections.Counter()
    previous, position = None, 0
    for _, kind, index in ordered:
        if kind != previous:
            blocks[kind] += 1
            position = 0
        if blocks[kind] > 1 and position >= BLOCK_WARM_UP:
            keep[kind].append(kinds[kind][index])
        previous = kind
        position += 1
    return keep


def summarize(rounds, label):
    if not rounds:
        return
    total = statistics.median((r[-1][0] - r[0][0]) / 1000 for r in rounds)
    print(f"{label}: {len(rounds)} hand-overs, median {total:.1f} µs")
    times = collections.defaultdict(list)
    for r in rounds:
        seen = collections.Counter()
        for ns, pid, _, tag in r:
            key = (label_of[pid], tag, seen[(pid, tag)])
            seen[(pid, tag)] += 1
            times[key].append((ns - r[0][0]) / 1000)
    keys = [k for k in times if len(times[k]) >= len(rounds) / 2]
    keys.sort(key=lambda k: statistics.median(times[k]))
    previous = 0.0
    for who, tag, number in keys:
        median = statistics.median(times[(who, tag, number)])
        suffix = f" #{number + 1}" if number else ""
        print(f"  {median:7.1f}  +{median - previous:6.1f}  {who}  {tag}{suffix}")
        previous = median
    print()
    by_length = sorted(rounds, key=lambda r: r[-1][0] - r[0][0])
    middle = len(by_length) // 2
    shown = [("a typical one", r) for r in by_length[max(0, middle - TYPICAL // 2):middle - TYPICAL // 2 + TYPICAL]]
    shown += [("a slow one", r) for r in (by_length[-SLOWEST:] if SLOWEST else [])]
    for what, r in shown:
        print(f"  {what}: {(r[-1][0] - r[0][0]) / 1000:.1f} µs")
        previous = r[0][0]
        for ns, pid, thread, tag in r:
            print(f"    {(ns - r[0][0]) / 1000:9.1f}  +{(ns - previous) / 1000:8.1f}  {label_of[pid]}  {thread % 100000:5d}  {tag}")
            previous = ns
        print()


def arbiter_watches(events):
    """How long each watch of a held arbiter lock lasted (`arbiter.watch` to `arbiter.watched`,
    one thread), and each wait on a thread of its own that followed (to `arbiter.waited`)."""
    started, watched, watches, waits = {}, {}, [], []
    for ns, pid, thread, tag in events:
        if tag == "arbiter.watch":
            started[(pid, thread)] = ns
        elif tag == "arbiter.watched" and (pid, thread) in started:
            watches.append((ns - started.pop((pid, thread))) / 1000)
            watched[pid] = ns
        elif tag == "arbiter.waited" and pid in watched:
            waits.append((ns - watched.pop(pid)) / 1000)
    if watches:
        watches.sort()
        print(f"arbiter watches (every process, warm-up included): {len(watches)}, median {statistics.median(watches):.1f} µs, "
              f"longest {watches[-1]:.1f} µs, over 200 µs: {sum(1 for w in watches if w > 200)}")
    if waits:
        print(f"  then waits on a thread of its own: {len(waits)}, µs: {', '.join(f'{w:.1f}' for w in sorted(waits))}")


# With --slowest N: each summary also lays out its N slowest hand-overs, event by event (the
# thread column: the recording thread's id, last five digits); with --typical N, the N nearest
# its median.
SLOWEST = 0
TYPICAL = 0

if __name__ == "__main__":
    while len(sys.argv) >= 4 and sys.argv[1] in ("--slowest", "--typical"):
        if sys.argv[1] == "--slowest":
            SLOWEST = int(sys.argv[2])
        else:
            TYPICAL = int(sys.argv[2])
        del sys.argv[1:3]
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    events, bench = load(sys.argv[1])
    if bench is None:
        sys.exit("no bench.start or roles.start in the traces: was the bench built with -Xswiftc -DBATON_TRACE and run with BATON_TRACE_DIR?")
    label_of = collections.defaultdict(lambda: "W")
    label_of[bench] = "B"

    def workers(marks):
        """The processes other than the bench that wrote an event `marks` accepts, in the order
        of their first such event (their measurements ran in that order)."""
        found = []
        for _, pid, _, tag in events:
            if pid != bench and marks(tag) and pid not in found:
                found.append(pid)
        return found

    def name(names, index, worker):
        return names[index] if index < len(names) else f"worker {worker}"

    if any(e[3] == "roles.start" for e in events):
        # The roles bench: its preempted worker is the process that saw the stop request.
        all_rounds = spans(events, "roles.start", "roles.held")
        names = ["preemption to the grant (signal thread)", "preemption to the grant (global executor)"]
        for index, worker in enumerate(workers(lambda tag: tag == "roles.seen")):
            rounds = [r for r in all_rounds if any(e[1] == worker and e[3] == "roles.seen" for e in r)]
            summarize(rounds[ROLES_WARM_UP:], name(names, index, worker))
        arbiter_watches(events)
        sys.exit(0)
    all_rounds = spans(events, "bench.start", "bench.connected")
    # The preempted workers: the processes that ran a supervisor.
    names = ["preemption to connected (global executor)", "preemption to connected (signal thread)"]
    kinds = {"raw floor": spans(events, "floor.start", "floor.connected")}
    for index, worker in enumerate(workers(lambda tag: tag.startswith("sup."))):
        kinds[name(names, index, worker)] = [r for r in all_rounds if any(e[1] == worker for e in r)]
    for kind, rounds in sampled(kinds).items():
        summarize(rounds, kind)
    arbiter_watches(events)
