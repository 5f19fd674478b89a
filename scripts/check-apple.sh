#!/usr/bin/env bash
# Type-checks, on Linux, Baton's code as an Apple platform compiles it, against stub modules
# transcribed from Apple's headers (scripts/apple-stubs; each declaration names its source).
#
#   scripts/check-apple.sh              run the check (exit 1 on any error)
#   scripts/check-apple.sh --self-test  plant each error class in a copy of the tree and
#                                       assert that the check fails on every one
#
# What it compiles, with `swiftc -emit-module` (whole module, bodies type-checked):
#   Baton          every .swift under Sources/Baton except *+Linux.swift
#   BatonSpawn     every .swift under Sources/BatonSpawn except *+Linux.swift
#   BatonDatabase  every .swift under Sources/BatonDatabase except *+Linux.swift, against the
#                  Apple-flavoured Baton above and GRDB built on Linux
#   Examples/*     each folder as its own module, against both
# and `clang -fsyntax-only -DBATON_APPLE_TYPECHECK` on every .c and .h of Sources/CBatonShims.
#
# How it makes Linux look like Apple:
#   - stub modules Darwin, UIKit, Network, SwiftUI, UserNotifications on -I, so
#     canImport(Darwin), canImport(UIKit)... are true; FoundationApple (Apple-only Foundation
#     API such as NSFileCoordinator) is imported implicitly into every file;
#   - in a temporary copy of the sources, compile conditions are rewritten on `#if`/`#elseif`
#     lines only (line numbers unchanged): os(Linux), canImport(Glibc), canImport(Musl) and
#     canImport(FoundationEssentials) become `false`, as on Apple SDKs;
#   - -DBATON_APPLE_TYPECHECK selects the C shim's Darwin half, and __linux__ is undefined
#     while the shim's own text is read (glibc's headers do not test it); the stub include directory comes
#     first on the include path, so Apple's headers resolve to the transcriptions and Linux-only
#     glibc functions are redeclared unavailable (a call fails in C and in Swift).
# What it cannot see is listed in README "Platforms".
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STUBS="$ROOT/scripts/apple-stubs"
SWIFT_FLAGS=(-swift-version 6 -enable-upcoming-feature ExistentialAny
  -enable-upcoming-feature MemberImportVisibility -package-name baton)

if [[ "${1:-}" == "--self-test" ]]; then
  exec "$ROOT/scripts/check-apple-self-test.sh"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/baton-apple-check.XXXXXX")"
[[ -n "${BATON_APPLE_KEEP:-}" ]] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/stubs" "$WORK/modules" "$WORK/src" "$WORK/maps/CBatonShims"

status=0
log() { printf '%s\n' "$*"; }

# Diagnostics name the temporary copy; print them with the repository's paths.
report() { sed -e "s#$WORK/src/#$ROOT/#g" "$1"; }

# The C shim as a clang module, the way SwiftPM presents it, read with __linux__ undefined (as
# on Apple) for the shim's own text only: Swift's Synchronization module needs __linux__ in its
# own C shims, so it cannot be undefined on the command line.
cat > "$WORK/maps/CBatonShims/CBatonShims-apple.h" <<EOF
#pragma push_macro("__linux__")
#undef __linux__
#define BATON_APPLE_CHECK_SHIM 1
#include "$ROOT/Sources/CBatonShims/include/CBatonShims.h"
#undef BATON_APPLE_CHECK_SHIM
#pragma pop_macro("__linux__")
EOF
cat > "$WORK/maps/CBatonShims/module.modulemap" <<EOF
module CBatonShims {
    header "CBatonShims-apple.h"
    export *
}
EOF
# A fresh clang module cache: a cached Glibc module built without the stub headers (or with an
# older version of them) would silently hide their `unavailable` declarations.
CLANG_FLAGS=(-module-cache-path "$WORK/module-cache" -Xcc -DBATON_APPLE_TYPECHECK -Xcc -Wno-builtin-macro-redefined -Xcc "-I$STUBS/include" -I "$STUBS/include"
  -Xcc "-fmodule-map-file=$WORK/maps/CBatonShims/module.modulemap")

