#!/usr/bin/env bash
# Runs salesagg on a laptop with no Docker: the embedded dev broker on
# 127.0.0.1:9092 persisting to ./data/broker, and the service with its state
# in ./data/state and its HTTP interface on 127.0.0.1:8080. Ctrl-C stops both:
# the service first (it commits, closes its stores and leaves the group), then
# the broker. Arguments are passed to `salesagg run`.
#
# Environment (all optional):
#   BIN          the binary (default bin/salesagg)
#   BUILD        1 (default): go build BIN first; 0: use BIN as it is
#   BROKER       the broker's host:port (default 127.0.0.1:9092)
#   HTTP         the service's http.addr (default 127.0.0.1:8080)
#   DATA         where the broker's data and the state go (default ./data)
#   INSTANCE_ID  the service's group.instance.id (default: derived from the state dir)
#
# This script's own lines are written by the binary (`salesagg log`), in the
# format the service uses: log.format from the arguments or SALESAGG_LOG_FORMAT,
# else console on a terminal and JSON otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/salesagg}
BUILD=${BUILD:-1}
BROKER=${BROKER:-127.0.0.1:9092}
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
  go build -o "$BIN" ./cmd/salesagg
fi
mkdir -p "$DATA"

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
cleanup() {
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

# The broker's stdout (its address, for scripts) is not needed: it logs it.
"$BIN" broker --data-dir "$DATA/broker" --listen "$BROKER" "${fmt_args[@]}" >/dev/null &
broker_pid=$!

# Wait (bounded) until the broker accepts connections.
host=${BROKER%:*} port=${BROKER##*:}
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then break; fi
  if ! kill -0 "$broker_pid" 2>/dev/null; then
    broker_pid=
    say error "The dev broker exited" addr="$BROKER"
    exit 1
  fi
  sleep 0.1
done

say info "Dev broker ready; starting the service" broker="$BROKER" http="http://$HTTP" state.dir="$DATA/state"
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
