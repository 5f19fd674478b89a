#!/usr/bin/env python3
"""Processor time per wake-up of long-lived signal watchers, for A/B comparisons of builds.

Starts N watcher processes (the signals bench's `signal-fan` worker, or its raw `futex-fan`
floor), rings them P times from one long-lived poster, and reads each watcher's processor time
(the sum of its threads' `/proc/PID/task/TID/schedstat` run times) before and after. Linux only.

Give several builds of `baton-harness` with `--harness A,B,...`: the watchers alternate between
them in the same run, so every build sees the same posts on the same noisy machine, which
separate runs on a shared host do not.

    swift build -c release --static-swift-stdlib -Xlinker -no-pie --product baton-harness
    cp .build/release/baton-harness /tmp/harness-before   # ... change, build again ...
    scripts/signal-wake-cpu.py --harness /tmp/harness-before,.build/release/baton-harness

Prints, per build, each watcher's microseconds of processor time per wake-up, and per thread
of the first watcher its time and context switches per wake-up.

With `--callgrind PREFIX`, the first watcher of each build runs under `valgrind
--tool=callgrind` (a copy of the build stripped with `strip -g`: valgrind 3.19 cannot read the
DWARF 5 of a Swift 6.3 release build); its counts are zeroed after the warm-up and dumped after
the posts (`callgrind_control`), to PREFIX.<pid>.1, and the script prints its instructions per
wake-up, which the host's noise does not move. Read a dump with `callgrind_annotate`. Those
watchers' processor times are left out of the figures above, and slow the others down (a
watcher under callgrind takes about 180 µs of processor time per wake-up): measure time in a
run without it.
"""
import argparse, ctypes, mmap, os, shutil, struct, subprocess, sys, tempfile, time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--harness", default=".build/release/baton-harness", help="comma-separated baton-harness builds")
parser.add_argument("--mode", choices=["signal-fan", "futex-fan"], default="signal-fan")
parser.add_argument("--posts", type=int, default=2000)
parser.add_argument("--watchers", type=int, default=0, help="default: two per build")
parser.add_argument("--callgrind", metavar="PREFIX", help="run each build's first watcher under callgrind, dumping to PREFIX.<pid>.1")
args = parser.parse_args()

builds = [os.path.abspath(h) for h in args.harness.split(",")]
count = args.watchers or 2 * len(builds)
container = tempfile.mkdtemp(prefix="baton-wake-cpu-")
os.chmod(container, 0o700)
procs = []
profiled = set()  # the watchers under callgrind: watcher k < len(builds) runs build k
if args.callgrind:
    for tool in ("valgrind", "callgrind_control", "strip"):
        if shutil.which(tool) is None:
            sys.exit(f"--callgrind needs {tool}")
try:
    for index in range(count):
        command = [builds[index % len(builds)], "bench-worker", "--container", container, "signals", args.mode, str(index)]
        if args.callgrind and index < len(builds):
            stripped = os.path.join(container, f"stripped-{index}")
            shutil.copy(builds[index], stripped)
            subprocess.run(["strip", "-g", stripped], check=True)
            command = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={os.path.abspath(args.callgrind)}.%p",
                       stripped] + command[1:]
            profiled.add(index)
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if index in profiled else None))
    for proc in procs:
        if proc.stdout.readline().strip() != b"ready":
            sys.exit("a watcher did not start")
    poster = None
    if args.mode == "signal-fan":
        poster = subprocess.Popen([builds[0], "bench-worker", "--container", container, "signals", "signal-post-stdin"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        procs.append(poster)
        if poster.stdout.readline().strip() != b"ready":
            sys.exit("the poster did not start")
    # The bench's shared words: the futex floor's fan word at 64, the count of wake-ups at 128.
    fd = os.open(os.path.join(container, ".baton", "bench-signals.shm"), os.O_RDWR)
    shm = mmap.mmap(fd, 4096)
    address = ctypes.addressof(ctypes.c_char.from_buffer(shm))
    libc = ctypes.CDLL(None, use_errno=True)
    # futex(2)'s number: asm/unistd_64.h on x86-64, asm-generic/unistd.h on arm64.
    SYS_futex = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine)
    FUTEX_WAKE = 1
    if SYS_futex is None and args.mode == "futex-fan":
        sys.exit(f"futex-fan: no futex system call number known for {os.uname().machine}")

    def load(offset):
        return struct.unpack_from("<I", shm, offset)[0]

    def post():
        if poster:
            poster.stdin.write(b"x")
            poster.stdout.read(1)
        else:
            struct.pack_into("<I", shm, 64, (load(64) + 1) & 0xFFFFFFFF)
            libc.syscall(SYS_futex, ctypes.c_void_p(address + 64), FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def wait_for(done):
        limit = time.monotonic() + 10
        while load(128) < done:
            if time.monotonic() > limit:
                sys.exit("the watchers stopped answering")
            time.sleep(0.0002)

    def threads(pid):
        result = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            base = f"/proc/{pid}/task/{tid}"
            status = dict(line.split(":", 1) for line in open(f"{base}/status").read().splitlines() if ":" in line)
            result[tid] = (open(f"{base}/comm").read().strip(), int(open(f"{base}/schedstat").read().split()[0]),
                           int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))
        return result

    watchers = procs[:count]
    rounds = 0
    for _ in range(20):  # warm-up
        rounds += 1
        post()
        wait_for(count * rounds)
        time.sleep(0.002)
    before = [threads(p.pid) for p in watchers]
    for index in sorted(profiled):
        subprocess.run(["callgrind_control", "-z", str(procs[index].pid)], check=True, capture_output=True)
    for _ in range(args.posts):
        time.sleep(0.001)  # every watcher goes back to sleep
        rounds += 1
        post()
        wait_for(count * rounds)
    after = [threads(p.pid) for p in watchers]
    for index in sorted(profiled):
        pid = procs[index].pid
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
        dump = f"{os.path.abspath(args.callgrind)}.{pid}.1"
        total = None
        for _ in range(100):  # the dump is written by the watcher's next basic block
            if os.path.exists(dump):
                total = next((int(line.split()[1]) for line in open(dump) if line.startswith(("totals:", "summary:"))), None)
                if total is not None:
                    break
            time.sleep(0.1)
        if total is None:
            sys.exit(f"no callgrind dump at {dump}")
        print(f"{args.mode} {builds[index]}: {total / args.posts:,.0f} instructions per wake-up (callgrind, {dump})")

    per_wake = [sum(a[1] for a in after[i].values()) - sum(b[1] for b in before[i].values()) for i in range(count)]
    for k, build in enumerate(builds):
        mine = sorted(per_wake[i] / args.posts / 1000 for i in range(count) if i % len(builds) == k and i not in profiled)
        print(f"{args.mode} {build}: " + ", ".join(f"{x:.2f}" for x in mine) + " µs per wake-up")
    first = next((i for i in range(count) if i not in profiled), None)
    for tid, (name, ran, voluntary, involuntary) in (after[first].items() if first is not None else []):
        if tid in before[first] and ran != before[first][tid][1]:
            b = before[first][tid]
            print(f"  first watcher, thread {name}: {(ran - b[1]) / args.posts / 1000:.2f} µs, "
                  f"{(voluntary - b[2]) / args.posts:.2f} voluntary and {(involuntary - b[3]) / args.posts:.2f} "
                  f"involuntary switches per wake-up")
finally:
    for proc in procs:
        proc.kill()
        proc.wait()
    shutil.rmtree(container, ignore_errors=True)