# Copies Swift files, rewriting compile conditions so that they read as on an Apple SDK.
# Usage: stage <dest-subdir> <file>...
stage() {
  local dest="$1"; shift
  local file rel
  for file in "$@"; do
    rel="${file#"$ROOT"/}"
    mkdir -p "$WORK/src/$(dirname "$rel")"
    sed -E '/^[[:space:]]*#(if|elseif)[[:space:]]/{
      s/os\(Linux\)/false/g
      s/canImport\((Glibc|Musl|FoundationEssentials)\)/false/g
    }' "$file" > "$WORK/src/$rel"
    printf '%s\n' "$WORK/src/$rel" >> "$WORK/$dest.files"
  done
}

# Swift files of a directory, minus Linux-only files.
swift_files() {
  find "$1" -name '*.swift' ! -name '*+Linux.swift' | LC_ALL=C sort
}

# Errors the check knows about, in files being rewritten elsewhere (see the file's header).
KNOWN="$STUBS/known-errors.txt"
known_count=0

# Usage: emit <module> <files list name> <extra flags...>
# The module is emitted even when it has errors (so dependents are still checked against it);
# the errors are read from the output: any error not listed in known-errors.txt fails the check.
emit() {
  local module="$1"; shift
  local list="$1"; shift
  local out="$WORK/$module.log"
  local count
  count=$(wc -l < "$WORK/$list.files")
  swiftc -emit-module -wmo -Xfrontend -experimental-allow-module-with-compiler-errors \
      -parse-as-library -module-name "$module" "${SWIFT_FLAGS[@]}" "${CLANG_FLAGS[@]}" \
      -I "$WORK/modules" -I "$WORK/stubs" -Xfrontend -import-module -Xfrontend FoundationApple "$@" \
      -emit-module-path "$WORK/modules/$module.swiftmodule" \
      $(cat "$WORK/$list.files") > "$out" 2>&1 || true
  # "path:line:col: error: message" -> "relative/path: error: message"
  report "$out" | grep -E '^/[^ ]*:[0-9]+:[0-9]+: error: ' | sed -E "s#^$ROOT/##; s#^([^:]*):[0-9]+:[0-9]+: #\\1: #" \
    | sort -u > "$WORK/$module.errors" || true
  if [[ ! -s "$WORK/$module.errors" ]] && ! grep -q 'error:' "$out"; then
    log "ok      $module: $count Swift files type-checked as an Apple platform"
    return
  fi
  local new known
  new=$(grep -vxF -f <(grep -v '^#' "$KNOWN" | grep -v '^$') "$WORK/$module.errors" || true)
  known=$(grep -xF -f <(grep -v '^#' "$KNOWN" | grep -v '^$') "$WORK/$module.errors" | wc -l || true)
  known_count=$((known_count + known))
  if [[ -z "$new" ]] && [[ -s "$WORK/$module.errors" ]]; then
    log "ok      $module: $count Swift files type-checked; $known known error(s) in files being rewritten (known-errors.txt):"
    sed 's/^/    known: /' "$WORK/$module.errors"
  else
    log "FAILED  $module ($count Swift files):"
    if [[ -n "$new" ]]; then
      printf '%s\n' "$new" | sed 's/^/    /'
    else
      report "$out" | grep -E 'error' | sed 's/^/    /'
    fi
    log "    (full diagnostics, with line numbers:)"
    report "$out" | grep -E '^/.*: error: ' | sed 's/^/      /'
    status=1
  fi
}

log "== Apple type-check (stubs: ${STUBS#"$ROOT"/})"

# 1. Stub modules.
stub() {
  local module="$1"; shift
  swiftc -emit-module -parse-as-library -module-name "$module" -swift-version 6 \
    -module-cache-path "$WORK/module-cache" \
    -Xcc "-I$STUBS/include" -I "$STUBS/include" -I "$WORK/stubs" "$@" \
    -emit-module-path "$WORK/stubs/$module.swiftmodule" "$STUBS/swift/$module.swift"
}
stub Darwin
stub FoundationApple
stub UserNotifications
stub UIKit
stub Network
stub SwiftUI
log "ok      stub modules: Darwin, FoundationApple, UIKit, Network, SwiftUI, UserNotifications"

