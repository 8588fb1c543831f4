#!/usr/bin/env bash
# testtimes.sh [-n N] FILE.json...: where a test run's time goes, from the
# output of `go test -json`, one file per pass (make test TESTJSON=DIR
# writes DIR/race.json, DIR/norace.json, ...; scripts/flake.sh keeps them
# for failed runs). Prints each pass's wall and CPU seconds (from
# PASS.time beside PASS.json, when make wrote one), each package's time in
# each pass, then the N slowest top-level tests (default 20) of all the
# files. A test's time is
# its own: a t.Parallel test's wait for its turn is not counted, so a
# package's tests can add up to more than the package.
set -euo pipefail
n=20
if [ "${1:-}" = "-n" ]; then n=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: scripts/testtimes.sh [-n N] FILE.json..." >&2; exit 2; }
command -v jq >/dev/null || { echo "testtimes.sh needs jq" >&2; exit 1; }
# rows FILE: "elapsed <tab> pass <tab> package <tab> test <tab> action" for
# the package (test "") and each top-level test; lines that are not JSON
# (build output) are skipped.
rows() {
  jq -R -r --arg pass "$(basename "$1" .json)" 'fromjson?
    | select((.Action == "pass" or .Action == "fail") and .Elapsed != null and ((.Test // "") | contains("/") | not))
    | "\(.Elapsed)\t\($pass)\t\((.Package // "-") | sub("^github.com/kvthrottle/kvthrottle/"; ""))\t\(.Test // "")\t\(.Action)"' "$1"
}
all=$(for f in "$@"; do rows "$f"; done)
times=$(for f in "$@"; do
  t="${f%.json}.time"
  if [ -s "$t" ]; then echo "$(basename "$f" .json) $(tail -n 1 "$t")"; fi
done)
if [ -n "$times" ]; then
  echo "== passes (s): wall, user, system, CPU (user + system)"
  awk '{printf "%8.1f %8.1f %8.1f %8.1f  %s\n", $2, $3, $4, $3 + $4, $1}' <<<"$times" | sort -rn
  awk '{u += $3; s += $4} END {printf "%8s %8.1f %8.1f %8.1f  all passes\n", "", u, s, u + s}' <<<"$times"
fi
echo "== packages (s)"
awk -F'\t' '$4 == "" {printf "%8.1f  %-20s  %-22s %s\n", $1, $2, $3, ($5 == "fail" ? "FAIL" : "")}' <<<"$all" | sort -rn
echo "== the $n slowest tests (s)"
awk -F'\t' '$4 != "" {printf "%8.1f  %-20s  %-22s %s%s\n", $1, $2, $3, $4, ($5 == "fail" ? "  FAIL" : "")}' <<<"$all" | sort -rn | head -n "$n"
