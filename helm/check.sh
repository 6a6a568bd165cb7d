#!/usr/bin/env bash
# Offline checks of the Helm chart (helm/agent-fleet) and the Docker stack (deploy/):
# helm lint, rendering, Kubernetes schema validation, values-schema rejections,
# docker-compose structure. No cluster, helm binary or Docker engine needed.
#
#   bash helm/check.sh            # from anywhere; extra args go to pytest
#
# Python packages come from PyPI into a virtualenv at ${FLEET_VENV:-/tmp/fleet-chart-venv}
# (created on first use, reused afterwards).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The chart packages copies of the alert rules and dashboard (Helm cannot read outside the chart);
# they must be the same files as deploy/'s.
for f in prometheus/alerts.yml:alerts.yml grafana/fleet-dashboard.json:fleet-dashboard.json; do
  if ! cmp -s "$here/../deploy/${f%%:*}" "$here/agent-fleet/files/${f##*:}"; then
    echo "check.sh: helm/agent-fleet/files/${f##*:} differs from deploy/${f%%:*}; copy it over" >&2
    exit 1
  fi
done
venv="${FLEET_VENV:-/tmp/fleet-chart-venv}"
python="${PYTHON:-python3}"

# name==version as pip installs them; helm-python-sdk ships Helm v4's Go SDK as a shared library.
requirements=(
  "helm-python-sdk==0.2.2"
  "kubernetes-validate==1.37.0"
  "jsonschema>=4.20"
  "check-jsonschema>=0.29"
  "pyyaml>=6"
  "pytest>=8"
)

if [[ ! -x "$venv/bin/python" ]]; then
  echo "check.sh: creating virtualenv $venv" >&2
  "$python" -m venv "$venv"
fi

# Install only when something is missing, so a warm run does not touch the network.
if ! "$venv/bin/python" - "${requirements[@]}" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version, PackageNotFoundError
from packaging.requirements import Requirement
for spec in sys.argv[1:]:
    req = Requirement(spec)
    try:
        if not req.specifier.contains(version(req.name), prereleases=True):
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  echo "check.sh: installing ${requirements[*]}" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check packaging "${requirements[@]}" >&2
fi

cd "$here/.."
# -rP shows the captured output of passing tests (helm lint's report, validation summaries);
# pytest's own summary line ("N passed ...") is the script's last line.
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -rP helm/tests/test_chart.py "$@"
