//! The store's Redis connection, and when it starts over: one server behind a reconnecting
//! manager, or a Redis Cluster. The client library reconnects after an I/O error only; a reconnect
//! that Redis refuses for another reason (a password mid-rotation, `-LOADING`, a cluster whose
//! topology moved under it) would otherwise stay the process's connection for good. So a run of
//! consecutive failures drops the connection and the next command builds a fresh one. A script
//! that fails on the data it read is not such a failure: Redis answered.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Consecutive failed commands (no success between them, across all tasks) after which the
/// connection is dropped and built again.
const FAILURES_BEFORE_STARTING_OVER: u32 = 5;
/// At most one start-over per this interval: during an outage every command fails, and a fresh
/// connection each time would only add connection attempts.
const MIN_TIME_BETWEEN_STARTS: Duration = Duration::from_secs(1);

/// Whether to drop the connection and build it again. Pure: the policy, unit-tested.
pub(crate) fn start_over(consecutive_failures: u32, since_last_start: Duration) -> bool {
    consecutive_failures >= FAILURES_BEFORE_STARTING_OVER && since_last_start >= MIN_TIME_BETWEEN_STARTS
}

/// Whether `error` is a script's own failure on the data it read (a value it cannot parse): Redis
/// ran the script and answered, so the connection works, and another connection would fail the
/// same way. Such failures do not count towards starting over. Only a plain `ERR`: a command
/// refused inside a script (`READONLY` on a demoted primary, `LOADING`) says where the connection
/// is, and may need a new one.
pub(crate) fn failed_in_a_script(error: &redis::RedisError) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|detail| detail.contains("@user_script:"))
}

/// A Redis connection: one server (reconnecting manager) or a Redis Cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// How a connection is built.
pub(crate) enum Connector {
    /// Lazily connecting: a process starts while Redis is still down.
    Single { client: redis::Client, config: ConnectionManagerConfig },
    /// Connected on first use (and again after a failed attempt), so a process starts while the
    /// cluster is still coming up.
    Cluster { client: redis::cluster::ClusterClient },
}

impl Connector {
    async fn connect(&self) -> Result<Conn, redis::RedisError> {
        match self {
            Connector::Single { client, config } => {
                Ok(Conn::Single(ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?))
            }
            Connector::Cluster { client } => Ok(Conn::Cluster(client.get_async_connection().await?)),
        }
    }
}

/// The current connection, built on demand and dropped after a run of failures.
pub(crate) struct Backend {
    connector: Connector,
    current: RwLock<Option<Conn>>,
    connecting: tokio::sync::Mutex<()>,
    consecutive_failures: AtomicU32,
    last_start: Mutex<Instant>,
}

impl Backend {
    pub(crate) fn new(connector: Connector) -> Self {
        Backend {
            connector,
            current: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(()),
            consecutive_failures: AtomicU32::new(0),
            last_start: Mutex::new(Instant::now()),
        }
    }

    /// The current connection, or a new one (one task builds it; the others wait for it).
    pub(crate) async fn conn(&self) -> Result<Conn, redis::RedisError> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let _building = self.connecting.lock().await;
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let conn = self.connector.connect().await?;
        *self.current.write().expect("connection lock") = Some(conn.clone());
        Ok(conn)
    }

    fn current(&self) -> Option<Conn> {
        self.current.read().expect("connection lock").clone()
    }

    pub(crate) fn succeeded(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn failed(&self, error: &redis::RedisError) {
        if failed_in_a_script(error) {
            return;
        }
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last_start = self.last_start.lock().expect("start-over lock");
        if !start_over(failures, last_start.elapsed()) {
            return;
        }
        *last_start = Instant::now();
        self.consecutive_failures.store(0, Ordering::Relaxed);
        *self.current.write().expect("connection lock") = None;
        tracing::warn!(failures, %error, "Redis commands keep failing; starting over with a new connection");
    }
}

