#!/usr/bin/env bash
# Runs salesagg on a laptop with no Docker: the embedded dev broker on
# 127.0.0.1:9092 persisting to ./data/broker, and the service with its state
# in ./data/state and its HTTP interface on 127.0.0.1:8080. Ctrl-C stops both:
# the service first (it commits, closes its stores and leaves the group), then
# the broker. Arguments are passed to `salesagg run` (`make run ARGS=...`).
#
# The service only ever runs against the broker this script started: when
# the dev broker cannot listen (the port is taken, by another `make run` or
# a Kafka of your own), the script fails at once and the broker's error names
# the address and the process holding it. To use a broker already running,
# say so with BROKER: then no dev broker is started or stopped.
#
# Environment (all optional):
#   BIN          the binary (default bin/salesagg)
#   BUILD        1 (default): build BIN first (scripts/build.sh); 0: use BIN as it is
#   BROKER       host:port of a broker already running to use instead of
#                the dev broker (default: none, start the dev broker)
#   BROKER_LISTEN  where the dev broker listens (default 127.0.0.1:9092)
#   HTTP         the service's http.addr (default 127.0.0.1:8080)
#   DATA         where the broker's data and the state go (default ./data)
#   INSTANCE_ID  the service's group.instance.id (default: derived from the state dir)
#
# A DATA dir inside the checkout is recorded in .dev-data-dirs, so that
# `make clean` removes it with ./data (DATA=./data2: a second instance's).
#
# This script's own lines are written by the binary (`salesagg log`), in the
# format the service uses: log.format from the arguments or SALESAGG_LOG_FORMAT,
# else console on a terminal and JSON otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/salesagg}
BUILD=${BUILD:-1}
BROKER=${BROKER:-}
BROKER_LISTEN=${BROKER_LISTEN:-127.0.0.1:9092}
HTTP=${HTTP:-127.0.0.1:8080}
DATA=${DATA:-./data}

# The log format asked for, if any: the last --log.format of the arguments,
# else the environment.
format=${SALESAGG_LOG_FORMAT:-}
prev=
for arg in "$@"; do
  case "$arg" in
    --log.format=*) format=${arg#--log.format=} ;;
    *) [ "$prev" = --log.format ] && format=$arg ;;
  esac
  prev=$arg
done
fmt_args=()
[ -n "$format" ] && fmt_args=(--log.format "$format")

if [ "$BUILD" != 0 ]; then
  ./scripts/build.sh "$BIN"
fi
mkdir -p "$DATA"
root=$(pwd -P)
data_abs=$(cd "$DATA" && pwd -P)
case "$data_abs" in
  "$root"/*)
    rel=${data_abs#"$root"/}
    grep -qxF "$rel" .dev-data-dirs 2>/dev/null || echo "$rel" >>.dev-data-dirs
    ;;
esac

# say LEVEL MESSAGE [KEY=VALUE ...]: one log line from this script.
say() {
  local level=$1
  shift
  "$BIN" log "${fmt_args[@]}" --level "$level" --logger dev "$@" || true
}

# Job control: each background job gets its own process group, so that
# Ctrl-C (SIGINT to the terminal's foreground process group) reaches this
# script alone, and the script stops the service first and the broker after
# it, once the service has left the group. (Both would otherwise get the
# SIGINT at once: the broker would go while the service still needs it.)
set -m

broker_pid=
svc_pid=
ready_file=
cleanup() {
  [ -n "$ready_file" ] && rm -f "$ready_file"
  # On any exit: the service first (normally stopped already), then the broker.
  if [ -n "$svc_pid" ] && kill -0 "$svc_pid" 2>/dev/null; then
    kill -TERM "$svc_pid" 2>/dev/null || true
    wait "$svc_pid" 2>/dev/null || true
  fi
  if [ -n "$broker_pid" ] && kill -0 "$broker_pid" 2>/dev/null; then
    say info "Stopping the dev broker" pid="$broker_pid"
    kill -TERM "$broker_pid" 2>/dev/null || true
    wait "$broker_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

if [ -n "$BROKER" ]; then
  # On purpose: a broker of the user's own. Check that it answers, so that a
  # typo fails here rather than in the service's retries.
  host=${BROKER%:*} port=${BROKER##*:}
  reachable=0
  for _ in $(seq 1 50); do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then reachable=1; break; fi
    sleep 0.1
  done
  if [ "$reachable" = 0 ]; then
    say error "Nothing answers at BROKER; the service is not started" broker="$BROKER"
    exit 1
  fi
  say info "Using the broker at BROKER (no dev broker is started); starting the service" broker="$BROKER" http="http://$HTTP" state.dir="$DATA/state"
else
  # The broker writes "broker listening on ADDR" to its stdout once its
  # listener is bound, and fails at once when the address is taken. Waiting
  # for that line, not for the port to answer (whoever holds the port would
  # answer too), is what keeps the service off a broker this script did not
  # start.
  ready_file=$(mktemp "${TMPDIR:-/tmp}/salesagg-dev-broker.XXXXXX")
  "$BIN" broker --data-dir "$DATA/broker" --listen "$BROKER_LISTEN" "${fmt_args[@]}" >"$ready_file" &
  broker_pid=$!
  ready=0
  for _ in $(seq 1 300); do
    if grep -q '^broker listening on ' "$ready_file" 2>/dev/null; then ready=1; break; fi
    if ! kill -0 "$broker_pid" 2>/dev/null; then
      wait "$broker_pid" 2>/dev/null || true
      broker_pid=
      say error "The dev broker could not start (its error is above); the service is not started" addr="$BROKER_LISTEN"
      exit 1
    fi
    sleep 0.1
  done
  rm -f "$ready_file"
  ready_file=
  if [ "$ready" = 0 ]; then
    say error "The dev broker did not start listening within 30 s; the service is not started" addr="$BROKER_LISTEN"
    exit 1
  fi
  BROKER=$BROKER_LISTEN
  say info "Dev broker ready; starting the service" broker="$BROKER" http="http://$HTTP" state.dir="$DATA/state"
fi
say info "In another shell: $BIN produce --file sample_events.txt --bootstrap.servers $BROKER"
# Static membership is the default (group.instance.id derived from the state
# dir): after a kill -9 the next start gets its tasks back at once instead of
# waiting for the old session to time out. INSTANCE_ID overrides the id.
"$BIN" run --bootstrap.servers "$BROKER" --state.dir "$DATA/state" --http.addr "$HTTP" \
  ${INSTANCE_ID:+--group.instance.id "$INSTANCE_ID"} "$@" &
svc_pid=$!

stopping=0
stop_service() {
  if [ "$stopping" = 0 ]; then
    stopping=1
    kill -TERM "$svc_pid" 2>/dev/null || true
  else
    # A second Ctrl-C: the service's own "second signal" stops it at once.
    kill -INT "$svc_pid" 2>/dev/null || true
  fi
}
trap stop_service INT TERM HUP

status=0
# wait returns early (status > 128) when a trapped signal arrives: wait again
# until the service itself has exited, and take its exit status.
while :; do
  status=0
  wait "$svc_pid" || status=$?
  kill -0 "$svc_pid" 2>/dev/null || break
done
svc_pid=
exit "$status"
