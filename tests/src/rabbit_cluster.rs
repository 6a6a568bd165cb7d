//! A throw-away 3-node RabbitMQ cluster of one test, started and driven through
//! `scripts/rabbitmq-cluster.sh` (so the test and the operator use one recipe): its own node names,
//! ports, directories and cookie, ended (every node, and node 3's network namespace) when dropped.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::free_port;

pub struct RabbitCluster {
    dir: PathBuf,
    /// The AMQP URLs of nodes 1, 2, 3.
    pub urls: Vec<String>,
    /// The nodes' name prefix: node N is `{name}-N@host`.
    pub name: String,
}

/// What the cluster's script said when it failed.
#[derive(Debug, thiserror::Error)]
#[error("scripts/rabbitmq-cluster.sh {command}: {status}: {stderr}")]
pub struct ScriptError {
    command: String,
    status: std::process::ExitStatus,
    stderr: String,
}

fn script_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/rabbitmq-cluster.sh")
}

impl RabbitCluster {
    /// Starts the cluster and waits until its three nodes run as one. With `netns`, node 3 lives
    /// in a network namespace of its own (see `partition`). A start that fails is tried again on
    /// fresh ports (at most three times): the ports are free when picked, not reserved, and an
    /// Erlang node that meets a port taken meanwhile dies at boot, which is not what a test is about.
    pub async fn start(netns: bool) -> Self {
        let mut failures = vec![];
        for _ in 0..3 {
            match Self::try_start(netns).await {
                Ok(cluster) => return cluster,
                Err(failure) => {
                    eprintln!("rabbit cluster: a start failed, trying again on fresh ports:\n{failure}");
                    failures.push(failure);
                }
            }
        }
        panic!("the cluster did not start three times:\n{}", failures.join("\n"));
    }

