//! The fleet's container image under test: built by `scripts/image.sh` from the debug binaries
//! beside the tests (or `FLEET_TEST_IMAGE`, e.g. `make image`'s), run by podman with the host's
//! network (see `FleetOptions::image`), and what a test checks of a running container: the
//! addresses its process listens on and its user.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Digest;

/// The repository root (the tests crate is one of its members).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// A `podman` command with the project's containers.conf (runc, ulimits within this machine's
/// hard limits) unless `CONTAINERS_CONF` names another. Health checks run when a test asks
/// (`podman healthcheck run`): no systemd timer, which machines without systemd cannot make.
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.env("DISABLE_HC_SYSTEMD", "true");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        cmd.env("CONTAINERS_CONF", repo().join("deploy/podman/containers.conf"));
    }
    cmd
}

const NEEDS_PODMAN: &str = "the image tests need podman; scripts/ensure-podman.sh installs it (make test runs it)";

/// Runs `podman args…` and returns its stdout; panics with its stderr if it fails.
pub fn podman_out(args: &[&str]) -> String {
    let out = podman().args(args).output().unwrap_or_else(|e| panic!("cannot run podman ({e}): {NEEDS_PODMAN}"));
    assert!(out.status.success(), "podman {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The image under test: `FLEET_TEST_IMAGE` as it is, else `scripts/image.sh` run on the debug
/// binaries beside this test (the same Dockerfile stage and base as `make image`, whose binaries
/// are release builds). Its SBOM goes to `<target>/image-test`. Returns the image's name.
pub fn test_image() -> String {
    let image = match std::env::var("FLEET_TEST_IMAGE") {
        Ok(image) => image,
        Err(_) => build_test_image(),
    };
    // A podman that builds but cannot run (crun on hybrid cgroups, ulimits over the hard limit)
    // fails here, saying so, rather than as a fleet that never gets ready.
    let out =
        podman().args(["run", "--rm", "--network", "host", &image, "/usr/local/bin/fleetctl", "--version"]).output();
    let out = out.unwrap_or_else(|e| panic!("cannot run podman ({e}): {NEEDS_PODMAN}"));
    assert!(
        out.status.success(),
        "podman cannot run a container of {image} here (CONTAINERS_CONF={:?}): {}",
        std::env::var_os("CONTAINERS_CONF").unwrap_or_else(|| repo().join("deploy/podman/containers.conf").into()),
        String::from_utf8_lossy(&out.stderr)
    );
    image
}

fn build_test_image() -> String {
    let dispatcher = crate::binaries::binary("dispatcher");
    let bin_dir = dispatcher.parent().expect("binary directory");
    // One tag per target directory, so checkouts building side by side do not swap images.
    let digest = sha2::Sha256::digest(bin_dir.as_os_str().as_encoded_bytes());
    let tag = format!("localhost/agent-fleet-test:{}", &hex::encode(digest)[..12]);
    let out = bin_dir.parent().expect("target directory").join("image-test");
    let status = Command::new(repo().join("scripts/image.sh"))
        .arg("--bin-dir")
        .arg(bin_dir)
        .args(["--tag", &tag, "--out"])
        .arg(&out)
        .status()
        .expect("run scripts/image.sh");
    assert!(status.success(), "scripts/image.sh failed (its output is above): {NEEDS_PODMAN}");
    tag
}

/// `podman run` of `bin` from `image` as a container named `name`: attached (the command's exit
/// status is the process's), on the host's network, with what the chart's securityContext gives a
/// pod: a read-only root filesystem with a tmpfs on /tmp, no capabilities, no privilege escalation,
/// the image's non-root user.
pub fn run_command(image: &str, name: &str, bin: &str, env: &BTreeMap<String, String>) -> Command {
    let mut cmd = podman();
    cmd.args(["run", "--rm", "--name", name, "--network", "host"])
        .args(["--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=64m,mode=1777"])
        .args(["--cap-drop", "all", "--security-opt", "no-new-privileges"]);
    for (key, value) in env {
        cmd.arg("--env").arg(format!("{key}={value}"));
    }
    cmd.arg(image).arg(format!("/usr/local/bin/{bin}"));
    cmd
}

/// Removes these containers, running or not (a test's cleanup).
pub fn remove(names: &[String]) {
    if !names.is_empty() {
        let _ = podman().args(["rm", "--force", "--time", "0", "--ignore"]).args(names).output();
    }
}

/// Removes every container whose name starts with `prefix` (`Fleet::container_prefix`): the
/// cleanup of a test stopped by a signal, when no `Drop` runs.
pub fn remove_all(prefix: &str) {
    let filter = format!("name=^{prefix}");
    let Ok(out) = podman().args(["ps", "--all", "--format", "{{.Names}}", "--filter", &filter]).output() else {
        return;
    };
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    remove(&names);
}

/// The host process id of a running container's process.
pub fn pid(name: &str) -> u32 {
    podman_out(&["inspect", "--format", "{{.State.Pid}}", name]).parse().expect("a process id")
}

/// The TCP addresses process `pid` listens on, read from /proc: its socket inodes matched
/// against the listening sockets of its network namespace.
pub fn listening(pid: u32) -> Vec<SocketAddr> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the process's descriptors")
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut addrs = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if fields.len() > 9 && fields[3] == "0A" && inodes.iter().any(|i| i == fields[9]) {
                addrs.push(proc_net_addr(fields[1]));
            }
        }
    }
    addrs
}

/// An address as /proc/net/tcp{,6} writes it: the IP as 32-bit words in host (little-endian)
/// order, then the port, all in hex.
fn proc_net_addr(field: &str) -> SocketAddr {
    let (ip, port) = field.split_once(':').expect("ip:port");
    let port = u16::from_str_radix(port, 16).unwrap();
    let words: Vec<u32> = (0..ip.len() / 8).map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).unwrap()).collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap())),
    };
    SocketAddr::new(ip, port)
}

/// The real user id of process `pid`.
pub fn uid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process's status");
    let line = status.lines().find(|l| l.starts_with("Uid:")).expect("a Uid line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_addresses_decode() {
        assert_eq!(proc_net_addr("0100007F:1F90"), "127.0.0.1:8080".parse().unwrap());
        assert_eq!(proc_net_addr("00000000:2382"), "0.0.0.0:9090".parse().unwrap());
        assert_eq!(proc_net_addr("00000000000000000000000001000000:0050"), "[::1]:80".parse().unwrap());
        assert_eq!(proc_net_addr("00000000000000000000000000000000:0050"), "[::]:80".parse().unwrap());
    }

    #[test]
    fn this_process_s_listener_is_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(listening(std::process::id()).contains(&addr), "{addr} among {:?}", listening(std::process::id()));
    }
}
