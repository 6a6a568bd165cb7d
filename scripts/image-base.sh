#!/usr/bin/env bash
# The runtime base of the fleet's image, from Debian's own packages (no image registry needed):
# a root filesystem of libc6, libgcc-s1, ca-certificates, tzdata, netbase and base-files (and
# what they depend on) extracted by mmdebstrap, imported into podman as
# localhost/agent-fleet-base:<key>. Prints that name.
#
# The root filesystem is cached as a tar under ~/.cache/agent-fleet/image-base (XDG_CACHE_HOME),
# keyed by this script's text and the suite, and made afresh after FLEET_IMAGE_BASE_MAX_AGE days
# (default 7) so that Debian's security updates reach the image; FLEET_IMAGE_BASE_REFRESH=1 makes
# it afresh now. If Debian's mirror cannot be reached, an older cached tar is used with a warning.
#
# The `extract` variant only unpacks packages (no maintainer script runs, no shell is installed),
# so the hook below does what their scripts would have: /etc/passwd and /etc/group (root, nobody
# and fleet with uid/gid 10001), nsswitch.conf, the CA bundle, and dpkg's records in
# /var/lib/dpkg/status.d (one file a package, as distroless images have them, which SBOM and
# vulnerability scanners read).
set -euo pipefail

SUITE=${FLEET_IMAGE_SUITE:-bookworm}
PACKAGES=libc6,libgcc-s1,ca-certificates,tzdata,netbase,base-files

if [ "${1:-}" = --hook ]; then
  root=$2
  cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
fleet:x:10001:10001:agent-fleet:/nonexistent:/usr/sbin/nologin
EOF
  cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
fleet:x:10001:
EOF
  printf 'passwd: files\ngroup: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n' \
    >"$root/etc/nsswitch.conf"
  # What update-ca-certificates makes of every certificate the package ships.
  bundle="$root/etc/ssl/certs/ca-certificates.crt"
  : >"$bundle"
  for crt in "$root"/usr/share/ca-certificates/mozilla/*.crt; do
    cat "$crt" >>"$bundle"
    [ -z "$(tail -c1 "$crt")" ] || echo >>"$bundle"
  done
  mkdir -p "$root/var/lib/dpkg/status.d"
  for deb in "$root"/var/cache/apt/archives/*.deb; do
    package=$(dpkg-deb -f "$deb" Package)
    { dpkg-deb -f "$deb"; echo 'Status: install ok installed'; } >"$root/var/lib/dpkg/status.d/$package"
  done
  # Documentation and shell completions are of no use without a shell; copyright files stay.
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  rm -rf "$root"/usr/share/{man,info,lintian,bash-completion,pixmaps}
  chmod 1777 "$root/tmp"
  exit 0
fi

cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}
key=$( (cat "$0"; echo "$SUITE") | sha256sum | cut -c1-12)
image="localhost/agent-fleet-base:$SUITE-$key"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/agent-fleet/image-base"
tar="$cache/$SUITE-$key.tar"
mkdir -p "$cache"
# One extraction at a time (ensure-podman.sh and image.sh of two checkouts may call this at once).
exec 8>"$cache/.lock"
flock 8

fresh() { [ -s "$tar" ] && [ -z "$(find "$tar" -mtime +"${FLEET_IMAGE_BASE_MAX_AGE:-7}")" ]; }

if [ "${FLEET_IMAGE_BASE_REFRESH:-0}" = 1 ] || ! fresh; then
  echo "image-base: extracting Debian $SUITE ($PACKAGES) with mmdebstrap" >&2
  # SOURCE_DATE_EPOCH: the files' times come from this commit, not from the clock.
  if SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)} \
     mmdebstrap --quiet --variant=extract --include="$PACKAGES" --format=tar \
       --extract-hook="\"$PWD/scripts/image-base.sh\" --hook \"\$1\"" \
       "$SUITE" "$tar.new" >&2; then
    mv "$tar.new" "$tar"
    # The new root filesystem takes the tag; the old image stays while images built on it exist.
    podman import --quiet --message "Debian $SUITE: $PACKAGES (mmdebstrap --variant=extract)" "$tar" "$image" >/dev/null
  elif [ -s "$tar" ]; then
    rm -f "$tar.new"
    echo "image-base: mmdebstrap failed; using the cached root filesystem of $(date -r "$tar" +%F)" >&2
  else
    rm -f "$tar.new"
    echo "image-base: mmdebstrap failed and nothing is cached: Debian's mirror must be reachable" >&2
    exit 1
  fi
fi
if ! podman image exists "$image"; then
  podman import --quiet --message "Debian $SUITE: $PACKAGES (mmdebstrap --variant=extract)" "$tar" "$image" >/dev/null
fi
echo "$image"
