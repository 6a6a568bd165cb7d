//! Running the seeds' own client examples (`tests/seeds/000/`: bash with curl and jq, Node.js,
//! Python) against a fleet, as processes of their own, with the fleet's base URL (`…/v1`) and
//! token in their environment. What they need beyond the machine's `bash`, `curl`, `jq`, `node` and
//! `python3` (the npm package `eventsource` 2.x, Flask) lives in a cache directory
//! that `scripts/ensure-seed-clients.sh` fills.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::Fleet;

/// Where `scripts/ensure-seed-clients.sh` installed the seed clients' packages.
pub fn clients_dir() -> PathBuf {
    let dir = std::env::var_os("FLEET_SEED_CLIENTS_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/fleet-seed-clients")
    });
    for needed in ["node_modules/eventsource/package.json", "venv/bin/python"] {
        assert!(
            dir.join(needed).exists(),
            "{} is missing: run scripts/ensure-seed-clients.sh (make test does)",
            dir.join(needed).display()
        );
    }
    dir
}

/// A script of seed 000's examples (`tests/seeds/000/NAME`).
pub fn script(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/seeds/000")).join(name)
}

/// The environment every seed script reads: `BASE` (the fleet's `…/v1`, where the seed writes
/// `https://core.interactor.com/api/v1`) and `TOKEN`.
pub fn base_env(fleet: &Fleet) -> Vec<(String, String)> {
    vec![("BASE".into(), format!("{}/v1", fleet.api)), ("TOKEN".into(), fleet.token.clone())]
}

/// `bash SCRIPT` with `env`.
pub fn bash(name: &str, env: &[(String, String)]) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(script(name)).envs(env.iter().cloned());
    cmd
}

/// `node SCRIPT` with `env`: the script runs from a directory of its own beside the installed
/// `node_modules`, so its `import … from 'eventsource'` finds the package.
pub fn node(name: &str, env: &[(String, String)]) -> Command {
    let packages = clients_dir().join("node_modules");
    let dir = std::env::temp_dir().join(format!("fleet-seed-node-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&packages, dir.join("node_modules")).unwrap();
    let copy = dir.join(name);
    std::fs::copy(script(name), &copy).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(copy).envs(env.iter().cloned());
    cmd
}

/// The seed clients' Python (a venv with Flask) running SCRIPT with `env`.
pub fn python(name: &str, env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(clients_dir().join("venv/bin/python"));
    cmd.arg("-u").arg(script(name)).envs(env.iter().cloned());
    cmd
}

/// Runs a command to its end (at most `timeout`): (exit code, stdout, stderr).
pub async fn output(mut cmd: Command, timeout: Duration) -> (i32, String, String) {
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output()).await.expect("the script ended in time").expect("it runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A script still running: its standard output read line by line, its input writable; killed on drop.
pub struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Running {
    pub fn start(mut cmd: Command) -> Running {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
        let mut child = cmd.spawn().expect("the script starts");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Running { child, lines, seen: vec![] }
    }

    /// Reads lines until one satisfies `done` (returned); panics on the end of output or after
    /// `timeout`, showing what was read.
    pub async fn until(&mut self, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    self.seen.push(line.clone());
                    if done(&line) {
                        return line;
                    }
                }
                Ok(other) => panic!("the script's output ended ({other:?}) after {:#?}", self.seen),
                Err(_) => panic!("no matching line within {timeout:?} after {:#?}", self.seen),
            }
        }
    }

    /// Every line until the output ends (the script exits), at most `timeout`; its exit code.
    pub async fn to_end(&mut self, timeout: Duration) -> i32 {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => self.seen.push(line),
                Ok(_) => break,
                Err(_) => panic!("the script did not end within {timeout:?} after {:#?}", self.seen),
            }
        }
        let status = tokio::time::timeout_at(deadline, self.child.wait()).await.expect("it exits").unwrap();
        status.code().unwrap_or(-1)
    }

    /// Writes a line to the script's standard input.
    pub async fn send_line(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin is piped");
        stdin.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Ends the script (one that would run on, like a stream reader).
    pub async fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill().await;
        self.seen
    }
}

/// A step's printed answer: its title, its body as JSON (`Null` when empty) and its status.
#[derive(Debug)]
pub struct StepAnswer {
    pub title: String,
    pub body: Value,
    pub status: u16,
}

/// The answers a seed script printed (`## title`, the body, `=> STATUS`), in order.
pub fn steps(lines: &[String]) -> Vec<StepAnswer> {
    let mut steps = Vec::new();
    let mut title = None;
    let mut body = String::new();
    for line in lines {
        if let Some(t) = line.strip_prefix("## ") {
            title = Some(t.to_string());
            body.clear();
        } else if let Some(status) = line.strip_prefix("=> ") {
            let body_json = if body.trim().is_empty() { Value::Null } else { serde_json::from_str(&body).unwrap() };
            steps.push(StepAnswer {
                title: title.take().expect("a step"),
                body: body_json,
                status: status.parse().unwrap(),
            });
            body.clear();
        } else {
            body.push_str(line);
        }
    }
    steps
}

/// The seed's `customers` and `orders` (PostgreSQL), in the current schema: two customers who
/// signed up in January 2026 with an order each, one from 2025.
pub const PG_SEED_TABLES: &str = "
    CREATE TABLE customers (id uuid PRIMARY KEY, email varchar(255) NOT NULL, name varchar(255),
                            created_at timestamp NOT NULL);
    CREATE TABLE orders (id uuid PRIMARY KEY, customer_id uuid NOT NULL REFERENCES customers (id),
                         total_amount numeric(12, 2) NOT NULL, created_at timestamp NOT NULL);
    INSERT INTO customers VALUES
      ('11111111-1111-1111-1111-111111111111', 'john@example.com', 'John Doe', '2026-01-15 10:00:00'),
      ('22222222-2222-2222-2222-222222222222', 'jane@example.com', 'Jane Smith', '2026-01-16 11:00:00'),
      ('33333333-3333-3333-3333-333333333333', 'old@example.com', NULL, '2025-06-01 09:30:00');
    INSERT INTO orders VALUES
      ('aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa', '11111111-1111-1111-1111-111111111111', 19.99, '2026-01-15 10:05:00'),
      ('bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb', '22222222-2222-2222-2222-222222222222', 1200.50, '2026-01-16 11:30:00');";

/// The same tables in MariaDB, one statement each.
pub const MARIA_SEED_TABLES: [&str; 4] = [
    "CREATE TABLE customers (id UUID PRIMARY KEY, email VARCHAR(255) NOT NULL, name VARCHAR(255) NULL, \
     created_at DATETIME NOT NULL)",
    "CREATE TABLE orders (id UUID PRIMARY KEY, customer_id UUID NOT NULL, total_amount DECIMAL(12, 2) NOT NULL, \
     created_at DATETIME NOT NULL, FOREIGN KEY (customer_id) REFERENCES customers (id))",
    "INSERT INTO customers VALUES \
     ('11111111-1111-1111-1111-111111111111', 'john@example.com', 'John Doe', '2026-01-15 10:00:00'), \
     ('22222222-2222-2222-2222-222222222222', 'jane@example.com', 'Jane Smith', '2026-01-16 11:00:00'), \
     ('33333333-3333-3333-3333-333333333333', 'old@example.com', NULL, '2025-06-01 09:30:00')",
    "INSERT INTO orders VALUES \
     ('aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa', '11111111-1111-1111-1111-111111111111', 19.99, '2026-01-15 10:05:00'), \
     ('bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb', '22222222-2222-2222-2222-222222222222', 1200.50, '2026-01-16 11:30:00')",
];
