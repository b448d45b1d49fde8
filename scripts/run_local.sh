#!/usr/bin/env bash
# Start the manager and three observer services against the local infrastructure
# (.run/env, written by `python -m tools.infra up`). Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
set -a
# shellcheck disable=SC1091
. .run/env
set +a
PY=${PY:-.venv/bin/python}
SERVICES=${SERVICES:-3}
pids=()
stop() {
    trap - INT TERM EXIT
    echo "stopping ${#pids[@]} process(es)..."
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
}
trap stop INT TERM EXIT

"$PY" -m manager &
pids+=($!)
# On a cluster (BROKER_NODES=3), service i's home is node i of ORCH_AMQP_URLS, so the
# services spread over the nodes evenly (a hash of three names would not).
IFS=, read -r -a nodes <<< "${ORCH_AMQP_URLS:-}"
for i in $(seq 1 "$SERVICES"); do
    urls="${ORCH_AMQP_URLS:-}"
    if [ "${#nodes[@]}" -gt 1 ]; then
        at=$(( (i - 1) % ${#nodes[@]} ))
        urls=$(IFS=,; echo "${nodes[*]:$at},${nodes[*]:0:$at}")
        urls=${urls%,}
    fi
    ORCH_AMQP_URLS="$urls" ORCH_AMQP_HOME=first ORCH_SERVICE_NAME="observer-$i" "$PY" -m observer_service &
    pids+=($!)
done
echo "manager on http://${ORCH_MANAGER_HOST:-127.0.0.1}:${ORCH_MANAGER_PORT:-8000} with $SERVICES observer services; Ctrl-C stops them"
wait -n "${pids[@]}"
