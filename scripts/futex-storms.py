#!/usr/bin/env python3
"""Finds wake-up storms: threads that make futex wake calls one after another without waiting.

A thread that waits for another sleeps in the kernel (a futex wait); a thread that rings a word
others sleep on makes a wake call. A thread that makes many wake calls in a row, with no wait
between them, is going round a loop without sleeping. On one processor it holds that processor
from the thread it waits for until the scheduler's tick takes it away. This reads the futex
system calls of a run, with their call stacks, and reports every such run of wake calls (over
--min, default 50) per thread: how many, over how long, on which words, and the call stacks
that made most of them:

    swift build -c release --static-swift-stdlib -Xlinker -no-pie --product baton
    swift build -c release --static-swift-stdlib -Xlinker -no-pie --product baton-harness
    taskset -c 1 perf record -e syscalls:sys_enter_futex -g -o futex.data -- \\
        .build/release/baton bench channels --quick --conditions idle
    perf script -i futex.data -F pid,tid,time,event,trace,ip,sym > futex.txt
    python3 scripts/futex-storms.py futex.txt

(`taskset` puts every process of the run on one processor, where a storm lasts longest.) A run
of wake calls that alternates with another process's, a few tens of microseconds apart, is a
conversation that never had to sleep, not a storm: look at the duration per wake-up.
"""
import argparse
import collections
import re
import sys

HEADER = re.compile(r"\s*(\d+)/(\d+)\s+([\d.]+):\s+syscalls:sys_enter_futex:\s+uaddr: (0x[0-9a-f]+), op: (0x[0-9a-f]+)")
FUTEX_WAKE, FUTEX_WAKE_BITSET = 1, 10
COMMAND_MASK = 0x7F  # FUTEX_PRIVATE_FLAG (128) and FUTEX_CLOCK_REALTIME (256) off


def read_calls(path):
    """The futex calls of `perf script` output: (pid, tid, seconds, word, is_wake, stack)."""
    calls = []
    with open(path) as text:
        for record in text.read().split("\n\n"):
            lines = [line for line in record.split("\n") if line.strip()]
            if not lines:
                continue
            match = HEADER.match(lines[0])
            if not match:
                continue
            command = int(match.group(5), 16) & COMMAND_MASK
            stack = tuple(re.sub(r"^\s*[0-9a-f]+ ", "", line.strip()) for line in lines[1:])
            calls.append((int(match.group(1)), int(match.group(2)), float(match.group(3)), match.group(4),
                          command in (FUTEX_WAKE, FUTEX_WAKE_BITSET), stack))
    return calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("script", help="perf script output (see above)")
    parser.add_argument("--min", type=int, default=50, help="the shortest run of wake calls reported")
    parser.add_argument("--stacks", type=int, default=3, help="how many of the commonest call stacks to print")
    parser.add_argument("--depth", type=int, default=8, help="frames printed per call stack")
    arguments = parser.parse_args()
    calls = read_calls(arguments.script)
    if not calls:
        sys.exit(f"no futex calls in {arguments.script}: record syscalls:sys_enter_futex with -g, "
                 "and print them with perf script -F pid,tid,time,event,trace,ip,sym")
    by_thread = collections.defaultdict(list)
    for call in calls:
        by_thread[call[1]].append(call)
    stacks = collections.Counter()
    storms = []
    for thread, thread_calls in by_thread.items():
        start = 0
        while start < len(thread_calls):
            end = start
            while end < len(thread_calls) and thread_calls[end][4]:
                end += 1
            if end - start >= arguments.min:
                run = thread_calls[start:end]
                storms.append((run[0][0], thread, len(run), (run[-1][2] - run[0][2]) * 1e6,
                               collections.Counter(call[3] for call in run).most_common(3)))
                for call in run:
                    stacks[call[5][:arguments.depth]] += 1
            start = max(end, start + 1)
    print(f"{len(calls)} futex calls, {len(by_thread)} threads; {len(storms)} runs of {arguments.min} or more "
          "wake calls with no wait between them")
    for pid, thread, count, microseconds, words in sorted(storms, key=lambda storm: -storm[2]):
        per_wake = microseconds / max(count - 1, 1)
        words_text = ", ".join(f"{word} ×{times}" for word, times in words)
        print(f"  pid {pid} thread {thread}: {count} wake calls in {microseconds:,.0f} µs "
              f"({per_wake:.1f} µs apart) on {words_text}")
    for stack, count in stacks.most_common(arguments.stacks):
        print(f"{count} of those wake calls from:")
        for frame in stack:
            print(f"    {frame[:160]}")


if __name__ == "__main__":
    main()
