#!/usr/bin/env bash
# Run a real Apache Kafka 4.x broker (KRaft, combined broker+controller) on 127.0.0.1 for
# tests: one node, or a cluster of KAFKA_NODES nodes. The jars come from Maven Central
# through Maven (see pom.xml); no tarball, no Docker. See README.md in this directory.
#
# Usage: kafka.sh up|start|stop|down|kill|pause|resume|pid|address|status|logs|jars [N]
#
#   up       stop any broker of $KAFKA_DIR, wipe and format fresh data dirs, pick free
#            loopback ports, start the node(s), wait until ready, print the bootstrap address
#            (127.0.0.1:PORT, or 127.0.0.1:P1,127.0.0.1:P2,... for a cluster) as the last line
#            of stdout.
#   start    start again on the existing data and the same ports (after `stop`), wait until
#            ready, print the bootstrap address. A no-op that prints it if running.
#   stop     SIGTERM, wait up to $KAFKA_STOP_TIMEOUT s, then SIGKILL. Keeps data and ports.
#   down     stop (if running) and remove the broker's files in $KAFKA_DIR.
#   kill     SIGKILL, wait until the process is gone. Keeps data and ports.
#   pause    SIGSTOP (the process stays, frozen).
#   resume   SIGCONT.
#   pid      print the pid (fails if not running); N is required for a cluster.
#   address  print the bootstrap address.
#   status   exit 0 if the node(s) run (prints "running pid=… address=…", one line per node
#            for a cluster, "paused" for a SIGSTOPped one), else 1.
#   logs     print the path of the broker log (one per node for a cluster).
#   jars     only make sure the jars are in the cache; print the lib dir.
#
#   N (1..nodes) makes start, stop, kill, pause, resume, pid, status and logs act on node N
#   only; without it they act on every node. Commands other than up find the layout (one
#   node or a cluster) in $KAFKA_DIR; KAFKA_NODES only matters to up.
#
# Environment:
#   KAFKA_DIR               broker state dir (default: <repo root>/.kafka)
#   KAFKA_NODES             up: number of nodes (default: 1; 1 is the single-node layout)
#   KAFKA_CLIENT_LISTENERS  up: extra listeners CLIENT1..CLIENTK on every node, each listening on
#                           one port and advertising another, for fault proxies (default: 0)
#   KAFKA_HOST              up: the address every listener binds and advertises (default:
#                           127.0.0.1; another local address, e.g. one a test put on a
#                           network interface of its own for pods to reach)
#   KAFKA_VERSION           Kafka version from Maven Central (default: 4.4.0)
#   KAFKA_CACHE_DIR         jar cache (default: ${XDG_CACHE_HOME:-$HOME/.cache}/salesagg/kafka-$KAFKA_VERSION-<pom.xml
#                           checksum>: work trees with different pom.xml files do not refetch each other's jars)
#   KAFKA_HEAP_OPTS         heap per node (default: -Xms128m -Xmx512m; in a cluster -Xms96m -Xmx320m)
#   KAFKA_JVM_OPTS          other broker JVM flags (default: G1 with short pauses; set empty for none)
#   KAFKA_READY_TIMEOUT     seconds to wait for readiness (default: 90)
#   KAFKA_STOP_TIMEOUT      seconds between SIGTERM and SIGKILL (default: 30)
#   MVN                     Maven command (default: mvn)
#
# Files in $KAFKA_DIR: bootstrap (the address, one line), controller (controller address(es)),
# listeners (with KAFKA_CLIENT_LISTENERS: "NODE LISTENER LISTEN_PORT ADVERTISED_PORT" lines),
# .gitignore ("*"), and per node server.properties, data/ (log.dirs incl. KRaft metadata),
# broker.pid, broker.log (broker stdout+stderr; truncated by up, appended by start) and
# format.log: in $KAFKA_DIR itself for one node, in $KAFKA_DIR/node1..nodeN for a cluster.

