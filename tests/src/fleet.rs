//! `spawn_fleet()`: real `dispatcher` and `worker` processes for one test, isolated from every
//! other test by a unique topology prefix and Redis key prefix, torn down (processes, queues and
//! keys) when the `Fleet` drops. With `FleetOptions::image` the processes are containers of the
//! fleet's image instead, with the same environment.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde_json::{json, Value};

use fleet_protocol::envelope::JobKind;
use fleet_protocol::topology::Topology;

use crate::{amqp_url, free_port, redis_url, wait_for};

/// The secrets key every test fleet uses.
pub const TEST_SECRETS_KEY: &str = "6b6579206f6620746865207465737420666c6565742c2033322062797465732e";

#[derive(Clone)]
pub struct FleetOptions {
    pub workers: usize,
    pub dispatcher: bool,
    /// Extra environment for every process (e.g. `FLEET_RETRY_DELAYS`).
    pub env: Vec<(String, String)>,
    /// The broker URL the dispatcher uses (e.g. through a `Proxy`); workers use the real one.
    pub dispatcher_amqp_url: Option<String>,
    /// The broker URL workers use (e.g. another user's); the dispatcher keeps its own.
    pub worker_amqp_url: Option<String>,
    /// Write each process's stderr to a file readable through `Fleet::logs` (else it is inherited).
    pub capture_logs: bool,
    /// Run the dispatcher and workers as containers of this image (podman, the host's network;
    /// see `container::run_command`) instead of host processes.
    pub image: Option<String>,
    /// Leave `FLEET_REDIS_KEY_PREFIX` unset: the fleet's keys take the default prefix (`fleet:`),
    /// as a deployment's do. Only one test may: the prefix is shared.
    pub default_key_prefix: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            workers: 1,
            dispatcher: true,
            env: vec![],
            dispatcher_amqp_url: None,
            worker_amqp_url: None,
            capture_logs: false,
            image: None,
            default_key_prefix: false,
        }
    }
}

impl FleetOptions {
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

struct WorkerProcess {
    child: Child,
    port: u16,
    /// The container it runs in (`FleetOptions::image`).
    container: Option<String>,
}

pub struct Fleet {
    pub id: String,
    pub token: String,
    pub api: String,
    pub topology: Topology,
    pub key_prefix: String,
    pub http: reqwest::Client,
    options: FleetOptions,
    dispatcher: Option<Child>,
    dispatcher_container: Option<String>,
    workers: Vec<Option<WorkerProcess>>,
    /// Every container started, removed when the fleet drops.
    containers: Vec<String>,
}

pub use crate::binaries::binary;

/// Starts a fleet and waits until every process reports ready.
pub async fn spawn_fleet(options: FleetOptions) -> Fleet {
    let id = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let delays = options
        .env
        .iter()
        .find(|(k, _)| k == "FLEET_RETRY_DELAYS")
        .map(|(_, v)| v.split(',').map(|s| Duration::from_secs_f64(s.trim().parse().unwrap())).collect())
        .unwrap_or_else(fleet_protocol::retry::default_delays);
    let port = free_port();
    let mut fleet = Fleet {
        token: format!("test-token-{id}"),
        api: format!("http://127.0.0.1:{port}"),
        topology: Topology::new(format!("fleet-{id}"), delays),
        key_prefix: if options.default_key_prefix {
            fleet_platform::config::DEFAULT_KEY_PREFIX.to_string()
        } else {
            format!("{id}:")
        },
        http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap(),
        id,
        options: options.clone(),
        dispatcher: None,
        dispatcher_container: None,
        workers: vec![],
        containers: vec![],
    };
    if options.dispatcher {
        fleet.start_dispatcher(options.dispatcher_amqp_url.as_deref()).await;
    }
    for _ in 0..options.workers {
        fleet.spawn_worker().await;
    }
    fleet
}

impl Fleet {
    fn log_dir(&self) -> PathBuf {
        std::env::temp_dir().join(format!("fleet-test-logs-{}", self.id))
    }

