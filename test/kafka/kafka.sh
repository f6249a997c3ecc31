#!/usr/bin/env bash
# Run a real single-node Apache Kafka 4.x broker (KRaft, combined broker+controller) on
# 127.0.0.1 for tests. The jars come from Maven Central through Maven (see pom.xml); no
# tarball, no Docker. See README.md in this directory.
#
# Usage: kafka.sh up|start|stop|down|address|status|logs|jars
#
#   up       stop any broker of $KAFKA_DIR, wipe and format a fresh data dir, pick two free
#            loopback ports, start the broker, wait until ready, print the bootstrap address
#            (127.0.0.1:PORT) as the last line of stdout.
#   start    start again on the existing data dir and the same ports (after `stop`), wait
#            until ready, print the address. A no-op that prints the address if running.
#   stop     SIGTERM, wait up to $KAFKA_STOP_TIMEOUT s, then SIGKILL. Keeps data and ports.
#   down     stop (if running) and remove the broker's files in $KAFKA_DIR.
#   address  print the bootstrap address.
#   status   exit 0 if the broker is running (prints "running pid=… address=…"), else 1.
#   logs     print the path of the broker log.
#   jars     only make sure the jars are in the cache; print the lib dir.
#
# Environment:
#   KAFKA_DIR            broker state dir (default: <repo root>/.kafka)
#   KAFKA_VERSION        Kafka version from Maven Central (default: 4.4.0)
#   KAFKA_CACHE_DIR      jar cache (default: ${XDG_CACHE_HOME:-$HOME/.cache}/salesagg/kafka-$KAFKA_VERSION-<pom.xml
#                        checksum>: work trees with different pom.xml files do not refetch each other's jars)
#   KAFKA_HEAP_OPTS      broker heap (default: -Xms128m -Xmx512m)
#   KAFKA_JVM_OPTS       other broker JVM flags (default: G1 with short pauses; set empty for none)
#   KAFKA_READY_TIMEOUT  seconds to wait for readiness (default: 90)
#   KAFKA_STOP_TIMEOUT   seconds between SIGTERM and SIGKILL (default: 30)
#   MVN                  Maven command (default: mvn)
#
# Files in $KAFKA_DIR: server.properties, data/ (log.dirs incl. KRaft metadata), broker.pid,
# bootstrap (the address, one line), controller (controller address), broker.log
# (broker stdout+stderr; truncated by up, appended by start), format.log, .gitignore ("*").

