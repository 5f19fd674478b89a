#!/usr/bin/env bash
# Checks Baton's CRC-32C (Sources/CBatonShims/crc32c.c) on every path it has, with
# scripts/crc32c/crc32c-test.c (known values; the instructions against the table on every length
# up to 600 at every alignment; continuation; the path chosen):
#   1. natively (x86-64: SSE4.2's CRC32 when the processor has it, as it has here);
#   2. for aarch64 Linux, run under qemu-aarch64 on its `max` and `cortex-a53` processors (both
#      have FEAT_CRC32, so the test requires the instructions' path);
#   3. the Apple arm64 half (baton_cpu_has_crc32 through sysctlbyname, from the Darwin platform
#      header) syntax-checked for aarch64 against scripts/apple-stubs, as scripts/check-apple.sh
#      checks the rest of the shim for x86-64. Not run: no Apple hardware here.
# Needs clang (the Swift toolchain's), qemu-user, gcc-aarch64-linux-gnu and libc6-dev-arm64-cross
# (Debian packages; .ci/run installs them). Exits 1 on any failure, 2 when a tool is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/baton-crc32c.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
SYSROOT=/usr/aarch64-linux-gnu

for tool in clang qemu-aarch64 aarch64-linux-gnu-ld; do
  command -v "$tool" >/dev/null || { echo "check-crc32c: $tool is missing (apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)"; exit 2; }
done
[[ -f "$SYSROOT/include/sys/auxv.h" ]] || { echo "check-crc32c: $SYSROOT/include is missing (apt-get install libc6-dev-arm64-cross)"; exit 2; }

status=0
run() {
  local label="$1"; shift
  if "$@" > "$WORK/out" 2>&1; then
    echo "ok      $label: $(head -1 "$WORK/out" | sed 's/^path: //') path"
  else
    echo "FAILED  $label"
    sed 's/^/    /' "$WORK/out" | tail -20
    status=1
  fi
}

TEST="$ROOT/scripts/crc32c/crc32c-test.c"
INCLUDE=(-I "$ROOT/Sources/CBatonShims/include")

clang -O2 -Wall -Werror -pthread "${INCLUDE[@]}" "$TEST" -o "$WORK/native"
expect=--expect-sw
grep -qw sse4_2 /proc/cpuinfo && expect=--expect-hw
run "native ($(uname -m))" "$WORK/native" "$expect"

clang --target=aarch64-linux-gnu -O2 -Wall -Werror -pthread "${INCLUDE[@]}" "$TEST" -o "$WORK/arm64"
for cpu in max cortex-a53; do
  run "aarch64 Linux under qemu-aarch64 -cpu $cpu" qemu-aarch64 -cpu "$cpu" -L "$SYSROOT" "$WORK/arm64" --expect-hw
done

if clang -fsyntax-only -fblocks --target=aarch64-linux-gnu -x c -DBATON_APPLE_TYPECHECK -DBATON_APPLE_CHECK_SHIM -U__linux__ \
    -I "$ROOT/scripts/apple-stubs/include" "${INCLUDE[@]}" -I /opt/swift/usr/lib/swift \
    "$ROOT/Sources/CBatonShims/crc32c.c" > "$WORK/apple.log" 2>&1; then
  echo "ok      Apple arm64 half: syntax-checked against scripts/apple-stubs (not run)"
else
  echo "FAILED  Apple arm64 half"
  sed 's/^/    /' "$WORK/apple.log"
  status=1
fi
exit $status