    /// The directory the fleet's artifact store keeps its files in (`FLEET_ARTIFACTS_URL`): the
    /// fleet's own, under the system's temporary directory.
    pub fn artifacts_dir(&self) -> PathBuf {
        std::env::temp_dir().join(format!("fleet-test-artifacts-{}", self.id))
    }

    /// Everything the fleet's processes wrote to stderr (with `capture_logs`).
    pub fn logs(&self) -> String {
        let mut all = String::new();
        if let Ok(entries) = std::fs::read_dir(self.log_dir()) {
            for entry in entries.flatten() {
                all.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
            }
        }
        all
    }

    /// The names of the containers this fleet runs start with this (see `container::remove_all`).
    pub fn container_prefix(&self) -> String {
        format!("fleet-test-{}-", self.id)
    }

    /// The command that starts `bin` with the fleet's environment, the options' `env` and then
    /// `own` (later settings win); with `FleetOptions::image`, in a container whose name comes
    /// back too.
    fn command(&self, bin: &str, own: &[(&str, String)]) -> (Command, Option<String>) {
        let mut env: BTreeMap<String, String> = [
            ("FLEET_AMQP_URL", amqp_url()),
            ("FLEET_REDIS_URL", redis_url()),
            ("FLEET_TOPOLOGY_PREFIX", self.topology.prefix().to_string()),
            ("FLEET_REDIS_KEY_PREFIX", self.key_prefix.clone()),
            ("FLEET_API_TOKENS", self.token.clone()),
            ("FLEET_SECRETS_KEY", TEST_SECRETS_KEY.to_string()),
            ("FLEET_ALLOW_PRIVATE_CALLBACKS", "true".to_string()),
            ("FLEET_ARTIFACTS_URL", format!("file://{}", self.artifacts_dir().display())),
            ("RUST_LOG", std::env::var("FLEET_TEST_LOG").unwrap_or_else(|_| "warn,fleet_worker=info".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if self.options.default_key_prefix {
            env.remove("FLEET_REDIS_KEY_PREFIX");
        }
        env.extend(self.options.env.iter().cloned());
        env.extend(own.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let (mut cmd, container) = match &self.options.image {
            None => {
                let mut cmd = Command::new(binary(bin));
                cmd.envs(&env);
                (cmd, None)
            }
            Some(image) => {
                let name =
                    format!("{}{bin}-{}", self.container_prefix(), &uuid::Uuid::new_v4().simple().to_string()[..8]);
                (crate::container::run_command(image, &name, bin, &env), Some(name))
            }
        };
        if self.options.capture_logs {
            std::fs::create_dir_all(self.log_dir()).unwrap();
            let path = self.log_dir().join(format!("{bin}-{}.log", uuid::Uuid::new_v4().simple()));
            cmd.stderr(std::fs::File::create(path).unwrap());
        }
        cmd.stdin(Stdio::null());
        (cmd, container)
    }

    async fn wait_ready(&self, url: &str, what: &str) {
        let http = self.http.clone();
        wait_for(&format!("{what} ready at {url}"), Duration::from_secs(30), || {
            let http = http.clone();
            let url = url.to_string();
            async move { http.get(&url).send().await.ok().filter(|r| r.status().is_success()).map(|_| ()) }
        })
        .await;
    }

    /// Sets `key` for processes started from now on (a restart with another configuration).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.options.env.retain(|(k, _)| k != key);
        self.options.env.push((key.to_string(), value.to_string()));
    }

    /// Starts the dispatcher on the fleet's API address (with `amqp_url`, else the real broker)
    /// and waits until it is ready; after `stop_dispatcher`, this is a restart.
    pub async fn start_dispatcher(&mut self, amqp_url: Option<&str>) {
        assert!(self.dispatcher.is_none(), "a dispatcher is already running");
        let mut own = vec![("FLEET_HTTP_ADDR", self.api.trim_start_matches("http://").to_string())];
        own.extend(amqp_url.map(|url| ("FLEET_AMQP_URL", url.to_string())));
        let (mut cmd, container) = self.command("dispatcher", &own);
        self.containers.extend(container.clone());
        self.dispatcher = Some(cmd.spawn().expect("start dispatcher"));
        self.dispatcher_container = container;
        self.wait_ready(&format!("{}/readyz", self.api), "dispatcher").await;
    }

    /// Starts one more worker and waits until it consumes; returns its index.
    pub async fn spawn_worker(&mut self) -> usize {
        let index = self.spawn_worker_alive().await;
        let port = self.worker_port(index);
        self.wait_ready(&format!("http://127.0.0.1:{port}/readyz"), "worker").await;
        index
    }

    /// Starts one more worker and waits only until its HTTP surface answers (it may not consume).
    pub async fn spawn_worker_alive(&mut self) -> usize {
        let port = free_port();
        let mut own = vec![("FLEET_WORKER_HTTP_ADDR", format!("127.0.0.1:{port}"))];
        own.extend(self.options.worker_amqp_url.clone().map(|url| ("FLEET_AMQP_URL", url)));
        let (mut cmd, container) = self.command("worker", &own);
        self.containers.extend(container.clone());
        let child = cmd.spawn().expect("start worker");
        self.workers.push(Some(WorkerProcess { child, port, container }));
        let url = format!("http://127.0.0.1:{port}/metrics");
        self.wait_ready(&url, "worker HTTP").await;
        self.workers.len() - 1
    }

    /// GET on a worker's HTTP surface: status and body.
    pub async fn worker_get(&self, index: usize, path: &str) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}{path}", self.worker_port(index));
        let resp = self.http.get(url).send().await.unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap_or_default())
    }

