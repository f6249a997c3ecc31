#!/usr/bin/env bash
# Side-by-side benchmark: salesagg vs the Kafka Streams reference vs a consume-only franz-go
# consumer, on one real Kafka broker (test/kafka/kafka.sh, in a temp dir, stopped at the end).
#
# Usage: bench/compare.sh [flags]          e.g. bench/compare.sh --events 20000 --products 2000
#        bench/compare.sh --products 100000,1000000 --systems salesagg --profile
#                                          two data sets, a growth table, CPU/heap profiles
#        bench/compare.sh --help           lists the flags
#
# Same as `go run ./bench/compare [flags]` from the repository root, except that the harness is
# built first and then exec'd, so a Ctrl-C or SIGTERM reaches it directly (it then stops the
# process under test and the broker). See bench/README.md.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
GO="${GO:-go}"
BIN_DIR="${TMPDIR:-/tmp}/salesagg-bench-compare.$(id -u)"
mkdir -p "$BIN_DIR"
"$GO" build -o "$BIN_DIR/compare" ./bench/compare
exec "$BIN_DIR/compare" "$@"
