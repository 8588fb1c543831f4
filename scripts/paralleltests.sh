#!/usr/bin/env bash
# paralleltests.sh DIR: a regular expression matching the tests of the Go
# package in DIR that call t.Parallel() first thing, ^(TestA|TestB|...)$
# (the Makefile runs them and the package's other tests in two processes).
# A test that calls it later is left out: it runs with the others, as
# correctly, only less at once.
set -euo pipefail
dir=${1:?usage: scripts/paralleltests.sh DIR}
names=$(awk '/^func Test[A-Za-z0-9_]*\(t \*testing\.T\) \{$/ {
    name = $2; sub(/\(.*/, "", name)
    if ((getline next_line) > 0 && next_line ~ /^\tt\.Parallel\(\)$/) print name
  }' "$dir"/*_test.go | sort | paste -sd'|')
[ -n "$names" ] || { echo "paralleltests.sh: no test in $dir calls t.Parallel() first" >&2; exit 1; }
echo "^($names)\$"