set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd)"

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_DIR="${KAFKA_DIR:-$REPO_ROOT/.kafka}"
[[ "$KAFKA_DIR" == /* ]] || KAFKA_DIR="$PWD/$KAFKA_DIR"
# The host up was given is kept in $KAFKA_DIR/host for the other commands.
HOST_FILE="$KAFKA_DIR/host"
KAFKA_HOST_GIVEN="${KAFKA_HOST:-}"
if [[ -z "$KAFKA_HOST_GIVEN" && -s "$HOST_FILE" ]]; then KAFKA_HOST=$(<"$HOST_FILE"); fi
export KAFKA_HOST="${KAFKA_HOST:-127.0.0.1}"
POM_SUM="$(cksum <"$SCRIPT_DIR/pom.xml")"
POM_SUM="${POM_SUM%% *}"
KAFKA_CACHE_DIR="${KAFKA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/salesagg/kafka-$KAFKA_VERSION-$POM_SUM}"
KAFKA_JVM_OPTS="${KAFKA_JVM_OPTS--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true}"
KAFKA_READY_TIMEOUT="${KAFKA_READY_TIMEOUT:-90}"
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
MVN="${MVN:-mvn}"

LIB_DIR="$KAFKA_CACHE_DIR/lib"
LOG4J_CONFIG="$SCRIPT_DIR/log4j2.properties"
POM="$SCRIPT_DIR/pom.xml"

# Files of the whole broker (one node or a cluster).
ADDR_FILE="$KAFKA_DIR/bootstrap"
CTRL_FILE="$KAFKA_DIR/controller"
LISTENERS_FILE="$KAFKA_DIR/listeners"

# The layout: NODES nodes; CLUSTER is 1 when NODES > 1 (node files in node1..nodeN).
NODES=1
CLUSTER=0

# Files of the current node (use_node sets them).
NODE=1
NODE_DIR="$KAFKA_DIR"
DATA_DIR="$KAFKA_DIR/data"
PROPS_FILE="$KAFKA_DIR/server.properties"
PID_FILE="$KAFKA_DIR/broker.pid"
LOG_FILE="$KAFKA_DIR/broker.log"
FORMAT_LOG="$KAFKA_DIR/format.log"

READY_MARKER="Kafka Server started"
START_OFFSET=0
# The nodes this run launched: a failed or interrupted start kills them.
LAUNCHED=()

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

now_ms() { date +%s%3N; }

# ---------------------------------------------------------------------------------------
# Layout

# Sets NODES and CLUSTER from KAFKA_NODES (for up).
set_layout() {
  NODES="$1"
  [[ "$NODES" =~ ^[1-9]$ ]] || die "KAFKA_NODES=$NODES: want 1..9"
  CLUSTER=0
  ((NODES == 1)) || CLUSTER=1
}

# Sets NODES and CLUSTER from the files in $KAFKA_DIR: node1..nodeN dirs are a cluster,
# anything else is the single-node layout.
find_layout() {
  local n=0
  while [[ -d "$KAFKA_DIR/node$((n + 1))" ]]; do n=$((n + 1)); done
  if ((n > 0)); then
    NODES="$n" CLUSTER=1
  else
    NODES=1 CLUSTER=0
  fi
}

# Points the per-node variables at node $1.
use_node() {
  NODE="$1"
  if ((CLUSTER)); then
    NODE_DIR="$KAFKA_DIR/node$NODE"
  else
    NODE_DIR="$KAFKA_DIR"
  fi
  DATA_DIR="$NODE_DIR/data"
  PROPS_FILE="$NODE_DIR/server.properties"
  PID_FILE="$NODE_DIR/broker.pid"
  LOG_FILE="$NODE_DIR/broker.log"
  FORMAT_LOG="$NODE_DIR/format.log"
}

# "broker" for one node, "node N" in a cluster: what messages call the current node.
node_name() {
  if ((CLUSTER)); then echo "node $NODE"; else echo "broker"; fi
}

# The nodes a command acts on: node $1 when given (main checks it), else all of them.
select_nodes() {
  if [[ -n "${1-}" ]]; then
    echo "$1"
  else
    seq 1 "$NODES"
  fi
}

heap_opts() {
  if [[ -n "${KAFKA_HEAP_OPTS-}" ]]; then
    echo "$KAFKA_HEAP_OPTS"
  elif ((CLUSTER)); then
    echo "-Xms96m -Xmx320m"
  else
    echo "-Xms128m -Xmx512m"
  fi
}

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

# Prints the pid of the running broker of the current node, or fails. A pid is only
# trusted if that process is a live kafka.Kafka of this node's config (guards against a
# stale pid file and pid reuse).
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

# Succeeds when process $1 is stopped (SIGSTOP).
is_paused() {
  local state
  if [[ -r "/proc/$1/stat" ]]; then
    # The second field, (java), has no spaces.
    read -r _ _ state _ <"/proc/$1/stat" 2>/dev/null || return 1
  else
    state="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  fi
  [[ "$state" == T* || "$state" == t* ]]
}

port_open() {
  local port="$1"
  (exec 3<>"/dev/tcp/$KAFKA_HOST/$port") 2>/dev/null
}

# $1 distinct free TCP ports on 127.0.0.1, on one line.
free_ports() {
  local count="$1"
  if command -v python3 >/dev/null 2>&1; then
    python3 - "$count" <<'PY'
# Below the kernel's ephemeral range (where clients' outgoing connections
# take their local ports, so a port picked there can be taken before the
# broker binds it), as test/port does. All are held bound at once, so they
# differ.
import os, random, socket, sys
count = int(sys.argv[1])
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except Exception:
    low = 32768
picked, socks = [], []
for _ in range(100 * count):
    if len(socks) == count or low <= 10100:
        break
    p = random.randrange(10000, low)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((os.environ.get("KAFKA_HOST", "127.0.0.1"), p))
    except OSError:
        s.close()
        continue
    socks.append(s)
while len(socks) < count:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((os.environ.get("KAFKA_HOST", "127.0.0.1"), 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
  else
    local ports=() p
    while ((${#ports[@]} < count)); do
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

# The listener settings of the client listeners of the current node, from the listeners
# file: LISTEN_EXTRA, ADV_EXTRA and MAP_EXTRA are appended to listeners,
# advertised.listeners and listener.security.protocol.map (empty without client listeners).
client_listener_props() {
  LISTEN_EXTRA="" ADV_EXTRA="" MAP_EXTRA=""
  [[ -s "$LISTENERS_FILE" ]] || return 0
  local n name lport aport
  while read -r n name lport aport; do
    [[ "$n" == "$NODE" ]] || continue
    LISTEN_EXTRA+=",$name://$KAFKA_HOST:$lport"
    ADV_EXTRA+=",$name://$KAFKA_HOST:$aport"
    MAP_EXTRA+=",$name:PLAINTEXT"
  done <"$LISTENERS_FILE"
}

write_props() {
  local port="$1" cport="$2"
  client_listener_props
  cat >"$PROPS_FILE" <<EOF
# Written by test/kafka/kafka.sh: single combined broker+controller on loopback, for tests.
process.roles=broker,controller
node.id=1
listeners=PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$cport$LISTEN_EXTRA
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$cport$ADV_EXTRA
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT$MAP_EXTRA
controller.quorum.bootstrap.servers=$KAFKA_HOST:$cport
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
group.streams.initial.rebalance.delay.ms=0
# Streams groups (group.protocol streams) with session timeouts as short as the tests' classic
# groups (the broker's floor is 45 s otherwise).
group.streams.min.session.timeout.ms=3000
group.streams.min.heartbeat.interval.ms=1000
# Warm-up copies reported (task offsets) as often as every second when a group asks for it.
group.streams.min.task.offset.interval.ms=1000

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

# The server.properties of node $NODE of a cluster: broker port $1, controller port $2,
# static quorum $3 (controller.quorum.voters).
write_cluster_props() {
  local port="$1" cport="$2" voters="$3" rf min_isr
  rf=$((NODES < 3 ? NODES : 3))
  min_isr=$((rf > 1 ? rf - 1 : 1))
  client_listener_props
  cat >"$PROPS_FILE" <<EOF
# Written by test/kafka/kafka.sh: node $NODE of a cluster of $NODES combined broker+controllers
# on loopback, for tests.
process.roles=broker,controller
node.id=$NODE
listeners=PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$cport$LISTEN_EXTRA
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$cport$ADV_EXTRA
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT$MAP_EXTRA
# A static quorum: every node is a voter; a majority must run to elect a controller.
controller.quorum.voters=$voters
log.dirs=$DATA_DIR

# $rf replicas of every topic, $min_isr in sync to write with acks=all: with one node down
# every partition keeps a leader and stays writable, and no acknowledged write lives on one
# node only. Internal topics likewise, with several partitions so that the coordinators of
# different groups and transactional ids can sit on different nodes.
default.replication.factor=$rf
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$min_isr
num.partitions=1
# A replica that fell out of the ISR never becomes leader (that would lose acknowledged writes).
unclean.leader.election.enable=false
# broker.session.timeout.ms stays at Kafka's default (9000): the controller fences a node that
# has not heartbeaten for 9 s; tests pause a node past it.

# Tests create their topics with an admin client.
auto.create.topics.enable=false
# No 3 s wait before the first rebalance of a new group.
group.initial.rebalance.delay.ms=0
group.streams.initial.rebalance.delay.ms=0
# Streams groups (group.protocol streams) with session timeouts as short as the tests' classic
# groups (the broker's floor is 45 s otherwise).
group.streams.min.session.timeout.ms=3000
group.streams.min.heartbeat.interval.ms=1000
# Warm-up copies reported (task offsets) as often as every second when a group asks for it.
group.streams.min.task.offset.interval.ms=1000

# Compaction observable quickly (the cleaner only cleans closed segments: give topics a
# small segment.ms; segment.bytes must be >= 1 MiB in Kafka 4.x). Small cleaner buffer.
log.cleaner.backoff.ms=1000
log.cleaner.min.cleanable.ratio=0.01
log.cleaner.dedupe.buffer.size=33554432
log.cleaner.threads=1

# 2-core machine, several nodes on it.
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
EOF
}

# Formats the data dirs of every node with cluster id $1 (in parallel: one JVM each), before
# any starts.
format_nodes() {
  local id="$1" n
  local -a pids=() mode=(--standalone)
  ((CLUSTER)) && mode=()
  for n in $(seq 1 "$NODES"); do
    use_node "$n"
    java -Xms32m -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
      "-Dlog4j2.configurationFile=$LOG4J_CONFIG" -cp "$LIB_DIR/*" \
      kafka.tools.StorageTool format "${mode[@]}" -t "$id" -c "$PROPS_FILE" \
      </dev/null >"$FORMAT_LOG" 2>&1 &
    pids+=("$!")
  done
  local failed=0
  for n in $(seq 1 "$NODES"); do
    use_node "$n"
    if ! wait "${pids[$((n - 1))]}"; then
      tail -n 40 "$FORMAT_LOG" >&2 || true
      log "error: formatting $DATA_DIR failed (log: $FORMAT_LOG)"
      failed=1
    fi
  done
  ((failed == 0)) || exit 1
}

# Starts the current node's broker in the background, in its own session, with no fd in
# common with the caller (so a caller reading our stdout through a pipe is not held open by
# the broker).
launch() {
  mkdir -p "$NODE_DIR"
  rm -f "$PID_FILE"
  # The JVM's temp dir is the node's own, emptied at each start: the
  # compression codecs unpack their native libraries there, and a broker
  # killed with SIGKILL leaves them behind (one file per start).
  rm -rf "$NODE_DIR/tmp"
  mkdir -p "$NODE_DIR/tmp"
  local -a heap jvm
  read -r -a heap <<<"$(heap_opts)"
  read -r -a jvm <<<"$KAFKA_JVM_OPTS"
  local -a cmd=(java "${heap[@]}" "${jvm[@]}"
    "-Djava.io.tmpdir=$NODE_DIR/tmp"
    "-Dlog4j2.configurationFile=$LOG4J_CONFIG"
    -cp "$LIB_DIR/*" kafka.Kafka "$PROPS_FILE")
  printf '\n===== kafka.sh: starting broker %s at %s =====\n' "$KAFKA_VERSION" "$(date '+%Y-%m-%d %H:%M:%S')" >>"$LOG_FILE"
  local -a detach=()
  command -v setsid >/dev/null 2>&1 && detach=(setsid)
  LAUNCHED+=("$NODE")
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

# The broker port of node $1 (from the bootstrap file, in node order).
node_port() {
  local -a addrs
  IFS=, read -r -a addrs <"$ADDR_FILE"
  local a="${addrs[$(($1 - 1))]}"
  echo "${a##*:}"
}

# Waits until each node "NODE:LOG_OFFSET" of $2... has logged (past that byte offset of its
# log) that its broker started, and its port accepts TCP connections. On failure: that
# node's log tail to stderr, kill the nodes this run launched, exit non-zero.
wait_ready() {
  local t0="$1" item n offset port pid deadline
  shift
  local -a pending=("$@") still
  declare -A pids=()
  for item in "${pending[@]}"; do
    use_node "${item%%:*}"
    pids[$NODE]="$(cat "$PID_FILE")"
  done
  deadline=$(($(date +%s) + KAFKA_READY_TIMEOUT))
  while ((${#pending[@]} > 0)); do
    still=()
    for item in "${pending[@]}"; do
      n="${item%%:*}" offset="${item#*:}"
      use_node "$n"
      pid="${pids[$n]}"
      port="$(node_port "$n")"
      START_OFFSET="$offset"
      if ! is_broker "$pid"; then
        fail_start "$(node_name) process $pid exited before it was ready"
      fi
      # (grep reads a process substitution, not a pipe: with pipefail, `tail | grep -q`
      # can fail on SIGPIPE even when grep matched.)
      if grep -qF "$READY_MARKER" < <(tail -c +"$((offset + 1))" "$LOG_FILE") && port_open "$port"; then
        log "$(node_name) ready at $KAFKA_HOST:$port (pid $pid) in $(( $(now_ms) - t0 )) ms"
      else
        still+=("$item")
      fi
    done
    pending=("${still[@]+"${still[@]}"}")
    ((${#pending[@]} > 0)) || break
    if (($(date +%s) >= deadline)); then
      use_node "${pending[0]%%:*}"
      START_OFFSET="${pending[0]#*:}"
      fail_start "$(node_name) not ready after ${KAFKA_READY_TIMEOUT} s"
    fi
    sleep 0.2
  done
}

# Launches the nodes $2... (all at once: a quorum elects a controller only once a majority
# runs) and waits until each is ready; an interrupted wait does not leave a broker behind
# (each runs in its own session, so a Ctrl-C would not reach it).
launch_and_wait() {
  local t0="$1" n
  shift
  local -a items=()
  trap 'log "interrupted"; kill_brokers 5 "${LAUNCHED[@]}"; exit 130' INT TERM HUP
  for n in "$@"; do
    use_node "$n"
    local offset=0
    [[ -f "$LOG_FILE" ]] && offset="$(wc -c <"$LOG_FILE")"
    launch
    items+=("$n:$offset")
  done
  wait_ready "$t0" "${items[@]}"
  trap - INT TERM HUP
  if ((CLUSTER)); then log "cluster ready at $(cat "$ADDR_FILE") in $(( $(now_ms) - t0 )) ms"; fi
}

# Reports why the start of the current node failed (START_OFFSET: where this start's part of
# its log begins), kills the nodes this run launched, exits 1.
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
  kill_brokers 5 "${LAUNCHED[@]}" || true
  exit 1
}

# Stops the brokers of nodes $2... at once: SIGTERM (and SIGCONT, so that a paused one shuts
# down too), wait up to $1 s, then SIGKILL. Succeeds when none runs.
kill_brokers() {
  local timeout="$1" n pid i
  shift
  declare -A pids=()
  for n in "$@"; do
    use_node "$n"
    if pid="$(broker_pid)"; then
      log "stopping $(node_name) (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      kill -CONT "$pid" 2>/dev/null || true
      pids[$n]="$pid"
    else
      rm -f "$PID_FILE"
    fi
  done
  ((${#pids[@]} > 0)) || return 0
  for ((i = 0; i < timeout * 10; i++)); do
    alive_nodes pids || break
    sleep 0.1
  done
  for n in "${!pids[@]}"; do
    use_node "$n"
    if is_broker "${pids[$n]}"; then
      log "$(node_name) did not stop within ${timeout} s: SIGKILL"
      kill -KILL "${pids[$n]}" 2>/dev/null || true
    fi
  done
  for ((i = 0; i < 50; i++)); do
    alive_nodes pids || break
    sleep 0.1
  done
  for n in "${!pids[@]}"; do
    use_node "$n"
    rm -f "$PID_FILE"
  done
}

# Succeeds when a process of the associative array named $1 (node -> pid) still runs.
alive_nodes() {
  local -n node_pids="$1"
  local n
  for n in "${!node_pids[@]}"; do
    use_node "$n"
    is_broker "${node_pids[$n]}" && return 0
  done
  return 1
}

address() {
  [[ -s "$ADDR_FILE" ]] || die "no broker address in $ADDR_FILE (run: $0 up)"
  cat "$ADDR_FILE"
}

# Stops every broker of $KAFKA_DIR, in either layout, before up or down wipe the files. A
# cluster's nodes are SIGKILLed: a clean stop of all nodes at once takes 5 s at least (the
# quorum leader waits that long for the other voters to acknowledge that it resigns), for
# data that is deleted next.
kill_all_layouts() {
  local nodes="$NODES" cluster="$CLUSTER"
  find_layout
  if ((CLUSTER)); then
    # shellcheck disable=SC2046
    sigkill_nodes 1 $(seq 1 "$NODES")
  fi
  CLUSTER=0 NODES=1
  kill_brokers "$KAFKA_STOP_TIMEOUT" 1
  NODES="$nodes" CLUSTER="$cluster"
}

# Removes the broker files of $KAFKA_DIR (both layouts), not .gitignore.
remove_files() {
  local d
  rm -rf "$KAFKA_DIR/data" "$KAFKA_DIR/server.properties" "$KAFKA_DIR/broker.pid" "$ADDR_FILE" "$CTRL_FILE" \
    "$LISTENERS_FILE" "$HOST_FILE" "$KAFKA_DIR/broker.log" "$KAFKA_DIR/format.log"
  for d in "$KAFKA_DIR"/node[0-9]*; do
    [[ -d "$d" ]] && rm -rf "$d"
  done
  return 0
}

# ---------------------------------------------------------------------------------------
# Commands

cmd_up() {
  local t0 n k i id voters="" addrs="" ctrls="" listeners="${KAFKA_CLIENT_LISTENERS:-0}"
  t0="$(now_ms)"
  [[ "$listeners" =~ ^[0-9]+$ ]] && ((listeners <= 32)) || die "KAFKA_CLIENT_LISTENERS=$listeners: want 0..32"
  ensure_jars
  kill_all_layouts
  remove_files
  set_layout "${KAFKA_NODES:-1}"
  mkdir -p "$KAFKA_DIR"
  [[ -f "$KAFKA_DIR/.gitignore" ]] || printf '*\n' >"$KAFKA_DIR/.gitignore"
  export KAFKA_HOST="${KAFKA_HOST_GIVEN:-127.0.0.1}"
  printf '%s\n' "$KAFKA_HOST" >"$HOST_FILE"

  # Per node: broker, controller, then per client listener: listen, advertised.
  local -a ports
  read -r -a ports <<<"$(free_ports $((NODES * (2 + 2 * listeners))))"
  i=0
  local -a port cport
  for n in $(seq 1 "$NODES"); do
    port[n]="${ports[i]}" cport[n]="${ports[i + 1]}"
    i=$((i + 2))
    addrs+="${addrs:+,}$KAFKA_HOST:${port[n]}"
    ctrls+="${ctrls:+,}$KAFKA_HOST:${cport[n]}"
    voters+="${voters:+,}$n@$KAFKA_HOST:${cport[n]}"
    for ((k = 1; k <= listeners; k++)); do
      printf '%s CLIENT%s %s %s\n' "$n" "$k" "${ports[i]}" "${ports[i + 1]}"
      i=$((i + 2))
    done
  done >"$LISTENERS_FILE.tmp"
  if ((listeners > 0)); then mv "$LISTENERS_FILE.tmp" "$LISTENERS_FILE"; else rm -f "$LISTENERS_FILE.tmp"; fi

  for n in $(seq 1 "$NODES"); do
    use_node "$n"
    mkdir -p "$DATA_DIR"
    if ((CLUSTER)); then
      write_cluster_props "${port[n]}" "${cport[n]}" "$voters"
    else
      write_props "${port[n]}" "${cport[n]}"
    fi
  done
  printf '%s\n' "$addrs" >"$ADDR_FILE"
  printf '%s\n' "$ctrls" >"$CTRL_FILE"

  id="$(cluster_id)"
  format_nodes "$id"

  launch_and_wait "$t0" $(seq 1 "$NODES")
  address
}

cmd_start() {
  local t0 n
  t0="$(now_ms)"
  local -a start=()
  for n in $(select_nodes "${1-}"); do
    use_node "$n"
    [[ -f "$PROPS_FILE" && -d "$DATA_DIR" && -s "$ADDR_FILE" ]] || die "no $(node_name) in $KAFKA_DIR to start (run: $0 up)"
    broker_pid >/dev/null || start+=("$n")
  done
  if ((${#start[@]} == 0)); then
    address
    return 0
  fi
  ensure_jars
  launch_and_wait "$t0" "${start[@]}"
  address
}

cmd_stop() {
  # shellcheck disable=SC2046
  kill_brokers "$KAFKA_STOP_TIMEOUT" $(select_nodes "${1-}")
}

cmd_kill() {
  # shellcheck disable=SC2046
  sigkill_nodes 0 $(select_nodes "${1-}")
}

# SIGKILLs the brokers of nodes $2... and waits until each is gone; $1 is 1 to say nothing
# of a node that does not run.
sigkill_nodes() {
  local quiet="$1" n pid i
  shift
  for n in "$@"; do
    use_node "$n"
    pid="$(broker_pid)" || { ((quiet)) || log "$(node_name) is not running"; rm -f "$PID_FILE"; continue; }
    log "killing $(node_name) (pid $pid): SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      is_broker "$pid" || break
      sleep 0.05
    done
    is_broker "$pid" && die "$(node_name) (pid $pid) still runs after SIGKILL"
    rm -f "$PID_FILE"
  done
}

# Sends signal $1 (STOP or CONT) to the node(s) $2 (all when empty).
cmd_signal() {
  local sig="$1" n pid
  for n in $(select_nodes "${2-}"); do
    use_node "$n"
    pid="$(broker_pid)" || die "$(node_name) is not running"
    kill -"$sig" "$pid"
    log "$(node_name) (pid $pid): SIG$sig"
  done
}

cmd_pid() {
  local n="${1-}"
  if [[ -z "$n" ]]; then
    ((CLUSTER == 0)) || die "pid: which node? ($0 pid 1..$NODES)"
    n=1
  fi
  use_node "$n"
  broker_pid || { log "$(node_name) is not running"; return 1; }
}

cmd_down() {
  kill_all_layouts
  remove_files
  # Remove $KAFKA_DIR itself only if nothing else is left in it.
  rm -f "$KAFKA_DIR/.gitignore"
  rmdir "$KAFKA_DIR" 2>/dev/null || true
}

cmd_status() {
  local pid n state rc=0
  if ((CLUSTER == 0)); then
    use_node 1
    if pid="$(broker_pid)"; then
      state=running
      is_paused "$pid" && state=paused
      echo "$state pid=$pid address=$(cat "$ADDR_FILE" 2>/dev/null || echo '?')"
      return 0
    fi
    echo "not running" >&2
    return 1
  fi
  for n in $(select_nodes "${1-}"); do
    use_node "$n"
    if pid="$(broker_pid)"; then
      state=running
      is_paused "$pid" && state=paused
      echo "node $n $state pid=$pid address=$KAFKA_HOST:$(node_port "$n")"
    else
      echo "node $n not running address=$KAFKA_HOST:$(node_port "$n" 2>/dev/null || echo '?')"
      rc=1
    fi
  done
  return "$rc"
}

cmd_logs() {
  local n
  for n in $(select_nodes "${1-}"); do
    use_node "$n"
    echo "$LOG_FILE"
  done
}

usage() {
  sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

main() {
  (($# == 1 || $# == 2)) || usage
  local cmd="$1" node="${2-}"
  case "$cmd" in
    up | down | address | jars) (($# == 1)) || usage ;;
  esac
  [[ "$cmd" == up ]] || find_layout
  if [[ -n "$node" ]] && ! [[ "$node" =~ ^[1-9][0-9]*$ && "$node" -le "$NODES" ]]; then
    die "no node $node in $KAFKA_DIR (nodes: 1..$NODES)"
  fi
  case "$cmd" in
    up) cmd_up ;;
    start) cmd_start "$node" ;;
    stop) cmd_stop "$node" ;;
    down) cmd_down ;;
    kill) cmd_kill "$node" ;;
    pause) cmd_signal STOP "$node" ;;
    resume) cmd_signal CONT "$node" ;;
    pid) cmd_pid "$node" ;;
    address) address ;;
    status) cmd_status "$node" ;;
    logs) cmd_logs "$node" ;;
    jars)
      ensure_jars
      echo "$LIB_DIR"
      ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
