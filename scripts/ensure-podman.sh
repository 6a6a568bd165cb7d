#!/usr/bin/env bash
# Makes sure podman can build and run the fleet's image here: installs Debian's podman, runc,
# mmdebstrap (the image's base), skopeo (copying images to a registry), uidmap and fuse-overlayfs
# when one is missing, then runs a container of the base image under deploy/podman/containers.conf
# (runc, ulimits within this machine's hard limits). Fails loudly when podman cannot work: the
# image test is never skipped. Idempotent; quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}

missing=()
for tool in podman:podman runc:runc mmdebstrap:mmdebstrap skopeo:skopeo newuidmap:uidmap fuse-overlayfs:fuse-overlayfs; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  if ! command -v apt-get >/dev/null; then
    echo "ensure-podman: ${missing[*]} missing and no apt-get here: install podman, runc and mmdebstrap" >&2
    exit 1
  fi
  echo "ensure-podman: installing Debian's ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  ($SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1) ||
    ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null)
fi

# The fleet's containers need these limits; a hard limit below them would fail every `podman run`.
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt 20000 ]; then
  echo "ensure-podman: the hard open-files limit is $hard; deploy/podman/containers.conf asks for 20000" >&2
  exit 1
fi

# A container that runs and exits is the proof (no shell in the image: the dynamic loader is the program).
base=$(scripts/image-base.sh)
if ! out=$(podman run --rm --network host --read-only "$base" /lib64/ld-linux-x86-64.so.2 --version 2>&1); then
  echo "ensure-podman: podman cannot run a container here (CONTAINERS_CONF=$CONTAINERS_CONF):" >&2
  echo "$out" >&2
  exit 1
fi
echo "ensure-podman: podman $(podman version --format '{{.Client.Version}}') runs containers ($base)"