    /// One start; on failure, the script's error and the end of each node's log (the cluster is
    /// stopped and its directory removed).
    async fn try_start(netns: bool) -> Result<Self, String> {
        let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let dir = std::env::temp_dir().join(format!("fleet-test-rabbit-cluster-{tag}"));
        let name = format!("fleet-c{tag}");
        let amqp: Vec<String> = (0..3).map(|_| free_port().to_string()).collect();
        let dist: Vec<String> = (0..3).map(|_| free_port().to_string()).collect();
        let cluster = RabbitCluster { dir, urls: vec![], name: name.clone() };
        let stop = cluster.command(&["stop"]);
        crate::on_sigterm(move || {
            let mut stop = stop;
            let _ = stop.stdout(Stdio::null()).status();
        });
        let mut start = cluster.command(&["start"]);
        start
            .env("FLEET_CLUSTER_NAME", &name)
            .env("FLEET_CLUSTER_AMQP_PORTS", amqp.join(","))
            .env("FLEET_CLUSTER_DIST_PORTS", dist.join(","));
        if netns {
            start.env("FLEET_CLUSTER_NETNS", "1").env("FLEET_CLUSTER_EPMD_PORT", free_port().to_string());
        }
        let out = tokio::task::spawn_blocking(move || start.output()).await.unwrap().expect("bash");
        // From here on the guard owns whatever the script started, even if it failed half-way.
        let mut cluster = cluster;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(format!("scripts/rabbitmq-cluster.sh start: {stderr}{}", cluster.log_tails(30)));
        }
        let urls = String::from_utf8_lossy(&out.stdout).trim().to_string();
        cluster.urls = urls.split(',').map(str::to_string).collect();
        Ok(cluster)
    }

    /// The last `lines` lines of every node's log files, to say why a node did not start or a
    /// test failed.
    fn log_tails(&self, lines: usize) -> String {
        let mut tails = String::new();
        for node in 1..=3 {
            let Ok(entries) = std::fs::read_dir(self.dir.join(format!("n{node}/log"))) else { continue };
            for path in entries.flatten().map(|e| e.path()) {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                let tail = all[all.len().saturating_sub(lines)..].join("\n");
                tails.push_str(&format!("\n--- {} (last {lines} lines) ---\n{tail}\n", path.display()));
            }
        }
        tails
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(script_path()).args(args).env("FLEET_CLUSTER_DIR", &self.dir).stdin(Stdio::null());
        cmd
    }

    async fn run(&self, args: &[&str]) -> Result<String, ScriptError> {
        let mut cmd = self.command(args);
        let command = args.join(" ");
        let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().expect("bash");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(ScriptError { command, status: out.status, stderr: String::from_utf8_lossy(&out.stderr).into() })
        }
    }

    /// Every node's URL, comma-separated, starting with node `first` (what `FLEET_AMQP_URL` takes:
    /// the fleet connects to the first reachable one).
    pub fn amqp_url_from(&self, first: usize) -> String {
        let mut order: Vec<&String> = self.urls.iter().collect();
        order.rotate_left(first - 1);
        order.into_iter().cloned().collect::<Vec<_>>().join(",")
    }

    /// The node (1-3) leading quorum queue `queue`.
    pub async fn leader(&self, queue: &str) -> Result<usize, ScriptError> {
        let out = self.run(&["leader", queue]).await?;
        Ok(out.parse().expect("the script prints a node number"))
    }

    /// The node leading `queue` once it has one: a queue just declared, or one whose node was
    /// lost, may still be electing (the script then says "no leader (yet)"), and each CLI call
    /// can time out on a busy machine.
    pub async fn settled_leader(&self, queue: &str) -> usize {
        crate::wait_for(&format!("a leader of {queue}"), Duration::from_secs(60), || async {
            self.leader(queue).await.ok()
        })
        .await
    }

    /// The replicas of `queue` once there are `count` of them (a CLI call may fail meanwhile).
    pub async fn settled_members(&self, queue: &str, count: usize) -> Vec<String> {
        let what = format!("{count} replicas of {queue}");
        crate::wait_for(&what, Duration::from_secs(60), || async {
            self.members(queue).await.ok().filter(|m| m.len() == count)
        })
        .await
    }

    /// The nodes holding a replica of `queue`.
    pub async fn members(&self, queue: &str) -> Result<Vec<String>, ScriptError> {
        Ok(self.run(&["members", queue]).await?.lines().map(str::to_string).collect())
    }

    pub async fn kill_node(&self, node: usize) -> Result<(), ScriptError> {
        self.run(&["kill-node", &node.to_string()]).await.map(drop)
    }

    pub async fn stop_node(&self, node: usize) -> Result<(), ScriptError> {
        self.run(&["stop-node", &node.to_string()]).await.map(drop)
    }

    /// Starts `node` again and waits until it runs (it rejoins by itself).
    pub async fn start_node(&self, node: usize) -> Result<(), ScriptError> {
        self.run(&["start-node", &node.to_string()]).await.map(drop)
    }

    /// Waits until stopping `node` would leave every quorum queue a majority (its replicas caught up).
    pub async fn wait_synced(&self, node: usize) -> Result<(), ScriptError> {
        self.run(&["wait-synced", &node.to_string()]).await.map(drop)
    }

    /// Suspends `node`'s replica of quorum queue `queue` (`sys:suspend` of its Ra server): the node
    /// still serves clients, but a leader that needs its vote cannot be elected.
    pub async fn suspend_member(&self, node: usize, queue: &str) -> Result<(), ScriptError> {
        self.run(&["suspend-member", &node.to_string(), queue]).await.map(drop)
    }

    pub async fn resume_member(&self, node: usize, queue: &str) -> Result<(), ScriptError> {
        self.run(&["resume-member", &node.to_string(), queue]).await.map(drop)
    }

    /// Cuts node 3 off (its veth link down); only for a cluster started with `netns`.
    pub async fn partition(&self, node: usize) -> Result<(), ScriptError> {
        self.run(&["partition", &node.to_string()]).await.map(drop)
    }

    pub async fn heal(&self, node: usize) -> Result<(), ScriptError> {
        self.run(&["heal", &node.to_string()]).await.map(drop)
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the cluster's logs at the failure:{}", self.log_tails(40));
        }
        // Also after a panic: every node ends (SIGKILL after 30 s), the namespace goes, the
        // directory is removed.
        let _ = self.command(&["stop"]).stdout(Stdio::null()).status();
    }
}