# 2. The C shim's Darwin half.
c_count=0
while IFS= read -r file; do
  c_count=$((c_count + 1))
  lang=c; [[ "$file" == *.h ]] && lang=c-header
  if ! clang -fsyntax-only -fblocks -x "$lang" -DBATON_APPLE_TYPECHECK -DBATON_APPLE_CHECK_SHIM -U__linux__ -I "$STUBS/include" \
      -I "$ROOT/Sources/CBatonShims/include" -I /opt/swift/usr/lib/swift "$file" > "$WORK/c.log" 2>&1; then
    log "FAILED  C shim: $file"
    sed 's/^/    /' "$WORK/c.log"
    status=1
  fi
done < <(find "$ROOT/Sources/CBatonShims" \( -name '*.c' -o -name '*.h' \) ! -name '*+Linux.h' | LC_ALL=C sort)
((status)) || log "ok      C shim: $c_count files syntax-checked with -DBATON_APPLE_TYPECHECK"

# 3. The dependencies, built on Linux: GRDB (platform-neutral Swift over SQLite) and swift-log's
#    Logging (platform-neutral API; its Linux build imports Glibc, which the toolchain has).
GRDB_MODULES="$ROOT/.build/debug/Modules"
for target in GRDB Logging; do
  if [[ ! -f "$GRDB_MODULES/$target.swiftmodule" ]]; then
    log "building $target for Linux (swift build --target $target)"
    (cd "$ROOT" && swift build --target "$target" > "$WORK/$target.log" 2>&1) || { cat "$WORK/$target.log"; exit 1; }
  fi
done
GRDB_MAP="$(find -L "$ROOT/.build/checkouts" -path '*GRDB.swift/Sources/GRDBSQLite/module.modulemap' | head -1)"
# Only GRDB's modules: .build/debug/Modules also holds the Linux-built Baton, which must not be
# found in place of the Apple-flavoured one.
mkdir -p "$WORK/grdb"
for module in "$GRDB_MODULES"/GRDB*.swiftmodule "$GRDB_MODULES"/Logging.swiftmodule; do ln -s "$module" "$WORK/grdb/"; done

# 4. Swift modules.
: > "$WORK/baton.files"
stage baton $(swift_files "$ROOT/Sources/Baton")
emit Baton baton -I "$WORK/grdb"

# BatonSpawn (the process spawner of the simulator and the harness, which run on macOS too),
# with its C helpers' header as a clang module.
mkdir -p "$WORK/maps/CBatonHarness"
cat > "$WORK/maps/CBatonHarness/module.modulemap" <<EOF
module CBatonHarness {
    header "$ROOT/Sources/CBatonHarness/include/CBatonHarness.h"
    export *
}
EOF
: > "$WORK/spawn.files"
stage spawn $(swift_files "$ROOT/Sources/BatonSpawn")
emit BatonSpawn spawn -I "$WORK/grdb" -Xcc "-fmodule-map-file=$WORK/maps/CBatonHarness/module.modulemap"

: > "$WORK/database.files"
stage database $(swift_files "$ROOT/Sources/BatonDatabase")
emit BatonDatabase database -I "$WORK/grdb" -Xcc "-fmodule-map-file=$GRDB_MAP"

if [[ -d "$ROOT/Examples" ]]; then
  for example in "$ROOT"/Examples/*/; do
    name="$(basename "$example")"
    : > "$WORK/example-$name.files"
    stage "example-$name" $(swift_files "$example")
    [[ -s "$WORK/example-$name.files" ]] || continue
    emit "Example$name" "example-$name" -I "$WORK/grdb" -Xcc "-fmodule-map-file=$GRDB_MAP"
  done
fi

if ((status)); then
  log "== Apple type-check FAILED"
elif ((known_count)); then
  log "== Apple type-check passed, with $known_count known error(s) listed in ${KNOWN#"$ROOT"/}"
  log "   (ownership diagnostics, such as a Mutex captured by a closure, run only once a module has no errors)"
else
  log "== Apple type-check passed"
fi
exit $status
