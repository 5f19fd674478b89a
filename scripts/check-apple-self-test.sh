#!/usr/bin/env bash
# Proves that scripts/check-apple.sh can fail: copies the tree to a temporary directory, plants
# one error at a time, and asserts the check fails on each. Prints one line per planted error.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
COPY="$(mktemp -d "${TMPDIR:-/tmp}/baton-apple-selftest.XXXXXX")"
trap 'rm -rf "$COPY"' EXIT
mkdir -p "$COPY/.build/debug"
(cd "$ROOT" && tar cf - Sources Examples scripts Package.swift) | (cd "$COPY" && tar xf -)
ln -s "$ROOT/.build/debug/Modules" "$COPY/.build/debug/Modules"
ln -s "$ROOT/.build/checkouts" "$COPY/.build/checkouts"

passed=0
failed=0
# Usage: plant <label> <file> <python expression transforming text `s`>
plant() {
  local label="$1" file="$2" edit="$3"
  cp "$COPY/$file" "$COPY/$file.orig"
  python3 - "$COPY/$file" "$edit" <<'PY'
import sys
path, edit = sys.argv[1], sys.argv[2]
s = open(path).read()
t = eval(edit)
assert t != s, "the plant did not change " + path
open(path, "w").write(t)
PY
  if "$COPY/scripts/check-apple.sh" > "$COPY/out.log" 2>&1; then
    echo "NOT CAUGHT  $label ($file)"
    failed=$((failed + 1))
  else
    echo "caught      $label ($file): $(grep -v 'known:' "$COPY/out.log" | grep -m1 -E '^    [^ (]' | sed 's/^ *//' | cut -c1-150)"
    passed=$((passed + 1))
  fi
  mv "$COPY/$file.orig" "$COPY/$file"
}

before_end() { # insert text before the last "#endif" (or at the end)
  printf '(s[:s.rindex("#endif")] + %s + s[s.rindex("#endif"):]) if "#endif" in s else s + %s' "$1" "$1"
}

echo "== error classes of issue 15"
plant "CBatonShims imported only inside #if canImport(FoundationEssentials)" Sources/Baton/Roles/RoleCore.swift \
  's.replace("import CBatonShims\n#if canImport(FoundationEssentials)\n", "#if canImport(FoundationEssentials)\nimport CBatonShims\n", 1)'
plant "fdatasync, which Apple's SDKs do not declare" Sources/Baton/Kernel/DurableSync+Darwin.swift \
  's.replace("Sys.retrying(\"fcntl(F_FULLFSYNC)\") { baton_darwin_full_fsync(fd) }", "Sys.retrying(\"fdatasync\") { fdatasync(fd) }")'
plant "posix_fallocate (Linux-only)" Sources/Baton/Kernel/FileSpace+Darwin.swift \
  's.replace("baton_darwin_preallocate(fd, Int64(current), Int64(size))", "posix_fallocate(fd, 0, off_t(size))")'
plant "inotify (Linux-only)" Sources/Baton/Kernel/FileProtection+Darwin.swift \
  's.replace("var protectionClass: Int32 {", "var probe: Int32 { inotify_init1(0) }\n    var protectionClass: Int32 {")'
plant "robust mutex (Linux-only)" Sources/Baton/Kernel/FileProtection+Darwin.swift \
  's.replace("var protectionClass: Int32 {", "func probe(_ a: UnsafeMutablePointer<pthread_mutexattr_t>) -> Int32 { pthread_mutexattr_setrobust(a, 1) }\n    var protectionClass: Int32 {")'
plant "a futex call from the shim's Linux half" Sources/Baton/Kernel/FileProtection+Darwin.swift \
  's.replace("var protectionClass: Int32 {", "func probe(_ p: UnsafeMutablePointer<UInt32>) -> Int32 { baton_linux_futex_wake(p, 1) }\n    var protectionClass: Int32 {")'
plant "a Linux-only header in the shim's Apple half" Sources/CBatonShims/platform/CBatonShims+Darwin.h \
  's.replace("#include <stdint.h>\n", "#include <stdint.h>\n#include <sys/epoll.h>\n", 1)'
plant "syscall(2) in the shim's Apple half" Sources/CBatonShims/platform/CBatonShims+Darwin.h \
  's.replace("{ (void)pthread_setname_np(name); }", "{ (void)syscall(0); (void)pthread_setname_np(name); }", 1)'
plant "a Sendable class storing a DispatchSourceTimer" Sources/Baton/Kernel/FileProtection+Darwin.swift \
  's.replace("extension FileProtection {", "import Dispatch\nfinal class PlantedTimer: Sendable { let timer: any DispatchSourceTimer = DispatchSource.makeTimerSource() }\nextension FileProtection {", 1)'
plant "UIApplication.shared where an extension cannot use it (outside the main actor)" Sources/Baton/Lifecycle/BackgroundTime/BackgroundTaskProvider+UIKit.swift \
  's.replace("let application = self.application\n", "let application = UIApplication.shared\n", 1)'
plant "a futex wait from the Apple kernel layer" Sources/Baton/Kernel/AddressWait+Darwin.swift \
  's.replace("baton_darwin_wait_on_address(word, expected, timeoutNanoseconds)", "baton_linux_futex_wait(word, expected, timeoutNanoseconds)", 1)'
plant "Glibc imported by Apple-compiled code" Sources/Baton/Kernel/Platform.swift \
  's.replace("#if canImport(Darwin)\n@_exported import Darwin\n#elseif canImport(Glibc)", "#if canImport(Glibc)\n@_exported import Glibc\n#elseif canImport(Darwin)", 1) + "\nlet plantedLinuxOnly = Glibc.fdatasync\n"'

echo "== a type error in every Apple-only file"
while IFS= read -r file; do
  rel="${file#"$COPY"/}"
  plant "type error" "$rel" "$(before_end '"\nlet plantedTypeError: Int = \"not an Int\"\n"')"
done < <(find "$COPY/Sources" "$COPY/Examples" -name '*.swift' \( -name '*+Darwin.swift' -o -name '*+UIKit.swift' -o -name '*+Network.swift' -o -name '*+SwiftUI.swift' -o -path '*/Examples/*' \) | LC_ALL=C sort)

echo "== $passed caught, $failed not caught"
((failed == 0))
