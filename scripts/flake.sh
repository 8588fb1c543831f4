#!/usr/bin/env bash
# flake.sh N [--hog] [go test args...]: runs the test suite N times and
# prints each test that failed, with how many of the N runs it failed in.
# --hog runs a `nice -n 19` busy loop on every core meanwhile, so that the
# suite meets a machine whose other work shares its cores.
# Without go test arguments it runs what `make test` runs after installing
# what the tests need and vet (make test-passes: the race, non-race and
# upstream-TLS passes at once, then the tests that run alone); with them,
# `go test -json ARGS`.
# Logs of failed runs (go test -json, one file per pass) are kept in
# $FLAKE_DIR (default: a temp dir); scripts/testtimes.sh reads them.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: scripts/flake.sh N [--hog] [go test args...]}
shift
hog=0
if [ "${1:-}" = "--hog" ]; then hog=1; shift; fi
args=("$@")
dir=${FLAKE_DIR:-$(mktemp -d)}
pids=()
stop_hogs() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_hogs EXIT
if [ $hog = 1 ]; then
  for _ in $(seq "$(nproc)"); do nice -n 19 sh -c 'while :; do :; done' & pids+=($!); done
fi
# run_once DIR: one run of the suite, its go test -json in DIR/*.json.
run_once() {
  mkdir -p "$1"
  if [ ${#args[@]} -gt 0 ]; then
    go test -json "${args[@]}" >"$1/go-test.json" 2>&1
  else
    make --no-print-directory test-passes TESTJSON="$1" >"$1/make.log" 2>&1
  fi
}
# The suite's tools (memcached, the clients, memjs in testdata/), as make
# test installs them, once: a fresh clone has none of testdata's.
if [ ${#args[@]} -eq 0 ]; then scripts/deps.sh; fi
failed_runs=0
for i in $(seq "$n"); do
  run="$dir/run$i"
  start=$(date +%s)
  if run_once "$run"; then
    rm -rf "$run"
    echo "run $i/$n: ok ($(( $(date +%s) - start )) s)"
  else
    failed_runs=$((failed_runs + 1))
    echo "run $i/$n: FAILED ($(( $(date +%s) - start )) s), logs in $run"
  fi
done
echo "== $failed_runs of $n runs failed$( [ $hog = 1 ] && echo ' (beside a CPU hog)')"
# Each failing test, with the number of runs it failed in.
cat "$dir"/run*/*.json 2>/dev/null | grep '"Action":"fail"' | grep '"Test"' |
  sed -E 's/.*"Package":"([^"]*)".*"Test":"([^"]*)".*/\1 \2/' | sort | uniq -c | sort -rn || true
[ $failed_runs = 0 ]
