#!/usr/bin/env python3
"""A CycloneDX 1.5 SBOM (JSON, on stdout) of one of the fleet's images, from what is in it:

- the Debian packages, from the image's /var/lib/dpkg/status.d (scripts/image-base.sh writes them;
  /var/lib/dpkg/status is read too, for an image built on debian:bookworm-slim);
- the binaries in /usr/local/bin, with their SHA-256;
- the crates each binary links, from `cargo tree` (the normal dependencies of the binaries'
  packages for this host's target, as Cargo.lock resolves them), with Cargo.lock's checksums.

The image is read through `podman image mount` (root). Standard library only.

    python3 scripts/image-sbom.py --image localhost/agent-fleet:0.1.0 \\
        --cargo-packages fleet-dispatcher,fleet-worker,fleetctl > agent-fleet_0.1.0.cdx.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The binary each workspace package builds into the image.
BINARIES = {"fleet-dispatcher": "dispatcher", "fleet-worker": "worker", "fleetctl": "fleetctl"}


def run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def paragraphs(text: str) -> list[dict[str, str]]:
    """Debian control paragraphs (continuation lines folded into their field)."""
    out, fields, last = [], {}, None
    for line in text.splitlines() + [""]:
        if not line.strip():
            if fields:
                out.append(fields)
            fields, last = {}, None
        elif line[0] in " \t" and last:
            fields[last] += "\n" + line.strip()
        elif ":" in line:
            last, value = line.split(":", 1)
            fields[last] = value.strip()
    return out


def debian_packages(root: Path) -> list[dict]:
    records = []
    status_d = root / "var/lib/dpkg/status.d"
    for path in sorted(status_d.iterdir()) if status_d.is_dir() else []:
        records += paragraphs(path.read_text())
    status = root / "var/lib/dpkg/status"
    if status.is_file():
        records += [p for p in paragraphs(status.read_text()) if p.get("Status", "").endswith(" installed")]
    release = {}
    os_release = root / "etc/os-release"
    if os_release.is_file():
        for line in os_release.read_text().splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                release[key] = value.strip('"')
    distro = f"debian-{release.get('VERSION_ID', '')}".rstrip("-")
    components = []
    for p in sorted(records, key=lambda p: p["Package"]):
        arch = p.get("Architecture", "all")
        purl = f"pkg:deb/debian/{p['Package']}@{p['Version']}?arch={arch}&distro={distro}"
        source = p.get("Source", p["Package"]).split(" ")[0]
        components.append({
            "type": "library",
            "bom-ref": purl,
            "name": p["Package"],
            "version": p["Version"],
            "purl": purl,
            "description": p.get("Description", "").split("\n")[0],
            "properties": [
                {"name": "debian:source", "value": source},
                {"name": "debian:copyright", "value": f"/usr/share/doc/{p['Package']}/copyright"},
            ],
        })
    return components


def crates(packages: list[str]) -> tuple[list[dict], list[dict], dict[str, str]]:
    """Components and dependency edges of the crates `packages` link, and each package's bom-ref.

    `cargo tree` resolves features for these packages alone, as `cargo build -p …` does (cargo
    metadata's resolve is the whole workspace's, test-only features included)."""
    host = next(line.split()[1] for line in run("rustc", "-vV").splitlines() if line.startswith("host:"))
    args = ["cargo", "tree", "--locked", "--manifest-path", str(REPO / "Cargo.toml"), "-e", "normal",
            "--target", host, "--prefix", "depth", "--format", "{p}|{l}"]
    for package in packages:
        args += ["-p", package]
    lock = tomllib.loads((REPO / "Cargo.lock").read_text())
    checksums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}
    components: dict[str, dict] = {}
    edges: dict[str, set[str]] = {}
    roots: dict[str, str] = {}
    stack: list[str] = []  # the refs of the current line's ancestors, by depth
    for line in run(*args).splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip("0123456789"))
        level, rest = int(line[:depth]), line[depth:]
        package, license_ = rest.removesuffix(" (*)").split("|", 1)
        words = package.split(" ")
        name, version = words[0], words[1].lstrip("v")
        local = any(w.startswith("(/") for w in words[2:])  # a workspace member: not on crates.io
        ref = f"crate:{name}@{version}" if local else f"pkg:cargo/{name}@{version}"
        if ref not in components:
            component = {"type": "library", "bom-ref": ref, "name": name, "version": version}
            if not local:
                component["purl"] = ref
            if license_:
                component["licenses"] = [{"expression": license_}]
            if checksums.get((name, version)):
                component["hashes"] = [{"alg": "SHA-256", "content": checksums[(name, version)]}]
            components[ref] = component
            edges[ref] = set()
        del stack[level:]
        if level == 0:
            roots[name] = ref
        else:
            edges[stack[-1]].add(ref)
        stack.append(ref)
    dependencies = [{"ref": ref, "dependsOn": sorted(deps)} for ref, deps in sorted(edges.items())]
    return sorted(components.values(), key=lambda c: c["bom-ref"]), dependencies, roots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--cargo-packages", required=True, help="comma-separated workspace packages")
    args = parser.parse_args()

    inspect = json.loads(run("podman", "image", "inspect", args.image))[0]
    labels = inspect.get("Labels") or {}
    root = Path(run("podman", "image", "mount", args.image).strip())
    try:
        debs = debian_packages(root)
        packages = args.cargo_packages.split(",")
        crate_components, crate_dependencies, package_refs = crates(packages)
        binaries = []
        for package in packages:
            path = root / "usr/local/bin" / BINARIES[package]
            binaries.append({
                "type": "application",
                "bom-ref": f"file:/usr/local/bin/{BINARIES[package]}",
                "name": BINARIES[package],
                "version": labels.get("org.opencontainers.image.version", ""),
                "hashes": [{"alg": "SHA-256", "content": hashlib.sha256(path.read_bytes()).hexdigest()}],
                "properties": [{"name": "cargo:package", "value": package}],
            })
    finally:
        subprocess.run(["podman", "image", "unmount", args.image], capture_output=True)

    image_ref = "image"
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": labels.get("org.opencontainers.image.created") or inspect["Created"],
            "tools": {"components": [{"type": "application", "name": "agent-fleet scripts/image-sbom.py"}]},
            "component": {
                "type": "container",
                "bom-ref": image_ref,
                "name": args.image.rsplit(":", 1)[0],
                "version": labels.get("org.opencontainers.image.version", ""),
                "properties": [{"name": "oci:image:id", "value": f"sha256:{inspect['Id']}"},
                               {"name": "oci:image:tag", "value": args.image}]
                + [{"name": k, "value": v} for k, v in sorted(labels.items())
                   if k.startswith("org.opencontainers.image.")],
            },
        },
        "components": debs + binaries + crate_components,
        "dependencies": [{"ref": image_ref, "dependsOn": [c["bom-ref"] for c in debs + binaries]}]
        + [{"ref": b["bom-ref"], "dependsOn": [package_refs[p]]} for b, p in zip(binaries, packages)]
        + crate_dependencies,
    }
    json.dump(bom, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
