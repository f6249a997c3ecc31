#!/usr/bin/env bash
# Runs salesagg on a laptop with no Docker: the embedded dev broker on
# 127.0.0.1:9092 persisting to ./data/broker, and the service with its state
# in ./data/state and its HTTP interface on 127.0.0.1:8080. Ctrl-C stops both
# (the service first, so it leaves the group cleanly).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/salesagg}
BROKER=${BROKER:-127.0.0.1:9092}
HTTP=${HTTP:-127.0.0.1:8080}
DATA=${DATA:-./data}

go build -o "$BIN" ./cmd/salesagg
mkdir -p "$DATA"

# The broker runs in its own session, so that Ctrl-C (SIGINT to the whole
# terminal process group) reaches only the service; the broker is stopped
# after it, once the service has left the group.
setsid "$BIN" broker --data-dir "$DATA/broker" --listen "$BROKER" &
broker_pid=$!
stop_broker() {
  kill -TERM "$broker_pid" 2>/dev/null || true
  wait "$broker_pid" 2>/dev/null || true
}
trap stop_broker EXIT

# Wait (bounded) until the broker accepts connections.
host=${BROKER%:*} port=${BROKER##*:}
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then break; fi
  if ! kill -0 "$broker_pid" 2>/dev/null; then echo "dev broker exited" >&2; exit 1; fi
  sleep 0.1
done

echo "salesagg: broker on $BROKER, HTTP on http://$HTTP, state in $DATA/state" >&2
echo "salesagg: in another shell: $BIN produce --file sample_events.txt --bootstrap.servers $BROKER" >&2
# Static membership is the default (group.instance.id derived from the state
# dir): after a kill -9 the next start gets its tasks back at once instead of
# waiting for the old session to time out. INSTANCE_ID overrides the id.
"$BIN" run --bootstrap.servers "$BROKER" --state.dir "$DATA/state" --http.addr "$HTTP" \
  ${INSTANCE_ID:+--group.instance.id "$INSTANCE_ID"} "$@" &
svc_pid=$!
trap 'kill -TERM "$svc_pid" 2>/dev/null || true' INT TERM
status=0
wait "$svc_pid" || status=$?
# wait returns early (status > 128) when a trapped signal arrives: wait again
# for the service's own exit status.
if [ "$status" -gt 128 ]; then status=0; wait "$svc_pid" || status=$?; fi
exit "$status"
