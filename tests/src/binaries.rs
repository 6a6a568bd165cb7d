//! Where the workspace's binaries are: built beside the test binaries, in the same target
//! directory.

use std::path::PathBuf;

/// The path of one of the workspace's binaries (`dispatcher`, `worker`), built beside the tests.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| if d.ends_with("deps") { d.parent() } else { Some(d) }).expect("target dir");
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing: build the binaries first (cargo build --workspace --bins)", path.display());
    path
}
