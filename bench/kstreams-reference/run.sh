#!/usr/bin/env bash
# Build (if needed) and run the Kafka Streams reference application.
#
# Usage: run.sh [--bootstrap HOST:PORT] [--application-id ID] [--state-dir DIR]
#               [--processing-guarantee at_least_once|exactly_once_v2]
#               [--input-topic T] [--notification-topic T] [--threshold N]
#               [--commit-interval-ms MS] [--num-stream-threads N] [--cache-max-bytes N]
#               [--leave-group-on-close true|false] [--num-standby-replicas N]
#               [--instance-id ID] [--http-addr HOST:PORT] [--rocksdb default|tuned]
#               [--transactional-state-stores true|false] [--windows 1h,24h] [--windows-grace-ms MS]
#               [--prop key=value]... [--describe]
#        run.sh --build-only     build (if needed) and exit
#        run.sh --rebuild ...    build even if up to date, then run
#
# Each flag also accepts --flag=value and maps to an environment variable the application reads
# (BOOTSTRAP_SERVERS, APPLICATION_ID, STATE_DIR, PROCESSING_GUARANTEE, INPUT_TOPIC,
# NOTIFICATION_TOPIC, NOTIFICATION_THRESHOLD, COMMIT_INTERVAL_MS, NUM_STREAM_THREADS,
# CACHE_MAX_BYTES, LEAVE_GROUP_ON_CLOSE); flags win over the environment. Unknown flags are passed to
# the application, which reads the others itself (--num-standby-replicas, --instance-id, --http-addr,
# --rocksdb, --transactional-state-stores; environment NUM_STANDBY_REPLICAS, INSTANCE_ID, HTTP_ADDR,
# ROCKSDB, TRANSACTIONAL_STATE_STORES).
#
# The JVM replaces this shell (exec), so the pid a harness started is the JVM's: SIGTERM to it
# closes Kafka Streams cleanly (up to 30 s). stdout carries only "REFERENCE ..." marker lines;
# logs and the build's output go to stderr.
#
# Environment: JAVA_OPTS (default -Xms64m -Xmx512m), JAVA (default java), MVN (default mvn).

set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JAR="$DIR/target/kstreams-reference.jar"
JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"
JAVA_OPTS="${JAVA_OPTS:--Xms64m -Xmx512m}"

die() { printf 'run.sh: %s\n' "$*" >&2; exit 2; }

needs_build() {
  [[ -f "$JAR" && -d "$DIR/target/lib" ]] || return 0
  [[ -n "$(find "$DIR/pom.xml" "$DIR/src" -newer "$JAR" -print -quit)" ]]
}

build() {
  command -v "$MVN" >/dev/null 2>&1 || die "Maven ($MVN) not found"
  local t0=$SECONDS
  printf 'run.sh: building %s\n' "$JAR" >&2
  # Quiet, and on stderr: stdout is reserved for the application's marker lines.
  "$MVN" -q -B -Dstyle.color=never -f "$DIR/pom.xml" package -DskipTests >&2 \
    || die "build failed (run: $MVN -f $DIR/pom.xml package)"
  printf 'run.sh: built in %d s\n' "$((SECONDS - t0))" >&2
}

# take "$@": the current flag's value, from --flag=value or from the next argument.
take() {
  ((has_value)) && return 0
  (($# >= 2)) || die "$flag needs a value"
  value="$2" shift_extra=1
}

build_only=0 rebuild=0
args=()
while (($#)); do
  flag="$1" value="" has_value=0 shift_extra=0
  if [[ "$flag" == --*=* ]]; then
    value="${flag#*=}" flag="${flag%%=*}" has_value=1
  fi
  case "$flag" in
    --build-only) build_only=1 ;;
    --rebuild) rebuild=1 ;;
    --bootstrap | --bootstrap-servers) take "$@"; export BOOTSTRAP_SERVERS="$value" ;;
    --application-id) take "$@"; export APPLICATION_ID="$value" ;;
    --state-dir) take "$@"; export STATE_DIR="$value" ;;
    --processing-guarantee | --guarantee) take "$@"; export PROCESSING_GUARANTEE="$value" ;;
    --input-topic) take "$@"; export INPUT_TOPIC="$value" ;;
    --notification-topic) take "$@"; export NOTIFICATION_TOPIC="$value" ;;
    --threshold | --notification-threshold) take "$@"; export NOTIFICATION_THRESHOLD="$value" ;;
    --commit-interval-ms) take "$@"; export COMMIT_INTERVAL_MS="$value" ;;
    --num-stream-threads) take "$@"; export NUM_STREAM_THREADS="$value" ;;
    --cache-max-bytes) take "$@"; export CACHE_MAX_BYTES="$value" ;;
    --leave-group-on-close) take "$@"; export LEAVE_GROUP_ON_CLOSE="$value" ;;
    -h | --help) sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) args+=("$1") ;;
  esac
  shift $((1 + shift_extra))
done

if ((rebuild)) || needs_build; then
  build
fi
((build_only)) && exit 0

command -v "$JAVA" >/dev/null 2>&1 || die "java not found (Java 17+ needed)"
read -r -a java_opts <<<"$JAVA_OPTS"
exec "$JAVA" "${java_opts[@]}" -cp "$DIR/target/kstreams-reference.jar:$DIR/target/lib/*" \
  salesagg.reference.SalesAggregator "${args[@]+"${args[@]}"}"
