#!/usr/bin/env bash
# Deletes what killed test runs left on the local RabbitMQ: queues and exchanges of test topologies
# (`fleet-t…`) and throw-away test users (`fleet-` and 10 hex digits); and ends the clusters of
# killed failover tests and the containers of killed image tests. Only for a machine where no
# test is running (CI's clean start). Idempotent; a no-op when nothing is left.
set -uo pipefail
# Clusters of a failover test that was killed before its guard could end them: the RabbitMQ
# cluster's own script stops its nodes (and node 3's namespace); a Redis failover cluster's nodes
# are ended by their pid files, only if the process still runs in that directory.
for dir in /tmp/fleet-test-rabbit-cluster-*; do
  [ -f "$dir/cluster.env" ] || continue
  echo "sweep: stopping the test RabbitMQ cluster in $dir"
  FLEET_CLUSTER_DIR="$dir" "$(dirname "$0")/rabbitmq-cluster.sh" stop
done
for pidfile in /tmp/fleet-test-redis-failover-*/node*/redis.pid; do
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$(dirname "$pidfile")" ]; then
    echo "sweep: ending test redis-server $pid ($(dirname "$pidfile"))"
    kill -9 "$pid" 2>/dev/null
  fi
done
rm -rf /tmp/fleet-test-redis-failover-* 2>/dev/null
# Containers of image tests that were killed before their guard removed them (tests/src/container.rs).
if command -v podman >/dev/null; then
  export CONTAINERS_CONF=${CONTAINERS_CONF:-$(cd "$(dirname "$0")/.." && pwd)/deploy/podman/containers.conf}
  containers=$(podman ps --all --format '{{.Names}}' --filter 'name=^fleet-test-' 2>/dev/null || true)
  if [ -n "$containers" ]; then
    echo "sweep: removing $(echo "$containers" | wc -l) test container(s)"
    echo "$containers" | xargs podman rm --force --time 0 >/dev/null 2>&1
  fi
fi
command -v rabbitmqctl >/dev/null || exit 0
prefix=${SWEEP_TOPOLOGY_PATTERN:-'fleet-t[0-9a-f]{12}'}
user_pattern=${SWEEP_USER_PATTERN:-'fleet-[0-9a-f]{10}'}
list() { rabbitmqctl "$@" --no-table-headers --quiet 2>/dev/null | awk '{print $1}'; }
queues=$(list list_queues name | grep -E "^$prefix\." || true)
exchanges=$(list list_exchanges name | grep -E "^$prefix\." || true)
users=$(list list_users | grep -E "^$user_pattern$" || true)
count() { printf '%s' "$1" | grep -c . || true; }
if [ -n "$queues$exchanges$users" ]; then
  echo "sweep: deleting $(count "$queues") queues, $(count "$exchanges") exchanges, $(count "$users") users left by earlier test runs"
  for q in $queues; do rabbitmqctl delete_queue "$q" >/dev/null 2>&1; done
  for e in $exchanges; do
    rabbitmqctl eval "rabbit_exchange:delete(rabbit_misc:r(<<\"/\">>, exchange, <<\"$e\">>), false, <<\"sweep\">>)." >/dev/null 2>&1
  done
  for u in $users; do rabbitmqctl delete_user "$u" >/dev/null 2>&1; done
fi
exit 0
