#!/usr/bin/env bash
# Renders a `baton demo --timeline` page in headless Chromium and saves a screenshot to look at.
#
#   scripts/check-timeline.sh [OUTPUT.png] [extra `baton demo` arguments...]
#
# Needs Chromium (Debian: apt-get install -y chromium). Builds the package if needed. Fails when
# the demo breaks an invariant, the page lacks its parts, or Chromium renders nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
png="${1:-/tmp/baton-timeline.png}"
shift || true
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then
    echo "error: Chromium not found; install it (Debian: apt-get install -y chromium)" >&2
    exit 2
fi
swift build --product baton >/dev/null
work="$(mktemp -d /tmp/baton-timeline-XXXXXX)"
trap 'rm -rf "$work"' EXIT
html="$work/timeline.html"
.build/debug/baton demo --seconds 15 --messages 40 --chaos --seed 3 --json --timeline "$html" "$@" >"$work/report.json"
echo "report: $(cat "$work/report.json")"
for part in "<svg" "app#1" "server" "core role held" "connected to the server" "suspended" "<polyline"; do
    grep -q -- "$part" "$html" || { echo "error: the page lacks \"$part\"" >&2; exit 1; }
done
if grep -Eq '<script|src=|href=' "$html"; then
    echo "error: the page is not self-contained" >&2
    exit 1
fi
rm -f "$png"
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot="$png" --window-size=1400,900 "file://$html" >/dev/null 2>&1
size=$(stat -c %s "$png" 2>/dev/null || echo 0)
if (( size < 20000 )); then
    echo "error: the screenshot $png is missing or blank ($size bytes)" >&2
    exit 1
fi
echo "screenshot: $png ($size bytes); open it and look"
