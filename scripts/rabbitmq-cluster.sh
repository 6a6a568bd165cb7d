#!/usr/bin/env bash
# A throw-away 3-node RabbitMQ cluster on this machine, for the cluster tests and for trying the
# fleet against a real cluster by hand. Each node has its own node name, AMQP and distribution
# ports, Mnesia/log directories and config (no plugins, so no management listener); the nodes
# share an Erlang cookie of their own. Nothing of the machine's own broker (node rabbit@<host>,
# /etc/rabbitmq, /var/lib/rabbitmq, port 5672) is read or touched.
#
#   scripts/rabbitmq-cluster.sh start            start 3 nodes, join 2 and 3 to 1 (join_cluster); print the URLs
#   scripts/rabbitmq-cluster.sh stop             end every node (SIGTERM, SIGKILL after 30 s), remove the directory
#   FLEET_CLUSTER_KEEP_LOGS=DIR                  on stop, keep the nodes' logs under DIR (to read after a failed run)
#   scripts/rabbitmq-cluster.sh urls             the AMQP URLs, comma-separated (what FLEET_AMQP_URL takes)
#   scripts/rabbitmq-cluster.sh stop-node N      stop node N (1-3) gracefully (SIGTERM: the VM's orderly shutdown)
#   scripts/rabbitmq-cluster.sh kill-node N      SIGKILL node N's Erlang VM (a crash)
#   scripts/rabbitmq-cluster.sh start-node N     start node N again (it rejoins the cluster) and wait for it
#   scripts/rabbitmq-cluster.sh leader QUEUE     the number (1-3) of the node leading quorum queue QUEUE
#   scripts/rabbitmq-cluster.sh members QUEUE    the nodes holding a replica of QUEUE, one a line
#   scripts/rabbitmq-cluster.sh wait-synced N    wait until stopping node N would leave every quorum queue a majority
#   scripts/rabbitmq-cluster.sh partition N      cut node N off the network (needs FLEET_CLUSTER_NETNS=1 at start)
#   scripts/rabbitmq-cluster.sh heal N           reconnect it
#   scripts/rabbitmq-cluster.sh suspend-member N QUEUE   suspend node N's replica of quorum queue QUEUE (its Ra
#                                                server, `sys:suspend`): the node serves clients, but the queue
#                                                cannot elect a leader that needs its vote
#   scripts/rabbitmq-cluster.sh resume-member N QUEUE    resume it
#   scripts/rabbitmq-cluster.sh ctl N ARGS…      rabbitmqctl against node N (likewise `queues N ARGS…` for rabbitmq-queues)
#
# Settings (read at `start`, remembered in the directory for the other commands):
#   FLEET_CLUSTER_DIR         the cluster's directory (default /tmp/fleet-rabbit-cluster)
#   FLEET_CLUSTER_NAME        node name prefix: nodes are NAME-1@localhost … (default fleet-c)
#   FLEET_CLUSTER_AMQP_PORTS  three AMQP ports (default 5711,5712,5713)
#   FLEET_CLUSTER_DIST_PORTS  three Erlang distribution ports (default 25711,25712,25713)
#   FLEET_CLUSTER_NETNS=1     run node 3 in a network namespace of its own, joined to the host by a
#                             veth pair, so `partition 3` can cut it off; the nodes then use long
#                             names (NAME-N@IP) and epmds of their own on FLEET_CLUSTER_EPMD_PORT
#                             (default: the first AMQP port + 3); needs root (ip netns)
set -euo pipefail

RABBIT_BIN=/usr/lib/rabbitmq/bin
DIR=${FLEET_CLUSTER_DIR:-/tmp/fleet-rabbit-cluster}
STATE="$DIR/cluster.env"

die() { echo "rabbitmq-cluster: $*" >&2; exit 1; }

load_state() {
  [ -f "$STATE" ] || die "no cluster in $DIR (run start first, with the same FLEET_CLUSTER_DIR)"
  # shellcheck disable=SC1090
  . "$STATE"
}

