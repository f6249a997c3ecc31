#!/usr/bin/env bash
# Runs one make target several times in a row and says how each run ended,
# to find tests that pass by luck. With COLD=1 (root only) the page cache is
# dropped before each run, so every run starts as on a machine that was idle;
# COLD=first drops it before the first run only. Each run gets a fresh TMPDIR
# (removed afterwards) and its output is kept under LOGS.
#
#   scripts/repeat.sh test-browser 10            # 10 runs
#   COLD=1 scripts/repeat.sh test-e2e 5          # 5 runs, caches dropped before each
#
# Environment (all optional):
#   COLD   0 (default), 1 (before every run) or first
#   LOGS   where each run's output goes (default: a new dir under /tmp)
#   STOP   1: stop at the first failure (default 0: run them all)
#
# Prints one line per run (number, result, wall seconds, log file) and a
# summary; exits 1 when any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."

target=${1:?usage: scripts/repeat.sh TARGET [RUNS]}
runs=${2:-5}
cold=${COLD:-0}
logs=${LOGS:-$(mktemp -d /tmp/repeat-"$target".XXXXXX)}
mkdir -p "$logs"
case $runs in '' | *[!0-9]*) echo "RUNS must be a number, not $runs" >&2; exit 2 ;; esac
case $cold in 0 | 1 | first) ;; *) echo "COLD must be 0, 1 or first, not $cold" >&2; exit 2 ;; esac

drop_caches() {
  if [ "$(id -u)" != 0 ]; then
    echo "COLD needs root (it writes /proc/sys/vm/drop_caches)" >&2
    exit 2
  fi
  sync
  echo 3 >/proc/sys/vm/drop_caches
}

failed=0
for i in $(seq 1 "$runs"); do
  if [ "$cold" = 1 ] || { [ "$cold" = first ] && [ "$i" = 1 ]; }; then
    drop_caches
  fi
  tmp=$(mktemp -d /tmp/repeat-tmp.XXXXXX)
  log="$logs/run-$i.log"
  start=$(date +%s.%N)
  TMPDIR=$tmp make "$target" >"$log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  rm -rf "$tmp"
  if [ $rc = 0 ]; then
    result=pass
  else
    result="FAIL (exit $rc)"
    failed=$((failed + 1))
  fi
  printf 'run %d/%d %s: %s, %.1f s, %s\n' "$i" "$runs" "$target" "$result" "$secs" "$log"
  if [ $rc != 0 ]; then
    grep -E -- '--- FAIL|^\s+\S+_test\.go:[0-9]+:|panic:' "$log" | head -20 | sed 's/^/    /'
    [ "${STOP:-0}" = 1 ] && break
  fi
done
echo "$target: $failed of $runs runs failed (logs in $logs)"
[ $failed = 0 ]
