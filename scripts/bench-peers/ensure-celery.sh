#!/usr/bin/env bash
# Installs Celery (from PyPI) for `make bench-peers` into a venv under ~/.cache when missing.
set -euo pipefail
CELERY_VERSION=5.7.0
venv=${FLEET_CELERY_VENV:-$HOME/.cache/fleet-celery}
if ! "$venv/bin/celery" --version 2>/dev/null | grep -q "^$CELERY_VERSION"; then
  echo "bench-peers: installing celery $CELERY_VERSION into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "celery==$CELERY_VERSION" "redis>=5,<7" "requests>=2.31,<3"
fi
"$venv/bin/celery" --version
