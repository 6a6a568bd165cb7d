#!/usr/bin/env bash
# Builds the fleet's image with podman, without an image registry: deploy/Dockerfile's runtime
# stage on the Debian base from scripts/image-base.sh, with the dispatcher, worker and fleetctl
# binaries built on this host, debug sections stripped (BINARIES=prebuilt: the Dockerfile's rust
# builder stage is skipped).
# Writes a CycloneDX SBOM of the image (Debian packages, binaries, crates) into --out and, with
# --save, the image as a docker-archive beside it.
#
#   scripts/image.sh                                 # target/release -> localhost/agent-fleet:<version>
#   scripts/image.sh --bin-dir target/debug --tag localhost/agent-fleet:test --out target/image-test
#
# `make image` runs it after a release build. The image test (tests/tests/fleet/image.rs) runs it on the
# debug binaries `make test` has already built.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
target=${CARGO_TARGET_DIR:-target}
bin_dir=$target/release
tag=localhost/agent-fleet:$version
out=$target/image
save=0
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --save) save=1; shift ;;
    *) echo "usage: scripts/image.sh [--bin-dir DIR] [--tag NAME:TAG] [--out DIR] [--save]" >&2; exit 2 ;;
  esac
done
started=$(date +%s.%N)
for bin in dispatcher worker fleetctl; do
  [ -x "$bin_dir/$bin" ] || { echo "image: $bin_dir/$bin is missing: build the binaries first" >&2; exit 1; }
done

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || revision="$revision-dirty"
created=$(git log -1 --format=%cI 2>/dev/null || date -u +%FT%TZ)
source=${FLEET_IMAGE_SOURCE:-$(git config --get remote.origin.url 2>/dev/null || true)}

# One build at a time on this machine (make image beside a test run); each waits its turn.
exec 9>"${TMPDIR:-/tmp}/agent-fleet-image.lock"
flock 9

base=$(scripts/image-base.sh)
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir "$context/bin"
# Without their debug sections (the workspace's profiles keep line tables: 150 MB a release
# binary), with their symbols (a backtrace still names functions): 416 MB -> 75 MB for the three.
for bin in dispatcher worker fleetctl; do
  objcopy --strip-debug "$bin_dir/$bin" "$context/bin/$bin"
done

previous=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
# --format docker: the OCI image format has no HEALTHCHECK.
podman build --quiet --pull=never --format docker -f deploy/Dockerfile --target runtime \
  --build-arg BINARIES=prebuilt --build-arg RUNTIME_BASE="$base" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg CREATED="$created" \
  --build-arg SOURCE="$source" \
  -t "$tag" "$context" >/dev/null
id=$(podman image inspect --format '{{.Id}}' "$tag")
# The image this tag named before is garbage now (unless a container still uses it), and so are
# the build's cached stages of older binaries (untagged, no child): ~150 MB a test build otherwise.
if [ -n "$previous" ] && [ "$previous" != "$id" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi
podman image prune --force >/dev/null 2>&1 || true

mkdir -p "$out"
name=$(basename "${tag%%:*}")_${tag##*:}
python3 scripts/image-sbom.py --image "$tag" --cargo-packages fleet-dispatcher,fleet-worker,fleetctl \
  >"$out/$name.cdx.json.new"
mv "$out/$name.cdx.json.new" "$out/$name.cdx.json"
if [ "$save" = 1 ]; then
  rm -f "$out/$name.tar"
  podman save --quiet --format docker-archive -o "$out/$name.tar" "$tag"
fi
size=$(podman image inspect --format '{{.Size}}' "$tag")
awk -v tag="$tag" -v id="${id:0:12}" -v size="$size" -v t0="$started" -v t1="$(date +%s.%N)" \
  'BEGIN { printf "image: %s (%s), %.1f MB, in %.1f s\n", tag, id, size / 1e6, t1 - t0 }'
echo "image: SBOM $out/$name.cdx.json"
[ "$save" = 0 ] || echo "image: archive $out/$name.tar ($(du -m "$out/$name.tar" | cut -f1) MB; docker-archive for podman/docker load, kind and k3s)"
