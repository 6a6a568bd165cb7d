//! A Redis Cluster of one test's own with a replica per master (3 masters, 3 replicas, each node on
//! its own ports and directory), so a master can be killed and its replica promoted without
//! touching the shared cluster on 7000-7002. Every node is killed when the guard drops.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_for};

pub struct ReplicatedRedisCluster {
    /// Client ports, masters first (`redis-cli --cluster create` makes the first three masters).
    pub ports: Vec<u16>,
    children: Vec<Option<Child>>,
    dir: PathBuf,
}

/// One `CLUSTER NODES` line, as far as the test needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    pub master: bool,
    pub failed: bool,
    /// A replica's master id.
    pub master_id: Option<String>,
}

/// Parses `CLUSTER NODES`: `id ip:port@bus flags master-id ping pong epoch link slots…`.
pub fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = f.get(1)?.split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f.get(2)?.split(',').collect();
            Some(ClusterNode {
                id: f[0].to_string(),
                port,
                master: flags.contains(&"master"),
                failed: flags.iter().any(|x| *x == "fail" || *x == "fail?"),
                master_id: f.get(3).filter(|m| **m != "-").map(|m| m.to_string()),
            })
        })
        .collect()
}

/// Starts one cluster node in `dir` and waits until it answers. A node that cannot bind its
/// ports (taken since they were drawn: another process, or a port drawn twice) exits at once; it
/// is started again on new ones, a few times, and its log is shown if it never answers.
async fn start_node(dir: &std::path::Path, node_timeout: Duration) -> (u16, Child) {
    let log = dir.join("redis.log");
    for _ in 0..3 {
        let port = free_port();
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-port", &free_port().to_string()])
            .args(["--cluster-node-timeout", &node_timeout.as_millis().to_string()])
            .args(["--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            // Named so a sweep after a killed run can end exactly these processes.
            .arg("--pidfile")
            .arg(dir.join("redis.pid"))
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while std::time::Instant::now() < deadline {
            if query::<String>(port, &redis::cmd("PING")).await.as_deref() == Some("PONG") {
                return (port, child);
            }
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    panic!("a failover-cluster node did not start in three tries; its log:\n{log}");
}

impl ReplicatedRedisCluster {
    /// Starts six nodes with `node_timeout` (how long a master may be silent before its replica
    /// takes over), creates the cluster and waits until it is `ok` with every replica in sync.
    pub async fn start(node_timeout: Duration) -> Self {
        let dir = std::env::temp_dir().join(format!("fleet-test-redis-failover-{}", uuid::Uuid::new_v4().simple()));
        let mut cluster = ReplicatedRedisCluster { ports: vec![], children: vec![], dir };
        for n in 0..6 {
            let node_dir = cluster.dir.join(format!("node{n}"));
            std::fs::create_dir_all(&node_dir).unwrap();
            let (port, child) = start_node(&node_dir, node_timeout).await;
            cluster.ports.push(port);
            cluster.children.push(Some(child));
        }
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for port in &cluster.ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        create.args(["--cluster-replicas", "1", "--cluster-yes"]).stdin(Stdio::null());
        let out = tokio::task::spawn_blocking(move || create.output()).await.unwrap().expect("redis-cli on PATH");
        assert!(out.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&out.stdout));
        let pids: Vec<i32> = cluster.children.iter().flatten().map(|c| c.id() as i32).collect();
        crate::on_sigterm(move || {
            for pid in pids {
                // SAFETY: kill(2) on a redis-server this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        });
        cluster.wait_healthy(Duration::from_secs(60)).await;
        cluster
    }

    /// Waits until every running node says `cluster_state:ok` and knows 3 masters with a replica
    /// each... or, after a failover, 3 masters serving every slot.
    pub async fn wait_healthy(&self, timeout: Duration) {
        for port in self.running_ports() {
            wait_for("the failover cluster's state to be ok", timeout, || async move {
                let info: String = query(port, redis::cmd("CLUSTER").arg("INFO")).await?;
                info.contains("cluster_state:ok").then_some(())
            })
            .await;
        }
    }

    /// Waits until every replica's link to its master is up (so a write a master took is copied).
    pub async fn wait_replicas_in_sync(&self, timeout: Duration) {
        for port in self.running_ports() {
            wait_for("replicas in sync", timeout, || async move {
                let info: String = query(port, redis::cmd("INFO").arg("replication")).await?;
                (info.contains("role:master") || info.contains("master_link_status:up")).then_some(())
            })
            .await;
        }
    }

    fn running_ports(&self) -> Vec<u16> {
        self.ports.iter().zip(&self.children).filter(|(_, c)| c.is_some()).map(|(p, _)| *p).collect()
    }

    /// The cluster as node `port` sees it.
    pub async fn nodes(&self, port: u16) -> Option<Vec<ClusterNode>> {
        let text: String = query(port, redis::cmd("CLUSTER").arg("NODES")).await?;
        Some(parse_cluster_nodes(&text))
    }

    /// Every node's URL, comma-separated (what `FLEET_REDIS_URL` takes for a cluster).
    pub fn url(&self) -> String {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// SIGKILLs the node on `port` (a crash: no failover handshake, no last replication).
    pub fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).expect("a node of this cluster");
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ReplicatedRedisCluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One command to one node (not cluster-aware); `None` on any failure.
pub async fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let connect = client.get_multiplexed_async_connection();
    let mut con = tokio::time::timeout(Duration::from_secs(2), connect).await.ok()?.ok()?;
    tokio::time::timeout(Duration::from_secs(2), cmd.query_async(&mut con)).await.ok()?.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_give_roles_ports_and_failures() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master,fail? - 0 0 1 connected 0-5460
";
        let nodes = parse_cluster_nodes(text);
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].port, 30004);
        assert!(!nodes[0].master);
        assert_eq!(nodes[0].master_id.as_deref(), Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca"));
        assert!(nodes[1].master && !nodes[1].failed && nodes[1].master_id.is_none());
        assert!(nodes[2].master && nodes[2].failed);
    }
}
