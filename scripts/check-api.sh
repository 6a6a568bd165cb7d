#!/usr/bin/env bash
# The API contract check (`make check-api`): a real dispatcher (the shared RabbitMQ and Redis, a
# fresh topology and key prefix, a throw-away tool registered) is fuzzed by schemathesis with the
# document it serves at /v1/openapi.json: every documented operation, valid and invalid inputs,
# every check (no 5xx, every status and body as documented, invalid input refused, ...) but
# positive_data_acceptance: a schema-valid body may still be refused 422 for what a schema cannot
# say (the tool must be registered, a body's name must be the path's, a URL must parse and point
# where callbacks may go), and use_after_free: `DELETE /v1/sessions/{id}` forgets a session's
# conversation, and the session (a room, or a key the next turn reuses) still answers its empty
# conversation afterwards, which that check reads as a deleted resource still served (the other
# deletes' 404 afterwards are tested across processes: tools, assistants, dead letters).
# The session stream is left out: its body never ends (its 403 and shape are tested in
# tests/api_surface.rs).
# Installs schemathesis into a venv under ~/.cache when missing. Cleans up what it created.
# FLEET_API_CHECK_EXAMPLES sets the cases per operation and phase (default 25: under ~2 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
venv=${FLEET_SCHEMATHESIS_VENV:-$HOME/.cache/fleet-schemathesis}
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
  echo "check-api: installing schemathesis $SCHEMATHESIS_VERSION into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION"
fi

bin=${CARGO_TARGET_DIR:-target}/debug/dispatcher
[ -x "$bin" ] || cargo build -q -p fleet-dispatcher --bin dispatcher

id="t$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
prefix="fleet-$id"
keys="$id:"
token="api-check-token-$id"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
api="http://127.0.0.1:$port"
log=$(mktemp -t check-api-dispatcher.XXXXXX)
report=$(mktemp -d -t check-api-report.XXXXXX)

cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  # Only what this run created: its prefix's queues and exchanges, its key prefix's keys.
  for q in $(rabbitmqctl list_queues name --no-table-headers --quiet 2>/dev/null | grep "^$prefix\." || true); do
    rabbitmqctl delete_queue "$q" >/dev/null 2>&1 || true
  done
  for e in $(rabbitmqctl list_exchanges name --no-table-headers --quiet 2>/dev/null | grep "^$prefix\." || true); do
    rabbitmqctl eval "rabbit_exchange:delete(rabbit_misc:r(<<\"/\">>, exchange, <<\"$e\">>), false, <<\"check-api\">>)." \
      >/dev/null 2>&1 || true
  done
  redis-cli -u "${FLEET_REDIS_URL:-redis://127.0.0.1:6379}" --scan --pattern "$keys*" 2>/dev/null |
    xargs -r -n 100 redis-cli -u "${FLEET_REDIS_URL:-redis://127.0.0.1:6379}" DEL >/dev/null 2>&1 || true
  rm -rf "$log" "$report"
}
trap cleanup EXIT

FLEET_AMQP_URL=${FLEET_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f} \
FLEET_REDIS_URL=${FLEET_REDIS_URL:-redis://127.0.0.1:6379} \
FLEET_TOPOLOGY_PREFIX="$prefix" FLEET_REDIS_KEY_PREFIX="$keys" FLEET_API_TOKENS="$token" \
FLEET_SECRETS_KEY=6b6579206f6620746865207465737420666c6565742c2033322062797465732e \
FLEET_ALLOW_PRIVATE_CALLBACKS=true FLEET_HTTP_ADDR="127.0.0.1:$port" RUST_LOG=warn \
  "$bin" 2>"$log" &
pid=$!
for _ in $(seq 1 300); do
  curl -fs "$api/readyz" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "check-api: the dispatcher exited"; exit 1; }
  sleep 0.1
done
curl -fs "$api/readyz" >/dev/null || { cat "$log"; echo "check-api: the dispatcher is not ready"; exit 1; }

# A throw-away tool, so that generated tool calls can also be accepted.
curl -fsS -X PUT "$api/v1/tools/contract_tool" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
  -d '{"description":"api check","parameters":{"type":"object"},"callback_url":"http://127.0.0.1:9/none","callback_secret":"0123456789abcdef"}' \
  >/dev/null

# One worker: with two, Hypothesis's lambda-source cache (not thread-safe) sometimes raised a
# runtime error of its own ("AST constructor recursion depth mismatch") that failed the check.
status=0
"$venv/bin/schemathesis" run "$api/v1/openapi.json" \
  --checks all \
  --exclude-checks positive_data_acceptance,use_after_free \
  --max-examples "${FLEET_API_CHECK_EXAMPLES:-25}" \
  --seed "${FLEET_API_CHECK_SEED:-20261203}" \
  --header "Authorization: Bearer $token" \
  --request-timeout 10 \
  --workers 1 \
  --exclude-path "/v1/sessions/{id}/stream" \
  --report junit --report-dir "$report" \
  --no-color "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo "check-api: schemathesis found contract violations (exit $status); dispatcher log:"
  tail -n 50 "$log"
fi
exit "$status"