set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd)"

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_DIR="${KAFKA_DIR:-$REPO_ROOT/.kafka}"
[[ "$KAFKA_DIR" == /* ]] || KAFKA_DIR="$PWD/$KAFKA_DIR"
POM_SUM="$(cksum <"$SCRIPT_DIR/pom.xml")"
POM_SUM="${POM_SUM%% *}"
KAFKA_CACHE_DIR="${KAFKA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/salesagg/kafka-$KAFKA_VERSION-$POM_SUM}"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}"
KAFKA_JVM_OPTS="${KAFKA_JVM_OPTS--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true}"
KAFKA_READY_TIMEOUT="${KAFKA_READY_TIMEOUT:-90}"
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
MVN="${MVN:-mvn}"

LIB_DIR="$KAFKA_CACHE_DIR/lib"
LOG4J_CONFIG="$SCRIPT_DIR/log4j2.properties"
POM="$SCRIPT_DIR/pom.xml"

DATA_DIR="$KAFKA_DIR/data"
PROPS_FILE="$KAFKA_DIR/server.properties"
PID_FILE="$KAFKA_DIR/broker.pid"
ADDR_FILE="$KAFKA_DIR/bootstrap"
CTRL_FILE="$KAFKA_DIR/controller"
LOG_FILE="$KAFKA_DIR/broker.log"
FORMAT_LOG="$KAFKA_DIR/format.log"

READY_MARKER="Kafka Server started"
START_OFFSET=0

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

now_ms() { date +%s%3N; }

# ---------------------------------------------------------------------------------------
# Jars

# The cache is complete when its marker holds this stamp (version + pom checksum), so a
# changed pom.xml or version refreshes it; otherwise no Maven work at all.
jars_stamp() {
  local sum
  sum="$(cksum <"$POM")"
  printf '%s %s\n' "$KAFKA_VERSION" "${sum%% *}"
}

jars_complete() {
  local marker="$KAFKA_CACHE_DIR/.complete"
  [[ -f "$marker" ]] && [[ "$(cat "$marker")" == "$1" ]] && compgen -G "$LIB_DIR/kafka_2.13-*.jar" >/dev/null
}

ensure_jars() {
  local stamp
  stamp="$(jars_stamp)"
  jars_complete "$stamp" && return 0
  command -v "$MVN" >/dev/null 2>&1 || die "Maven ($MVN) not found; it fetches Kafka's jars from Maven Central"
  command -v java >/dev/null 2>&1 || die "java not found (Java 17+ needed)"
  mkdir -p "$KAFKA_CACHE_DIR"
  # Serialize concurrent fetches into the same cache (the lock fd lives only in this
  # subshell, so the broker started later does not inherit it).
  (
    if command -v flock >/dev/null 2>&1; then
      exec 9>"$KAFKA_CACHE_DIR/.lock"
      flock 9
    fi
    jars_complete "$stamp" && exit 0
    tmp="$(mktemp -d "$KAFKA_CACHE_DIR/lib.tmp.XXXXXX")"
    mvn_log="$KAFKA_CACHE_DIR/maven.log"
    t0="$(now_ms)"
    log "fetching Kafka $KAFKA_VERSION jars with Maven into $LIB_DIR"
    if ! "$MVN" -B -q -Dstyle.color=never -f "$POM" \
        -Dkafka.version="$KAFKA_VERSION" \
        dependency:copy-dependencies \
        -DoutputDirectory="$tmp" -DincludeScope=runtime >"$mvn_log" 2>&1; then
      tail -n 40 "$mvn_log" >&2 || true
      rm -rf "$tmp"
      die "Maven could not fetch Kafka $KAFKA_VERSION (log: $mvn_log)"
    fi
    compgen -G "$tmp/kafka_2.13-*.jar" >/dev/null || { rm -rf "$tmp"; die "Maven ran but the kafka_2.13 jar is missing"; }
    # Swap by renames: a broker already running from the old lib dir keeps working.
    if [[ -e "$LIB_DIR" ]]; then
      old="$(mktemp -d "$KAFKA_CACHE_DIR/lib.old.XXXXXX")"
      mv -T "$LIB_DIR" "$old"
      mv -T "$tmp" "$LIB_DIR"
      rm -rf "$old"
    else
      mv -T "$tmp" "$LIB_DIR"
    fi
    printf '%s\n' "$stamp" >"$KAFKA_CACHE_DIR/.complete"
    log "jars ready in $(( ($(now_ms) - t0) / 1000 )) s"
  )
}

# ---------------------------------------------------------------------------------------
# Process helpers

# Prints the pid of the running broker of $KAFKA_DIR, or fails. A pid is only trusted if
# that process is a live kafka.Kafka (guards against a stale pid file and pid reuse).
broker_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid
  pid="$(cat "$PID_FILE" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  is_broker "$pid" || return 1
  printf '%s\n' "$pid"
}

is_broker() {
  local pid="$1" args
  kill -0 "$pid" 2>/dev/null || return 1
  if [[ -r "/proc/$pid/cmdline" ]]; then
    args="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  else
    args="$(ps -o args= -p "$pid" 2>/dev/null)" || return 1
  fi
  # A zombie has an empty cmdline and is not running anymore.
  [[ "$args" == *kafka.Kafka*"$PROPS_FILE"* ]]
}

port_open() {
  local port="$1"
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

# Two distinct free TCP ports on 127.0.0.1: "BROKER CONTROLLER".
free_ports() {
  if command -v python3 >/dev/null 2>&1; then
    python3 - <<'PY'
# Below the kernel's ephemeral range (where clients' outgoing connections
# take their local ports, so a port picked there can be taken before the
# broker binds it), as test/port does.
import random, socket
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except Exception:
    low = 32768
picked, socks = [], []
for _ in range(200):
    if len(socks) == 2 or low <= 10100:
        break
    p = random.randrange(10000, low)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        continue
    socks.append(s)
while len(socks) < 2:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
  else
    local ports=() p
    while ((${#ports[@]} < 2)); do
      p=$((20000 + RANDOM % 30000))
      if ! port_open "$p" && [[ " ${ports[*]-} " != *" $p "* ]]; then ports+=("$p"); fi
    done
    echo "${ports[*]}"
  fi
}

# A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, not starting
# with '-' (what `kafka-storage random-uuid` prints, without starting a JVM).
cluster_id() {
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" != -* && ${#id} -eq 22 ]] && { echo "$id"; return; }
  done
}

write_props() {
  local port="$1" cport="$2"
  cat >"$PROPS_FILE" <<EOF
# Written by test/kafka/kafka.sh: single combined broker+controller on loopback, for tests.
process.roles=broker,controller
node.id=1
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
controller.quorum.bootstrap.servers=127.0.0.1:$cport
log.dirs=$DATA_DIR

# One node: every internal topic at replication 1, or groups hang and transactions never start.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1
num.partitions=1

# Tests create their topics with an admin client.
auto.create.topics.enable=false
# No 3 s wait before the first rebalance of a new group.
group.initial.rebalance.delay.ms=0

# Compaction observable quickly (the cleaner only cleans closed segments: give topics a
# small segment.ms; segment.bytes must be >= 1 MiB in Kafka 4.x). Small cleaner buffer.
log.cleaner.backoff.ms=1000
log.cleaner.min.cleanable.ratio=0.01
log.cleaner.dedupe.buffer.size=33554432
log.cleaner.threads=1

# 2-core machine.
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
EOF
}

# Starts the broker in the background, in its own session, with no fd in common with the
# caller (so a caller reading our stdout through a pipe is not held open by the broker).
launch() {
  mkdir -p "$KAFKA_DIR"
  rm -f "$PID_FILE"
  local -a heap jvm
  read -r -a heap <<<"$KAFKA_HEAP_OPTS"
  read -r -a jvm <<<"$KAFKA_JVM_OPTS"
  local -a cmd=(java "${heap[@]}" "${jvm[@]}"
    "-Dlog4j2.configurationFile=$LOG4J_CONFIG"
    -cp "$LIB_DIR/*" kafka.Kafka "$PROPS_FILE")
  printf '\n===== kafka.sh: starting broker %s at %s =====\n' "$KAFKA_VERSION" "$(date '+%Y-%m-%d %H:%M:%S')" >>"$LOG_FILE"
  local -a detach=()
  command -v setsid >/dev/null 2>&1 && detach=(setsid)
  # The inner shell writes its own pid, then execs java under that same pid; this stays
  # right even where setsid forks.
  # shellcheck disable=SC2016
  "${detach[@]}" bash -c 'echo "$$" >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' "$PID_FILE" "${cmd[@]}" \
    </dev/null >>"$LOG_FILE" 2>&1 &
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s "$PID_FILE" ]] && return 0
    sleep 0.05
  done
  die "broker process did not start (see $LOG_FILE)"
}

# Waits until the log (past byte offset $1) says the broker started and its port accepts
# TCP connections. On failure: log tail to stderr, kill the broker, exit non-zero.
wait_ready() {
  local offset="$1" port="$2" t0="$3" pid deadline
  START_OFFSET="$offset"
  pid="$(cat "$PID_FILE")"
  deadline=$(($(date +%s) + KAFKA_READY_TIMEOUT))
  while :; do
    if ! is_broker "$pid"; then
      fail_start "broker process $pid exited before it was ready"
    fi
    # (grep reads a process substitution, not a pipe: with pipefail, `tail | grep -q`
    # can fail on SIGPIPE even when grep matched.)
    if grep -qF "$READY_MARKER" < <(tail -c +"$((offset + 1))" "$LOG_FILE") && port_open "$port"; then
      log "broker ready at 127.0.0.1:$port (pid $pid) in $(( $(now_ms) - t0 )) ms"
      return 0
    fi
    if (($(date +%s) >= deadline)); then
      fail_start "broker not ready after ${KAFKA_READY_TIMEOUT} s"
    fi
    sleep 0.2
  done
}

# Launches the broker and waits until ready; an interrupted wait does not leave a broker
# behind (it runs in its own session, so a Ctrl-C would not reach it).
launch_and_wait() {
  trap 'log "interrupted"; kill_broker 5; exit 130' INT TERM HUP
  launch
  wait_ready "$@"
  trap - INT TERM HUP
}

fail_start() {
  local errors
  log "error: $1"
  # The cause (e.g. a port in use) is often logged well before the shutdown noise.
  errors="$(tail -c +"$((START_OFFSET + 1))" "$LOG_FILE" | grep -E '^\[[^]]*\] (ERROR|FATAL) |Exception' | head -n 20 || true)"
  if [[ -n "$errors" ]]; then
    log "errors in $LOG_FILE:"
    printf '%s\n' "$errors" >&2
  fi
  log "last lines of $LOG_FILE:"
  tail -n 40 "$LOG_FILE" >&2 || true
  kill_broker 5 || true
  exit 1
}

# SIGTERM, wait up to $1 s, then SIGKILL. Succeeds when nothing runs.
kill_broker() {
  local timeout="$1" pid i
  pid="$(broker_pid)" || { rm -f "$PID_FILE"; return 0; }
  log "stopping broker (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < timeout * 10; i++)); do
    is_broker "$pid" || break
    sleep 0.1
  done
  if is_broker "$pid"; then
    log "broker did not stop within ${timeout} s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      is_broker "$pid" || break
      sleep 0.1
    done
  fi
  rm -f "$PID_FILE"
}

address() {
  [[ -s "$ADDR_FILE" ]] || die "no broker address in $ADDR_FILE (run: $0 up)"
  cat "$ADDR_FILE"
}

# ---------------------------------------------------------------------------------------
# Commands

cmd_up() {
  local t0 ports port cport id offset
  t0="$(now_ms)"
  ensure_jars
  kill_broker "$KAFKA_STOP_TIMEOUT"
  rm -rf "$DATA_DIR" "$PROPS_FILE" "$ADDR_FILE" "$CTRL_FILE" "$LOG_FILE" "$FORMAT_LOG"
  mkdir -p "$DATA_DIR"
  [[ -f "$KAFKA_DIR/.gitignore" ]] || printf '*\n' >"$KAFKA_DIR/.gitignore"

  ports="$(free_ports)"
  read -r port cport <<<"$ports"
  write_props "$port" "$cport"
  printf '127.0.0.1:%s\n' "$port" >"$ADDR_FILE"
  printf '127.0.0.1:%s\n' "$cport" >"$CTRL_FILE"

  id="$(cluster_id)"
  if ! java -Xms32m -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
      "-Dlog4j2.configurationFile=$LOG4J_CONFIG" -cp "$LIB_DIR/*" \
      kafka.tools.StorageTool format --standalone -t "$id" -c "$PROPS_FILE" \
      </dev/null >"$FORMAT_LOG" 2>&1; then
    tail -n 40 "$FORMAT_LOG" >&2 || true
    die "formatting $DATA_DIR failed (log: $FORMAT_LOG)"
  fi

  offset=0
  launch_and_wait "$offset" "$port" "$t0"
  address
}

cmd_start() {
  local t0 port offset
  t0="$(now_ms)"
  [[ -f "$PROPS_FILE" && -d "$DATA_DIR" && -s "$ADDR_FILE" ]] || die "no broker in $KAFKA_DIR to start (run: $0 up)"
  if broker_pid >/dev/null; then
    address
    return 0
  fi
  ensure_jars
  port="$(address)"
  port="${port##*:}"
  offset=0
  [[ -f "$LOG_FILE" ]] && offset="$(wc -c <"$LOG_FILE")"
  launch_and_wait "$offset" "$port" "$t0"
  address
}

cmd_stop() {
  kill_broker "$KAFKA_STOP_TIMEOUT"
}

cmd_down() {
  kill_broker "$KAFKA_STOP_TIMEOUT"
  rm -rf "$DATA_DIR" "$PROPS_FILE" "$PID_FILE" "$ADDR_FILE" "$CTRL_FILE" "$LOG_FILE" "$FORMAT_LOG"
  # Remove $KAFKA_DIR itself only if nothing else is left in it.
  rm -f "$KAFKA_DIR/.gitignore"
  rmdir "$KAFKA_DIR" 2>/dev/null || true
}

cmd_status() {
  local pid
  if pid="$(broker_pid)"; then
    echo "running pid=$pid address=$(cat "$ADDR_FILE" 2>/dev/null || echo '?')"
    return 0
  fi
  echo "not running" >&2
  return 1
}

usage() {
  sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

main() {
  (($# == 1)) || usage
  case "$1" in
    up) cmd_up ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    down) cmd_down ;;
    address) address ;;
    status) cmd_status ;;
    logs) echo "$LOG_FILE" ;;
    jars)
      ensure_jars
      echo "$LIB_DIR"
      ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
