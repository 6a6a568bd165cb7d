#!/usr/bin/env bash
# Installs what the seed-client tests (tests/tests/fleet/seed_agents.rs, tests/tests/fleet/seed_streaming.rs)
# run the seeds' own examples with, when it is missing: `jq` and `curl` (the seed's bash), Node.js
# (its TypeScript snippets, ported to JavaScript), the npm package `eventsource` 2.x (the seed's
# `new EventSource(url, { headers })`), and a Python venv with Flask (its Python tool-callback
# verifier), and moto's S3 server (the artifact store's S3 test). npm and pip install into a
# cache directory, never system-wide:
#   ${FLEET_SEED_CLIENTS_DIR:-$HOME/.cache/fleet-seed-clients}/{node_modules,venv}
# Does nothing when everything is there.
set -euo pipefail

EVENTSOURCE_VERSION=2.0.2
FLASK_VERSION=3.1.3
# An S3-compatible server for the artifact store's S3 test (tests/tests/fleet/seed_artifacts.rs).
MOTO_VERSION=5.2.6
dir=${FLEET_SEED_CLIENTS_DIR:-$HOME/.cache/fleet-seed-clients}

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
missing=()
command -v jq >/dev/null 2>&1 || missing+=(jq)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "ensure-seed-clients: installing Debian's ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$dir"
installed=$(node -p "try { require('$dir/node_modules/eventsource/package.json').version } catch { '' }")
if [ "$installed" != "$EVENTSOURCE_VERSION" ]; then
  echo "ensure-seed-clients: installing eventsource@$EVENTSOURCE_VERSION into $dir" >&2
  [ -f "$dir/package.json" ] || echo '{"name": "fleet-seed-clients", "private": true}' >"$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --silent "eventsource@$EVENTSOURCE_VERSION"
fi

if ! "$dir/venv/bin/python" -c 'import flask, moto.server' >/dev/null 2>&1; then
  echo "ensure-seed-clients: installing Flask $FLASK_VERSION into $dir/venv" >&2
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q "flask==$FLASK_VERSION"
fi

if ! "$dir/venv/bin/python" -c 'import moto.server' >/dev/null 2>&1; then
  echo "ensure-seed-clients: installing moto[server] $MOTO_VERSION into $dir/venv" >&2
  "$dir/venv/bin/pip" install -q "moto[server]==$MOTO_VERSION"
fi

jq --version >/dev/null
node -e "require('$dir/node_modules/eventsource')"
"$dir/venv/bin/python" -c 'import flask, moto.server'
