#!/usr/bin/env python3
"""Names the threads that waited for a processor in the slow hand-overs of `baton bench lifecycle`.

A hand-over that takes milliseconds on a loaded machine has, somewhere in its chain, a runnable
thread that waited behind a CPU-bound process. This joins the bench's hand-over traces (see
scripts/trace-handover.py) with the scheduler's own events and says, for each kind of hand-over,
how many sampled rounds took over --slow µs (default 1000) and which threads, in which
process, waited over --wait µs (default 1000) for a processor during them:

    swift build -c release -Xswiftc -DBATON_TRACE --scratch-path .build-trace --product baton
    swift build -c release -Xswiftc -DBATON_TRACE --scratch-path .build-trace --product baton-harness
    export BATON_TRACE_DIR=$(mktemp -d)
    perf record -k CLOCK_MONOTONIC -e sched:sched_switch -e sched:sched_waking -a -o sched.data -- \\
        .build-trace/release/baton bench lifecycle --conditions loaded
    perf script -i sched.data -F pid,tid,time,cpu,event,trace > sched.txt
    python3 scripts/slow-handovers.py "$BATON_TRACE_DIR" sched.txt

A wait is either `woken` (from the thread's wake-up to its next run) or `preempted` (from
losing the processor while runnable to its next run); `--preemptors` also says, for the
preempted waits, which thread took the processor and which process had woken that one. The
processes are named by their part: `bench` (the new holder and the server), `worker N` (the
preempted holder of the Nth kind, in the order trace-handover.py prints them: the global
executor, the signal thread, then the same two on one processor), `floor's holder` (the raw
floor's holder; one per measurement), or their pid
(with --all: the waits of every other process too, the loaded condition's CPU-bound ones among
them; without it, only the bench's and the workers' threads are named).
"""
import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
trace = __import__("trace-handover")

SWITCH = re.compile(r"prev_comm=(.*) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*) next_pid=(\d+)")
WAKING = re.compile(r"comm=(.*) pid=(\d+) prio")
LINE = re.compile(r"\s*(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+): sched:(\w+): (.*)")


def scheduler_waits(path, longer_than):
    """The waits for a processor longer than `longer_than` seconds: (start, end, tid, cause,
    the thread that ran instead, the pid that woke that one); and each tid's pid and name."""
    pid_of, name_of, runnable, waker_of, waits = {}, {}, {}, {}, []
    for line in open(path):
        match = LINE.match(line)
        if not match:
            continue
        pid, tid, _, time, event, rest = match.groups()
        time = float(time)
        pid_of[int(tid)] = int(pid)
        if event == "sched_waking":
            comm, woken = WAKING.search(rest).groups()
            woken = int(woken)
            name_of[woken] = comm
            waker_of[woken] = int(pid)
            runnable.setdefault(woken, (time, "woken", None, None))
        elif event == "sched_switch":
            prev_comm, prev, state, next_comm, following = SWITCH.search(rest).groups()
            prev, following = int(prev), int(following)
            name_of[prev], name_of[following] = prev_comm, next_comm
            if state.startswith("R"):
                runnable[prev] = (time, "preempted", following, waker_of.get(following))
            else:
                runnable.pop(prev, None)
            if following in runnable:
                start, cause, instead, waker = runnable.pop(following)
                if time - start > longer_than:
                    waits.append((start, time, following, cause, instead, waker))
    return waits, pid_of, name_of


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", help="the BATON_TRACE_DIR of the run")
    parser.add_argument("sched", help="`perf script -F pid,tid,time,cpu,event,trace` of the same run")
    parser.add_argument("--slow", type=float, default=1000, help="a slow hand-over takes longer than this (µs)")
    parser.add_argument("--wait", type=float, default=1000, help="waits longer than this are named (µs)")
    parser.add_argument("--preemptors", action="store_true", help="also name who took the processor from a preempted thread")
    parser.add_argument("--all", action="store_true", help="also the waits of other processes (the CPU-bound ones among them)")
    arguments = parser.parse_args()

    events, bench = trace.load(arguments.traces)
    if bench is None:
        sys.exit("no bench.start in the traces: was the bench built with -DBATON_TRACE and run with BATON_TRACE_DIR?")
    all_rounds = trace.spans(events, "bench.start", "bench.connected")
    workers = []
    for _, pid, _, tag in events:
        if pid != bench and tag.startswith("sup.") and pid not in workers:
            workers.append(pid)
    kinds = {"raw floor": trace.spans(events, "floor.start", "floor.connected")}
    for index, worker in enumerate(workers):
        kinds[f"worker {index}"] = [r for r in all_rounds if any(e[1] == worker for e in r)]
    kinds = trace.sampled(kinds)

    waits, pid_of, name_of = scheduler_waits(arguments.sched, arguments.wait / 1e6)
    part = {bench: "bench"}
    for index, worker in enumerate(workers):
        part[worker] = f"worker {index}"
    for _, pid, _, tag in events:
        if tag.startswith("holder.") and pid not in part:
            part[pid] = "floor's holder"

    def who(tid):
        pid = pid_of.get(tid)
        return f"{part.get(pid, pid)}: {name_of.get(tid, '?')}"

    for kind, rounds in kinds.items():
        lengths = sorted((r[-1][0] - r[0][0]) / 1000 for r in rounds)
        if not lengths:
            continue
        slow = [r for r in rounds if (r[-1][0] - r[0][0]) / 1000 > arguments.slow]
        print(f"{kind}: {len(rounds)} sampled hand-overs, median {lengths[len(lengths) // 2]:.0f} µs, "
              f"{len(slow)} over {arguments.slow:.0f} µs")
        named = collections.Counter()
        for r in slow:
            start, end = r[0][0] / 1e9, r[-1][0] / 1e9
            seen = set()
            for begin, finish, tid, cause, instead, waker in waits:
                if begin < end and finish > start and (arguments.all or pid_of.get(tid) in part):
                    key = f"{who(tid)} {cause}"
                    if arguments.preemptors and cause == "preempted":
                        key += f" (ran instead: {who(instead)}, woken by {part.get(waker, waker)})"
                    seen.add(key)
            for key in seen or {"no wait that long"}:
                named[key] += 1
        for key, count in named.most_common():
            print(f"  {count:4d}  {key}")
        print()


if __name__ == "__main__":
    main()
