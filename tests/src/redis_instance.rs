//! A Redis server of one test's own (its own port and directory, append-only so data survives a
//! restart), for faults that must not touch the shared Redis: restarts, outages, eviction policies.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_for};

pub struct RedisInstance {
    pub port: u16,
    dir: std::path::PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl RedisInstance {
    /// Starts `redis-server` with `extra` arguments and waits until it answers.
    pub async fn start(extra: &[&str]) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("fleet-test-redis-{port}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = RedisInstance { port, dir, args: extra.iter().map(|s| s.to_string()).collect(), child: None };
        r.spawn().await;
        r
    }

    /// With `--requirepass` among its arguments, the URL carries that password.
    pub fn url(&self) -> String {
        match self.args.iter().position(|a| a == "--requirepass").and_then(|i| self.args.get(i + 1)) {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}/0", self.port),
            None => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        self.child = Some(child);
        let url = self.url();
        wait_for("the test's redis-server", Duration::from_secs(10), || {
            let url = url.clone();
            async move {
                let client = redis::Client::open(url).ok()?;
                let mut con = client.get_multiplexed_async_connection().await.ok()?;
                let pong: String = redis::cmd("PING").query_async(&mut con).await.ok()?;
                (pong == "PONG").then_some(())
            }
        })
        .await;
    }

    /// Kills the server (SIGKILL: a crash, not a clean shutdown).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory (its append-only file restores the data).
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

impl Drop for RedisInstance {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
