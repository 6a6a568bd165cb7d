#!/usr/bin/env bash
# Installs what the MCP client tests (tests/tests/fleet/mcp_client.rs) and the MCP conformance
# check (scripts/check-mcp-conformance.sh) run, when it is missing: a Python venv with the official
# SDK (PyPI `mcp`, its test servers in tests/mcp/python/), the TypeScript SDK (npm
# `@modelcontextprotocol/sdk`, tests/mcp/ts/), and the conformance suite with the Node 22 it needs
# (npm `node@22`: the machine's Node 20 has no `fs.globSync`). Into a cache directory, never
# system-wide:
#   ${FLEET_MCP_DIR:-$HOME/.cache/fleet-mcp}/{venv,node_modules}
# Does nothing when everything is there.
set -euo pipefail

MCP_PY_VERSION=2.3.0
MCP_TS_VERSION=1.32.2
CONFORMANCE_VERSION=0.2.0-alpha.12
NODE22_VERSION=22.23.3
dir=${FLEET_MCP_DIR:-$HOME/.cache/fleet-mcp}

missing=()
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=$([ "$(id -u)" -ne 0 ] && echo sudo || true)
  echo "ensure-mcp: installing Debian's ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$dir"
version_of() {
  node -p "try { require('$dir/node_modules/$1/package.json').version } catch { '' }"
}
wanted=()
[ "$(version_of @modelcontextprotocol/sdk)" = "$MCP_TS_VERSION" ] || wanted+=("@modelcontextprotocol/sdk@$MCP_TS_VERSION")
[ "$(version_of @modelcontextprotocol/conformance)" = "$CONFORMANCE_VERSION" ] || wanted+=("@modelcontextprotocol/conformance@$CONFORMANCE_VERSION")
[ "$(version_of node)" = "$NODE22_VERSION" ] || wanted+=("node@$NODE22_VERSION")
if [ "${#wanted[@]}" -gt 0 ]; then
  echo "ensure-mcp: installing ${wanted[*]} into $dir" >&2
  [ -f "$dir/package.json" ] || echo '{"name": "fleet-mcp", "private": true}' >"$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --silent "${wanted[@]}"
fi

if [ "$("$dir/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))' 2>/dev/null)" != "$MCP_PY_VERSION" ]; then
  echo "ensure-mcp: installing mcp $MCP_PY_VERSION into $dir/venv" >&2
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q "mcp==$MCP_PY_VERSION"
fi

"$dir/node_modules/.bin/node" --version >/dev/null
node -e "require('$dir/node_modules/@modelcontextprotocol/sdk/package.json')"
"$dir/venv/bin/python" -c 'import mcp.server.mcpserver'
