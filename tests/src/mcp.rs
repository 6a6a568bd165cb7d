//! MCP test servers on the official SDKs (`tests/mcp/`), started on loopback for one test: the
//! Python SDK's (`tests/mcp/python/server.py`, several kinds) and the TypeScript SDK's
//! (`tests/mcp/ts/server.cjs`). Each prints `listening <url>` once it listens; `GET /stats` says
//! how many `initialize`, `tools/list` and `tools/call` requests it was sent. What they need lives
//! in a cache directory that `scripts/ensure-mcp.sh` fills.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Where `scripts/ensure-mcp.sh` installed the MCP SDKs.
pub fn mcp_dir() -> PathBuf {
    let dir = std::env::var_os("FLEET_MCP_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/fleet-mcp"));
    for needed in ["node_modules/@modelcontextprotocol/sdk/package.json", "venv/bin/python"] {
        assert!(
            dir.join(needed).exists(),
            "{} is missing: run scripts/ensure-mcp.sh (make test does)",
            dir.join(needed).display()
        );
    }
    dir
}

fn script(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/mcp")).join(path)
}

/// A running test server, ended when dropped.
pub struct McpTestServer {
    pub url: String,
    child: Child,
}

impl McpTestServer {
    /// The Python SDK's server of `kind` (`tools`, `paged`, `repeat-cursor`, `bad-schema`), with
    /// more arguments (`--tools N`, `--page-size N`, `--token T`).
    pub async fn python(kind: &str, args: &[&str]) -> Self {
        let mut cmd = Command::new(mcp_dir().join("venv/bin/python"));
        cmd.arg("-u").arg(script("python/server.py")).args(["--kind", kind]).args(args);
        Self::start(cmd).await
    }

    /// The TypeScript SDK's server (`multiply`, `fail`, `explode`).
    pub async fn typescript() -> Self {
        let mut cmd = Command::new("node");
        cmd.arg(script("ts/server.cjs")).env("NODE_PATH", mcp_dir().join("node_modules"));
        Self::start(cmd).await
    }

    async fn start(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
        let mut child = cmd.spawn().expect("the MCP test server starts");
        let stdout = child.stdout.take().expect("its stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the MCP test server listens within 30 s")
            .expect("its stdout reads")
            .expect("it printed its URL");
        let url = line.strip_prefix("listening ").unwrap_or_else(|| panic!("not its URL: {line}")).to_string();
        McpTestServer { url, child }
    }

    /// How many requests of `method` the server was sent (`initialize`, `tools/list`, `tools/call`).
    pub async fn count(&self, method: &str) -> u64 {
        let stats = self.url.replace("/mcp", "/stats");
        let body: Value = reqwest::get(&stats).await.expect("/stats answers").json().await.expect("/stats is JSON");
        body[method].as_u64().unwrap_or_else(|| panic!("/stats has no {method}: {body}"))
    }

    /// Waits for the server's process to end (the `drop` tool ends it); its exit code.
    pub async fn exited(&mut self, within: Duration) -> Option<i32> {
        let status = tokio::time::timeout(within, self.child.wait()).await.expect("the server ended in time");
        status.expect("its status").code()
    }
}