/// `EVALSHA` of `script` with its `keys` count: the caller adds the keys and arguments.
pub(crate) fn evalsha(script: &redis::Script, keys: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}

/// Runs two scripts (`EVALSHA` commands built by [`evalsha`]) and answers each one's result: on
/// one server in one round trip (a pipeline), on a Cluster one after the other, as their keys may
/// live on different nodes. A script the server has forgotten is loaded and run again alone.
pub(crate) async fn eval_pair<A: redis::FromRedisValue, B: redis::FromRedisValue>(
    conn: &mut Conn,
    (a_script, a): (&redis::Script, redis::Cmd),
    (b_script, b): (&redis::Script, redis::Cmd),
) -> (redis::RedisResult<A>, redis::RedisResult<B>) {
    if let Conn::Cluster(_) = conn {
        let first = a.query_async(conn).await;
        let first = again_if_forgotten(conn, a_script, &a, first).await;
        let second = b.query_async(conn).await;
        return (first, again_if_forgotten(conn, b_script, &b, second).await);
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors().add_command(a.clone()).add_command(b.clone());
    let (first, second): (redis::RedisResult<redis::Value>, redis::RedisResult<redis::Value>) =
        match pipe.query_async::<Vec<redis::RedisResult<redis::Value>>>(conn).await {
            Ok(mut both) if both.len() == 2 => {
                let second = both.pop().expect("two results");
                (both.pop().expect("two results"), second)
            }
            Ok(_) => return (a.query_async(conn).await, b.query_async(conn).await),
            Err(e) => return (Err(e.clone()), Err(e)),
        };
    (again_if_forgotten(conn, a_script, &a, first).await, again_if_forgotten(conn, b_script, &b, second).await)
}

/// Runs `cmd` (an `EVALSHA` of `script` built by [`evalsha`]); a script the server has forgotten is
/// loaded and run again. The hot scripts are built this way, not with `Script::prepare_invoke`,
/// which copies every key and argument into a buffer of its own first.
pub(crate) async fn eval<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &redis::Script,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let r = cmd.query_async::<redis::Value>(conn).await;
    again_if_forgotten(conn, script, cmd, r).await
}

async fn again_if_forgotten<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &redis::Script,
    cmd: &redis::Cmd,
    r: redis::RedisResult<redis::Value>,
) -> redis::RedisResult<T> {
    match r {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            cmd.query_async(conn).await
        }
        r => r.and_then(|v| Ok(redis::from_redis_value(v)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_that_fails_on_its_data_says_nothing_of_the_connection() {
        let server = |detail: &str| {
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                detail.to_string(),
            ))
        };
        let decode = "user_script:21: Expected value but found invalid token at character 1 script: \
            e9a95241dd1396523a93f79b6b29fdbba9e040ed, on @user_script:21.";
        assert!(failed_in_a_script(&server(decode)));
        let demoted = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "An error was signalled by the server",
            "You can't write against a read only replica. script: e9a9, on @user_script:44.".to_string(),
        ));
        assert!(!failed_in_a_script(&demoted), "a demoted primary needs a new connection");
        assert!(!failed_in_a_script(&server("Client sent AUTH, but no password is set")));
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!failed_in_a_script(&io));
    }

    #[test]
    fn a_run_of_failures_starts_over_at_most_once_a_second() {
        assert!(!start_over(1, Duration::from_secs(60)), "one failure is not a broken connection");
        assert!(!start_over(FAILURES_BEFORE_STARTING_OVER - 1, Duration::from_secs(60)));
        assert!(start_over(FAILURES_BEFORE_STARTING_OVER, Duration::from_secs(60)));
        assert!(start_over(FAILURES_BEFORE_STARTING_OVER * 10, MIN_TIME_BETWEEN_STARTS));
        assert!(!start_over(FAILURES_BEFORE_STARTING_OVER * 10, MIN_TIME_BETWEEN_STARTS - Duration::from_millis(1)));
    }
}
