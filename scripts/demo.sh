#!/usr/bin/env bash
# Runs a local fleet (dispatcher + 2 workers) against the local RabbitMQ and Redis, then the demo:
# a receiver registers as a tool, one call goes through, and the verified result is printed.
# DEMO_KEEP=1 keeps the fleet running afterwards (Ctrl-C stops it). Logs: .fleet-run/*.log
set -euo pipefail
cd "$(dirname "$0")/.."
run=.fleet-run
mkdir -p "$run"
[ -s "$run/secrets.key" ] || od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$run/secrets.key"
export FLEET_SECRETS_KEY="${FLEET_SECRETS_KEY:-$(cat "$run/secrets.key")}"
export FLEET_API_TOKENS="${FLEET_API_TOKENS:-demo-token-0123456789abcdef}"
export FLEET_ALLOW_PRIVATE_CALLBACKS=true   # the demo receiver listens on loopback
export FLEET_TOPOLOGY_PREFIX="${FLEET_TOPOLOGY_PREFIX:-demo}"
export FLEET_REDIS_KEY_PREFIX="${FLEET_REDIS_KEY_PREFIX:-demo:}"
export FLEET_HTTP_ADDR="${FLEET_HTTP_ADDR:-127.0.0.1:8080}"
# The knowledge base's services (docs/api.md "Knowledge base"): the example catalog.
export FLEET_SERVICES_CATALOG="${FLEET_SERVICES_CATALOG:-$PWD/deploy/services-catalog.example.json}"
worker_ports=(${FLEET_DEMO_WORKER_PORTS:-9090 9091})
export RUST_LOG="${RUST_LOG:-info,lapin=warn}"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

if [ -z "${FLEET_LLM_BASE_URL:-}" ]; then
  # No model configured: a stand-in OpenAI-compatible server for the demo turn.
  llm_addr="${FLEET_DEMO_LLM_ADDR:-127.0.0.1:9092}"
  target/debug/fleet-demo serve-llm "$llm_addr" >"$run/demo-llm.log" 2>&1 & pids+=($!)
  export FLEET_LLM_BASE_URL="http://$llm_addr/v1"
fi
target/debug/dispatcher >"$run/dispatcher.log" 2>&1 & pids+=($!)
for port in "${worker_ports[@]}"; do
  FLEET_WORKER_HTTP_ADDR="127.0.0.1:$port" target/debug/worker >"$run/worker-$port.log" 2>&1 & pids+=($!)
done

ready() { curl -fsS "http://$1/readyz" >/dev/null 2>&1; }
for _ in $(seq 1 100); do
  all=1
  ready "$FLEET_HTTP_ADDR" || all=0
  for port in "${worker_ports[@]}"; do ready "127.0.0.1:$port" || all=0; done
  [ $all = 1 ] && break
  sleep 0.2
done
if [ $all != 1 ]; then
  echo "demo: the fleet did not become ready; see $run/*.log" >&2
  tail -n 5 "$run"/*.log >&2
  exit 1
fi
echo "fleet ready: dispatcher http://$FLEET_HTTP_ADDR, workers on ports ${worker_ports[*]}"
echo "operator console: http://$FLEET_HTTP_ADDR/console (log in with the token ${FLEET_API_TOKENS%%,*})"

FLEET_DEMO_API="http://$FLEET_HTTP_ADDR" target/debug/fleet-demo

if [ "${DEMO_KEEP:-0}" = 1 ]; then
  echo "fleet running (token: $FLEET_API_TOKENS; console: http://$FLEET_HTTP_ADDR/console). Try:"
  echo "  curl -H 'Authorization: Bearer $FLEET_API_TOKENS' http://$FLEET_HTTP_ADDR/v1/tools"
  echo "Ctrl-C stops it."
  wait
fi
