#!/usr/bin/env bash
# Runs the MCP conformance suite's client scenarios that apply to the fleet's MCP client against
# `fleetctl mcp conformance` (fleetctl/src/mcp.rs): the suite starts a scenario server, runs the
# command with the server's URL, and checks what the client sent. Fails if any scenario fails.
# Needs what scripts/ensure-mcp.sh installs (the suite and the Node 22 it runs on) and a built
# fleetctl (FLEETCTL, default target/debug/fleetctl under CARGO_TARGET_DIR).
#
# The scenarios: `initialize` (the handshake), `tools_call` (a listed tool called with its
# arguments), `sse-retry` (an SSE stream closed mid-call, resumed with Last-Event-ID after the
# server's `retry`), `http-invalid-tool-headers`. Not run: the 2026-07-28 revision's stateless
# lifecycle scenarios (the client speaks the initialize handshake of 2025-11-25) and the OAuth
# ones (`auth/*`: the fleet sends a server's configured headers, it runs no OAuth flow).
set -euo pipefail

dir=${FLEET_MCP_DIR:-$HOME/.cache/fleet-mcp}
root=$(cd "$(dirname "$0")/.." && pwd)
fleetctl=${FLEETCTL:-${CARGO_TARGET_DIR:-$root/target}/debug/fleetctl}
scenarios=(initialize tools_call sse-retry http-invalid-tool-headers)
node="$dir/node_modules/.bin/node"
suite="$dir/node_modules/.bin/conformance"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

failed=()
for scenario in "${scenarios[@]}"; do
  if "$node" "$suite" client --command "$fleetctl mcp conformance" --scenario "$scenario" --timeout 60000 \
    >"$out/log" 2>&1; then
    echo "check-mcp-conformance: $scenario passed"
  else
    echo "check-mcp-conformance: $scenario FAILED" >&2
    sed 's/^/    /' "$out/log" >&2
    failed+=("$scenario")
  fi
done
echo "${#scenarios[@]} scenarios: $((${#scenarios[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
[ "${#failed[@]}" -eq 0 ]