# The environment of node $1 (server and CLI alike): its own files only, the cluster's cookie.
node_env() {
  local i=$1 d="$DIR/n$1"
  local ports=(${AMQP_PORTS//,/ }) dists=(${DIST_PORTS//,/ })
  export HOME="$DIR"
  export RABBITMQ_NODENAME="$(node_name "$i")"
  export RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf"
  export RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf"
  export RABBITMQ_ADVANCED_CONFIG_FILE="$d/advanced.config"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins"
  export RABBITMQ_MNESIA_BASE="$d/mnesia"
  export RABBITMQ_LOG_BASE="$d/log"
  export RABBITMQ_PID_FILE="$d/rabbit.pid"
  export RABBITMQ_DIST_PORT="${dists[$((i - 1))]}"
  if [ -n "$NETNS" ]; then
    export RABBITMQ_USE_LONGNAME=true ERL_EPMD_PORT="$EPMD_PORT"
    unset ERL_EPMD_ADDRESS
  else
    export ERL_EPMD_ADDRESS=127.0.0.1
  fi
  AMQP_PORT="${ports[$((i - 1))]}"
}

node_host() {
  if [ -n "$NETNS" ]; then
    if [ "$1" = 3 ]; then echo "$NS_IP"; else echo "$HOST_IP"; fi
  else
    echo localhost
  fi
}

node_name() { echo "$NAME-$1@$(node_host "$1")"; }

# The address clients reach node $1's AMQP listener on.
amqp_host() { if [ -n "$NETNS" ] && [ "$1" = 3 ]; then echo "$NS_IP"; else echo 127.0.0.1; fi; }

# Runs a command in node $1's network namespace (the host's, except node 3 with NETNS).
in_node_ns() {
  local i=$1
  shift
  if [ -n "$NETNS" ] && [ "$i" = 3 ]; then ip netns exec "$NS" "$@"; else "$@"; fi
}

ctl() { (node_env "$1" && shift && "$RABBIT_BIN/rabbitmqctl" "$@"); }
queues() { (node_env "$1" && shift && "$RABBIT_BIN/rabbitmq-queues" "$@"); }

node_pid() { cat "$DIR/n$1/rabbit.pid" 2>/dev/null || true; }
alive() { local pid; pid=$(node_pid "$1"); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

write_node_files() {
  local i=$1 d="$DIR/n$1"
  mkdir -p "$d"
  node_env "$i"
  : >"$d/rabbitmq-env.conf"
  cat >"$d/rabbitmq.conf" <<EOF
listeners.tcp.default = $(amqp_host "$i"):$AMQP_PORT
loopback_users = none
# Quorum queues keep their own majority; pause_minority also stops a cut-off node from serving
# clients with stale metadata until it rejoins.
cluster_partition_handling = pause_minority
log.file.level = info
EOF
  # A cut-off peer is noticed in ~10 s rather than the default 60 (the partition test lasts 30 s).
  echo '[{kernel, [{net_ticktime, 10}]}].' >"$d/advanced.config"
}

start_node() {
  local i=$1
  alive "$i" && return 0
  rm -f "$DIR/n$i/rabbit.pid"
  (
    node_env "$i"
    in_node_ns "$i" env "PATH=$PATH" "$RABBIT_BIN/rabbitmq-server" -detached >/dev/null 2>&1
  )
  await_listener "$i"
}

# A node opens its AMQP listener last, once it has booted and rejoined its cluster: polling the
# port costs nothing, where each CLI call starts an Erlang VM (seconds on a busy machine).
await_listener() {
  local i=$1 ports=(${AMQP_PORTS//,/ })
  local port=${ports[$((i - 1))]} host
  host=$(amqp_host "$i")
  for _ in $(seq 1 2400); do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  die "node $(node_name "$i") did not open its AMQP port $host:$port (log: $DIR/n$i/log)"
}

await_node() {
  # `wait` with the pid file: one CLI call that returns once the node's app runs.
  ctl "$1" wait "$DIR/n$1/rabbit.pid" --timeout 240 >/dev/null 2>&1 ||
    die "node $(node_name "$1") did not start (log: $DIR/n$1/log)"
}

stop_node() {
  local i=$1 pid
  pid=$(node_pid "$i")
  alive "$i" || return 0
  # SIGTERM is the VM's orderly shutdown (what `rabbitmqctl stop` asks for, without starting a
  # CLI VM): the node hands its queue leaderships over and closes its client connections. A node
  # that has not stopped after 60 s is killed.
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  wait_gone "$pid"
}

kill_node() {
  local pid
  pid=$(node_pid "$1")
  [ -n "$pid" ] || die "node $1 has no pid file"
  kill -9 "$pid" 2>/dev/null || true
  wait_gone "$pid"
}

wait_gone() {
  for _ in $(seq 1 100); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
}

urls() {
  local out="" ports=(${AMQP_PORTS//,/ })
  for i in 1 2 3; do
    out="$out${out:+,}amqp://guest:guest@$(amqp_host "$i"):${ports[$((i - 1))]}/%2f"
  done
  echo "$out"
}

# Any running node answers cluster-wide questions.
running_node() {
  for i in 1 2 3; do
    if alive "$i"; then echo "$i"; return 0; fi
  done
  die "no node is running"
}

leader() {
  local leader_name
  leader_name=$(ctl "$(running_node)" list_queues name leader -q --no-table-headers 2>/dev/null |
    awk -v q="$1" '$1 == q { print $2 }')
  [ -n "$leader_name" ] || die "queue $1 has no leader (yet)"
  for i in 1 2 3; do
    if [ "$(node_name "$i")" = "$leader_name" ]; then echo "$i"; return 0; fi
  done
  die "leader $leader_name is not one of this cluster's nodes"
}

members() {
  queues "$(running_node)" quorum_status "$1" -q --formatter json 2>/dev/null |
    python3 -c 'import json,sys; [print(m["Node Name"]) for m in json.load(sys.stdin)]'
}

wait_synced() {
  for _ in $(seq 1 240); do
    if queues "$1" check_if_node_is_quorum_critical >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  die "node $1 stayed quorum-critical (a queue would lose its majority without it)"
}

# A quorum queue's Ra server is registered under the vhost (percent-encoded) and the queue name.
member() {
  local call=$1 n=$2 queue=$3
  [[ "$queue" =~ ^[A-Za-z0-9._-]+$ ]] || die "queue name $queue: only letters, digits, . _ -"
  ctl "$n" eval "sys:$call(list_to_atom(\"%2F_$queue\"))." >/dev/null
}

# ---- the network namespace of node 3 (FLEET_CLUSTER_NETNS=1) ----

netns_up() {
  ip netns add "$NS"
  ip link add "$VETH" type veth peer name "${VETH}p"
  ip link set "${VETH}p" netns "$NS"
  ip addr add "$HOST_IP/30" dev "$VETH"
  ip link set "$VETH" up
  ip netns exec "$NS" ip addr add "$NS_IP/30" dev "${VETH}p"
  ip netns exec "$NS" ip link set "${VETH}p" up
  ip netns exec "$NS" ip link set lo up
  # One epmd per namespace, on the cluster's own port, started here so `stop` can end them by pid.
  epmd -port "$EPMD_PORT" -address "127.0.0.1,$HOST_IP" >/dev/null 2>&1 &
  echo $! >"$DIR/epmd-host.pid"
  ip netns exec "$NS" epmd -port "$EPMD_PORT" -address "127.0.0.1,$NS_IP" >/dev/null 2>&1 &
  echo $! >"$DIR/epmd-ns.pid"
  sleep 0.5
}

netns_down() {
  ip route del unreachable "$NS_IP/32" 2>/dev/null || true
  for f in "$DIR/epmd-host.pid" "$DIR/epmd-ns.pid"; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  ip link del "$VETH" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}

# The host side of the veth goes down, and node 3's address becomes unreachable: without that
# route, a connection attempt would leave by the default route (which, in some sandboxes, a proxy
# answers) instead of failing. Established connections stall, as in a real partition.
partition() {
  [ -n "$NETNS" ] && [ "$1" = 3 ] || die "only node 3 of a cluster started with FLEET_CLUSTER_NETNS=1 can be partitioned"
  ip link set "$VETH" down
  ip route replace unreachable "$NS_IP/32"
}

heal() {
  [ -n "$NETNS" ] && [ "$1" = 3 ] || die "only node 3 of a cluster started with FLEET_CLUSTER_NETNS=1 can be healed"
  ip route del unreachable "$NS_IP/32" 2>/dev/null || true
  ip link set "$VETH" up
}

start() {
  [ -f "$STATE" ] && die "a cluster already runs in $DIR (stop it first)"
  mkdir -p "$DIR"
  NAME=${FLEET_CLUSTER_NAME:-fleet-c}
  AMQP_PORTS=${FLEET_CLUSTER_AMQP_PORTS:-5711,5712,5713}
  DIST_PORTS=${FLEET_CLUSTER_DIST_PORTS:-25711,25712,25713}
  NETNS=${FLEET_CLUSTER_NETNS:-}
  if [ -n "$NETNS" ]; then
    # A /30 of its own per cluster, from the first AMQP port, so two clusters never share one.
    # A /30 of its own per cluster, derived from the first AMQP port (one port, one subnet).
    local p=${AMQP_PORTS%%,*}
    NS="$NAME-ns" VETH="fc$p"
    HOST_IP="10.$((100 + p / 16384)).$(((p / 64) % 256)).$((4 * (p % 64) + 1))"
    NS_IP="${HOST_IP%.*}.$((4 * (p % 64) + 2))"
    EPMD_PORT=${FLEET_CLUSTER_EPMD_PORT:-$((p + 3))}
  fi
  cat >"$STATE" <<EOF
NAME=$NAME
AMQP_PORTS=$AMQP_PORTS
DIST_PORTS=$DIST_PORTS
NETNS=$NETNS
NS=${NS:-}
VETH=${VETH:-}
HOST_IP=${HOST_IP:-}
NS_IP=${NS_IP:-}
EPMD_PORT=${EPMD_PORT:-}
EOF
  od -An -tx1 -N20 /dev/urandom | tr -d ' \n' >"$DIR/.erlang.cookie"
  chmod 400 "$DIR/.erlang.cookie"
  echo '[].' >"$DIR/enabled_plugins"
  [ -n "$NETNS" ] && netns_up
  for i in 1 2 3; do write_node_files "$i"; done
  for i in 1 2 3; do
    (
      node_env "$i"
      in_node_ns "$i" env "PATH=$PATH" "$RABBIT_BIN/rabbitmq-server" -detached >/dev/null 2>&1
    )
  done
  # Each CLI call starts an Erlang VM: wait for the nodes, then join them, in parallel.
  local waits=()
  for i in 1 2 3; do await_node "$i" & waits+=($!); done
  for w in "${waits[@]}"; do wait "$w" || die "a node did not start"; done
  waits=()
  for i in 2 3; do
    (ctl "$i" stop_app && ctl "$i" join_cluster "$(node_name 1)" && ctl "$i" start_app) >/dev/null &
    waits+=($!)
  done
  for w in "${waits[@]}"; do wait "$w" || die "a node did not join"; done
  local running
  for _ in $(seq 1 120); do
    running=$(ctl 1 cluster_status --formatter json 2>/dev/null |
      python3 -c 'import json,sys; print(len(json.load(sys.stdin)["running_nodes"]))' 2>/dev/null || echo 0)
    [ "$running" = 3 ] && break
    sleep 0.5
  done
  [ "$running" = 3 ] || die "the cluster has $running running node(s), not 3"
  urls
}

stop() {
  [ -f "$STATE" ] || return 0
  load_state
  # The cluster is thrown away: SIGTERM (the VM's own orderly shutdown) to every node at once,
  # SIGKILL whatever still runs after 30 s.
  local pids=() pid
  for i in 1 2 3; do
    pid=$(node_pid "$i")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  for _ in $(seq 1 300); do
    local left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; wait_gone "$pid"; done
  if [ -n "$NETNS" ]; then netns_down; fi
  if [ -n "${FLEET_CLUSTER_KEEP_LOGS:-}" ]; then
    local kept="$FLEET_CLUSTER_KEEP_LOGS/$(basename "$DIR")-$(date +%s)"
    mkdir -p "$kept" && (cd "$DIR" && find . -path '*/log/*' -type f -exec cp --parents {} "$kept" \;) || true
  fi
  rm -rf "$DIR"
}

cmd=${1:-}
shift || true
case "$cmd" in
  start) start ;;
  stop) stop ;;
  urls) load_state; urls ;;
  stop-node) load_state; stop_node "$1" ;;
  kill-node) load_state; kill_node "$1" ;;
  start-node) load_state; start_node "$1" ;;
  leader) load_state; leader "$1" ;;
  members) load_state; members "$1" ;;
  wait-synced) load_state; wait_synced "$1" ;;
  partition) load_state; partition "$1" ;;
  heal) load_state; heal "$1" ;;
  suspend-member) load_state; member suspend "$1" "$2" ;;
  resume-member) load_state; member resume "$1" "$2" ;;
  ctl) load_state; ctl "$@" ;;
  queues) load_state; queues "$@" ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