    /// Sends `signal` to the dispatcher and waits for its exit code.
    pub async fn stop_dispatcher(&mut self, signal: i32, timeout: Duration) -> Option<i32> {
        match &self.dispatcher_container {
            Some(name) => signal_container(name, signal),
            // SAFETY: kill(2) on a child process id this test owns.
            None => {
                assert_eq!(unsafe { libc::kill(self.dispatcher_pid().expect("dispatcher running") as i32, signal) }, 0)
            }
        }
        let child = self.dispatcher.as_mut().expect("dispatcher running");
        let status = wait_for("dispatcher exit", timeout, || {
            let s = child.try_wait().ok().flatten();
            async move { s }
        })
        .await;
        self.dispatcher = None;
        self.dispatcher_container = None;
        status.code()
    }

    /// The running dispatcher's process id.
    pub fn dispatcher_pid(&self) -> Option<u32> {
        self.dispatcher.as_ref().map(Child::id)
    }

    /// Worker `index`'s process id (of `podman run` with `FleetOptions::image`).
    pub fn worker_pid(&self, index: usize) -> u32 {
        self.workers[index].as_ref().expect("worker running").child.id()
    }

    pub fn worker_port(&self, index: usize) -> u16 {
        self.workers[index].as_ref().expect("worker running").port
    }

    /// The container worker `index` runs in (`FleetOptions::image`).
    pub fn worker_container(&self, index: usize) -> Option<&str> {
        self.workers[index].as_ref().expect("worker running").container.as_deref()
    }

    /// The container the dispatcher runs in (`FleetOptions::image`).
    pub fn dispatcher_container(&self) -> Option<&str> {
        self.dispatcher_container.as_deref()
    }

    /// Sends `signal` (e.g. `libc::SIGKILL`) to worker `index` (to its container's process with
    /// `FleetOptions::image`).
    pub fn signal_worker(&self, index: usize, signal: i32) {
        if let Some(name) = self.worker_container(index) {
            return signal_container(name, signal);
        }
        let pid = self.worker_pid(index) as i32;
        // SAFETY: kill(2) on a child process id this test owns.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill({pid}, {signal})");
    }

    /// SIGKILLs worker `index` and reaps it.
    pub fn kill_worker(&mut self, index: usize) {
        if let Some(mut w) = self.workers[index].take() {
            crate::container::remove(w.container.as_slice());
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }

    /// Whether worker `index` is still running.
    pub fn worker_alive(&mut self, index: usize) -> bool {
        match self.workers[index].as_mut() {
            Some(w) => w.child.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }

    /// Waits for worker `index` to exit and returns its exit code.
    pub async fn wait_worker_exit(&mut self, index: usize, timeout: Duration) -> Option<i32> {
        let w = self.workers[index].as_mut().expect("worker running");
        let status = wait_for("worker exit", timeout, || {
            let s = w.child.try_wait().ok().flatten();
            async move { s }
        })
        .await;
        self.workers[index] = None;
        status.code()
    }

    pub async fn worker_metrics(&self, index: usize) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.worker_port(index));
        self.http.get(url).send().await.unwrap().text().await.unwrap()
    }

    // ---- the API ----

    pub async fn request(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.request_as(&self.token, &method, path, body).await
    }

    /// A request with `token` (another tenant's, say): its status and JSON body (the text, if not
    /// JSON). A stream's body never ends, so an event stream comes back as its status alone.
    pub async fn request_as(
        &self,
        token: &str,
        method: &reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method.clone(), format!("{}{}", self.api, path)).bearer_auth(token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("dispatcher reachable");
        let status = resp.status().as_u16();
        if resp.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream")) {
            return (status, Value::Null);
        }
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.request(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn register_tool(&self, name: &str, callback_url: &str, secret: &str) {
        let body = json!({
            "name": name,
            "description": "a test tool",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
            "callback_url": callback_url,
            "callback_secret": secret,
        });
        let (status, resp) = self.request(reqwest::Method::PUT, &format!("/v1/tools/{name}"), Some(&body)).await;
        assert!(status == 201 || status == 200, "register tool: {status} {resp}");
    }

    /// Enqueues a tool call and returns its execution id (asserting the 202).
    pub async fn call_tool(&self, name: &str, parameters: Value) -> String {
        let (status, resp) = self
            .post(
                "/v1/tool-calls",
                &json!({"tool_name": name, "parameters": parameters, "room_id": "room_1", "assistant_id": "asst_1"}),
            )
            .await;
        assert_eq!(status, 202, "tool call: {resp}");
        assert_eq!(resp["data"]["status"], "queued");
        resp["data"]["execution_id"].as_str().unwrap().to_string()
    }

    /// Waits until the execution reaches `status` and returns it.
    pub async fn wait_status(&self, execution_id: &str, status: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (code, body) = self.get(&format!("/v1/executions/{execution_id}")).await;
            if code == 200 && body["data"]["status"] == status {
                return body["data"].clone();
            }
            // The last answer says why: stuck queued, retrying, dead-lettered, or not found.
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {execution_id} to be {status}; last answer {code}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // ---- Redis, directly ----

    /// A connection to the shared Redis, not through any proxy the fleet's processes may use.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        crate::redis_connection(&redis::Client::open(redis_url()).unwrap()).await
    }

    /// The fleet's keys matching `pattern` (after its key prefix), e.g. `*exec_123*`.
    pub async fn redis_keys(&self, pattern: &str) -> Vec<String> {
        let mut con = self.redis().await;
        redis::cmd("KEYS").arg(format!("{}{pattern}", self.key_prefix)).query_async(&mut con).await.unwrap()
    }

    // ---- the broker, directly ----

    pub async fn amqp(&self) -> (Connection, Channel) {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await.unwrap();
        let channel = conn.create_channel().await.unwrap();
        (conn, channel)
    }

    /// An operator's tap: a queue of the test's own bound to the dead-letter exchange, receiving a
    /// copy of every dead letter published from now on (the fleet's own dead-letter queue is
    /// drained into Redis by the dispatcher).
    pub async fn dead_letter_tap(&self) -> DeadLetterTap {
        let (connection, channel) = self.amqp().await;
        let options = QueueDeclareOptions { exclusive: true, ..Default::default() };
        let queue = channel.queue_declare("".into(), options, FieldTable::default()).await.unwrap();
        let queue = queue.name().as_str().to_string();
        channel
            .queue_bind(
                queue.as_str().into(),
                self.topology.dead_letter_exchange().as_str().into(),
                "".into(),
                Default::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        DeadLetterTap { connection, channel, queue }
    }

    /// Messages ready in `queue` (passive declare).
    /// The jobs of `kind` waiting for a worker: in its work queue and its light lane.
    pub async fn waiting_depth(&self, kind: JobKind) -> u32 {
        let mut depth = 0;
        for queue in self.topology.waiting_queues(kind) {
            depth += self.queue_depth(&queue).await;
        }
        depth
    }

    pub async fn queue_depth(&self, queue: &str) -> u32 {
        let (conn, channel) = self.amqp().await;
        let q = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let _ = conn.close(200, "".into()).await;
        q.message_count()
    }

    /// Publishes `envelope` to the jobs exchange (confirmed), as a duplicate publish or a wake would.
    pub async fn publish_envelope(&self, envelope: &fleet_protocol::envelope::Envelope) {
        let (conn, channel) = self.amqp().await;
        channel.confirm_select(Default::default()).await.unwrap();
        let properties = BasicProperties::default()
            .with_content_type(fleet_protocol::envelope::CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(envelope.execution_id.as_str().into());
        let body = serde_json::to_vec(envelope).unwrap();
        channel
            .basic_publish(
                self.topology.jobs_exchange().as_str().into(),
                envelope.kind().as_str().into(),
                BasicPublishOptions { mandatory: true, ..Default::default() },
                &body,
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        let _ = conn.close(200, "".into()).await;
    }

    /// Binds (or unbinds) `kind`'s work queue to the jobs exchange: unbound, every publish of that
    /// kind is returned unroutable, which is how a test makes the fleet's publishes fail.
    pub async fn bind_work_queue(&self, kind: JobKind, bound: bool) {
        let (conn, channel) = self.amqp().await;
        let (queue, exchange) = (self.topology.work_queue(kind), self.topology.jobs_exchange());
        if bound {
            channel
                .queue_bind(
                    queue.as_str().into(),
                    exchange.as_str().into(),
                    kind.as_str().into(),
                    Default::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        } else {
            channel
                .queue_unbind(
                    queue.as_str().into(),
                    exchange.as_str().into(),
                    kind.as_str().into(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        let _ = conn.close(200, "".into()).await;
    }

    /// Publishes raw bytes straight onto the tool-call work queue, as another client might.
    pub async fn publish_raw(&self, body: &[u8], properties: BasicProperties) {
        let (conn, channel) = self.amqp().await;
        channel.confirm_select(Default::default()).await.unwrap();
        channel
            .basic_publish(
                "".into(),
                self.topology.work_queue(JobKind::ToolCall).as_str().into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        let _ = conn.close(200, "".into()).await;
    }
}

/// See `Fleet::dead_letter_tap`; the queue goes with the connection.
pub struct DeadLetterTap {
    pub connection: Connection,
    pub channel: Channel,
    pub queue: String,
}

impl DeadLetterTap {
    /// Dead letters the tap holds (passive declare).
    pub async fn depth(&self) -> u32 {
        let options = QueueDeclareOptions { passive: true, ..Default::default() };
        let q = self.channel.queue_declare(self.queue.as_str().into(), options, FieldTable::default()).await.unwrap();
        q.message_count()
    }

    /// Takes the next dead letter off the tap, as JSON.
    pub async fn next(&self) -> Option<Value> {
        let got = self
            .channel
            .basic_get(self.queue.as_str().into(), lapin::options::BasicGetOptions { no_ack: true })
            .await
            .unwrap()?;
        serde_json::from_slice(&got.delivery.data).ok()
    }
}

/// `podman kill --signal`: the container's process gets `signal` as a runtime would send it.
fn signal_container(name: &str, signal: i32) {
    crate::container::podman_out(&["kill", "--signal", &signal.to_string(), name]);
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Containers first: killing `podman run` leaves its container running.
        crate::container::remove(&self.containers);
        if let Some(mut d) = self.dispatcher.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        for w in self.workers.iter_mut().filter_map(Option::take) {
            let mut child = w.child;
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(self.artifacts_dir());
        let _ = std::fs::remove_dir_all(self.log_dir());
        // Remove this test's queues, exchanges and keys so the shared services stay clean.
        let topology = self.topology.clone();
        let key_prefix = self.key_prefix.clone();
        let redis_nodes = self
            .options
            .env
            .iter()
            .find(|(k, _)| k == "FLEET_REDIS_URL")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(redis_url);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            // Bounded: a wedged service must not hold the test (and CI) forever.
            let cleanup = async move {
                if let Ok(conn) = Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
                    if let Ok(ch) = conn.create_channel().await {
                        for q in topology.queues() {
                            let _ = ch.queue_delete(q.name.as_str().into(), QueueDeleteOptions::default()).await;
                        }
                        for ex in topology.exchanges() {
                            let _ = ch.exchange_delete(ex.name.as_str().into(), Default::default()).await;
                        }
                    }
                    let _ = conn.close(200, "".into()).await;
                }
                // Every node: a Redis Cluster test's keys are spread over its masters.
                for node in redis_nodes.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    let Ok(client) = redis::Client::open(node) else { continue };
                    let Ok(mut con) = client.get_multiplexed_async_connection().await else { continue };
                    let keys: Vec<String> = redis::cmd("KEYS")
                        .arg(format!("{key_prefix}*"))
                        .query_async(&mut con)
                        .await
                        .unwrap_or_default();
                    for key in keys {
                        let _: Result<(), _> = redis::cmd("DEL").arg(key).query_async(&mut con).await;
                    }
                }
            };
            rt.block_on(async move {
                if tokio::time::timeout(Duration::from_secs(30), cleanup).await.is_err() {
                    eprintln!("fleet cleanup did not finish within 30 s; leftovers are swept by .ci/run");
                }
            });
        })
        .join();
    }
}

/// Every Redis value under the fleet's key prefix that holds `needle`, as `key (type)`: strings,
/// hashes (names and values), lists, sets, sorted sets (members) and streams (every field and
/// value), read whole. For the tests that a secret is kept nowhere.
pub async fn redis_values_containing(fleet: &Fleet, needle: &str) -> Vec<String> {
    let mut con = fleet.redis().await;
    let (mut keys, mut cursor) = (Vec::<String>::new(), 0u64);
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}*", fleet.key_prefix))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await
            .expect("SCAN the fleet's keys");
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut found = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut con).await.unwrap();
        let read = match kind.as_str() {
            "string" => redis::cmd("GET").arg(&key).clone(),
            "hash" => redis::cmd("HGETALL").arg(&key).clone(),
            "list" => redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone(),
            "set" => redis::cmd("SMEMBERS").arg(&key).clone(),
            "zset" => redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).clone(),
            "stream" => redis::cmd("XRANGE").arg(&key).arg("-").arg("+").clone(),
            _ => continue, // gone since the scan
        };
        let value: redis::Value = read.query_async(&mut con).await.unwrap();
        let mut text = Vec::new();
        flatten(&value, &mut text);
        if String::from_utf8_lossy(&text).contains(needle) {
            found.push(format!("{key} ({kind})"));
        }
    }
    found
}

/// Every byte string inside a reply, one after another (a newline between).
fn flatten(value: &redis::Value, out: &mut Vec<u8>) {
    match value {
        redis::Value::BulkString(bytes) => out.extend_from_slice(bytes),
        redis::Value::SimpleString(s) => out.extend_from_slice(s.as_bytes()),
        redis::Value::Array(items) | redis::Value::Set(items) => items.iter().for_each(|v| flatten(v, out)),
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        _ => {}
    }
    out.push(b'\n');
}
