#!/usr/bin/env bash
# Makes sure RabbitMQ (127.0.0.1:5672) and Redis (127.0.0.1:6379) are reachable: uses them if they
# are up; else starts them if installed; else installs them from Debian's packages when run as
# root; else says plainly what is missing. The same for PostgreSQL (127.0.0.1:5432) and MariaDB
# (127.0.0.1:3306), the data-source tests' databases, each given a test user that logs in with a
# password (FLEET_TEST_DATABASES=0 skips them). Idempotent.
set -euo pipefail
# A broker or Redis started from here inherits this: RabbitMQ needs a descriptor per connection
# and per queue segment, and a busy test run outgrows the usual 1024.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local port=$1 name=$2
  for _ in $(seq 1 120); do
    port_open "$port" && return 0
    sleep 0.5
  done
  echo "ensure-services: $name did not come up on 127.0.0.1:$port" >&2
  return 1
}

install_pkg() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "ensure-services: installing $1 from Debian's packages"
    (apt-get install -y "$1" >/dev/null 2>&1) || (apt-get update >/dev/null && apt-get install -y "$1" >/dev/null)
  else
    echo "ensure-services: $1 is not installed and cannot be installed here (need root and apt-get)." >&2
    echo "  Install RabbitMQ and Redis, or point FLEET_AMQP_URL / FLEET_REDIS_URL at running ones." >&2
    exit 1
  fi
}

if ! port_open 6379; then
  command -v redis-server >/dev/null || install_pkg redis-server
  echo "ensure-services: starting redis-server"
  mkdir -p /tmp/fleet-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp/fleet-redis --logfile /tmp/fleet-redis/redis.log
  wait_port 6379 Redis
fi

# The broker runs as its own user through `su`, which resets the descriptor limit to 1024; its
# environment file is sourced by that user's shell, so the limit is raised there (root only).
raise_broker_fd_limit() {
  local conf=/etc/rabbitmq/rabbitmq-env.conf
  [ -w "$(dirname "$conf")" ] || return 0
  grep -q '^ulimit -n' "$conf" 2>/dev/null || echo 'ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true' >>"$conf"
}
command -v rabbitmq-server >/dev/null && raise_broker_fd_limit

# A node whose app was stopped (rabbitmqctl stop_app) only needs its app started.
if ! port_open 5672 && command -v rabbitmqctl >/dev/null && rabbitmqctl status >/dev/null 2>&1; then
  echo "ensure-services: starting the stopped RabbitMQ app"
  rabbitmqctl start_app >/dev/null 2>&1 || true
  wait_port 5672 RabbitMQ || true
fi
if ! port_open 5672; then
  command -v rabbitmq-server >/dev/null || install_pkg rabbitmq-server
  echo "ensure-services: starting rabbitmq-server"
  rabbitmq-server -detached >/dev/null 2>&1 || true
  wait_port 5672 RabbitMQ
  # The port opens before the broker accepts logins; wait for the app itself.
  if command -v rabbitmqctl >/dev/null; then
    rabbitmqctl await_startup --timeout 60 >/dev/null 2>&1 || true
  fi
fi
# An open port is not a working broker: a wedged node keeps 5672 open and never answers the AMQP
# header. Ask for Connection.Start; restart the node if it does not come, and as a last resort
# start it on a fresh database (the old one is kept aside for inspection).
amqp_answers() {
  timeout 10 python3 -c '
import socket, sys
s = socket.create_connection(("127.0.0.1", 5672), timeout=5)
s.sendall(b"AMQP\x00\x00\x09\x01")
sys.exit(0 if s.recv(1) == b"\x01" else 1)' 2>/dev/null
}
# The node that listens on 5672 (other RabbitMQ nodes, e.g. a test's own cluster, are left alone).
shared_broker_pid() {
  ss -ltnpH 'sport = :5672' 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
}
kill_shared_broker() {
  local pid
  pid=$(shared_broker_pid)
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}
restart_rabbitmq() {
  timeout 60 rabbitmqctl stop >/dev/null 2>&1 || kill_shared_broker
  for _ in $(seq 1 40); do port_open 5672 || break; sleep 0.5; done
  rabbitmq-server -detached >/dev/null 2>&1 || true
  wait_port 5672 RabbitMQ || true
  rabbitmqctl await_startup --timeout 60 >/dev/null 2>&1 || true
}
if command -v rabbitmq-server >/dev/null && ! amqp_answers; then
  echo "ensure-services: RabbitMQ does not answer AMQP; restarting it"
  restart_rabbitmq
  if ! amqp_answers; then
    echo "ensure-services: RabbitMQ still silent; starting it on a fresh database"
    timeout 60 rabbitmqctl stop >/dev/null 2>&1 || kill_shared_broker
    for dir in /var/lib/rabbitmq/mnesia; do
      [ -d "$dir" ] && mv "$dir" "$dir.wedged-$(date +%s)"
    done
    restart_rabbitmq
  fi
  amqp_answers || { echo "ensure-services: RabbitMQ does not answer AMQP on 127.0.0.1:5672" >&2; exit 1; }
fi
# A broker that was started before the limit above was written (by the machine itself, say) keeps
# the soft limit it was born with, often 1024: a parallel test run then leaves it out of sockets
# (hundreds in CLOSE-WAIT) and it stops completing AMQP handshakes. Its running limit is what
# counts, read from /proc; below what a test run needs, the node is restarted with the high one.
broker_fd_limit() {
  local pid
  pid=$(shared_broker_pid)
  [ -n "$pid" ] && [ -r "/proc/$pid/limits" ] || { echo 0; return; }
  awk '/^Max open files/ {print $4}' "/proc/$pid/limits"
}
BROKER_MIN_FDS=${FLEET_BROKER_MIN_FDS:-8192}
if command -v rabbitmq-server >/dev/null && [ -n "$(shared_broker_pid)" ]; then
  limit=$(broker_fd_limit)
  if [ "$limit" != unlimited ] && [ "$limit" -lt "$BROKER_MIN_FDS" ] 2>/dev/null; then
    echo "ensure-services: RabbitMQ runs with $limit open files at most (a test run needs $BROKER_MIN_FDS); restarting it"
    restart_rabbitmq
    amqp_answers || { echo "ensure-services: RabbitMQ did not come back after the restart" >&2; exit 1; }
    limit=$(broker_fd_limit)
    if [ "$limit" != unlimited ] && [ "$limit" -lt "$BROKER_MIN_FDS" ] 2>/dev/null; then
      echo "ensure-services: RabbitMQ still runs with $limit open files at most; raise its limit (rabbitmq-env.conf or systemd LimitNOFILE)" >&2
      exit 1
    fi
  fi
fi
# A local 3-master Redis Cluster on 7000-7002 for the cluster tests (FLEET_TEST_REDIS_CLUSTER=0 skips it).
if [ "${FLEET_TEST_REDIS_CLUSTER:-1}" != 0 ]; then
  if ! redis-cli -p 7000 cluster info 2>/dev/null | grep -q cluster_state:ok; then
    for port in 7000 7001 7002; do
      if ! port_open "$port"; then
        dir="/tmp/fleet-redis-cluster/$port"
        mkdir -p "$dir"
        rm -f "$dir/nodes.conf"
        redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --cluster-enabled yes \
          --cluster-config-file "$dir/nodes.conf" --save "" --appendonly no --dir "$dir" --logfile "$dir/redis.log"
        wait_port "$port" "Redis cluster node $port"
      fi
    done
    redis-cli --cluster create 127.0.0.1:7000 127.0.0.1:7001 127.0.0.1:7002 --cluster-replicas 0 --cluster-yes >/dev/null
    for _ in $(seq 1 60); do
      redis-cli -p 7000 cluster info 2>/dev/null | grep -q cluster_state:ok && break
      sleep 0.5
    done
  fi
  echo "ensure-services: Redis Cluster 127.0.0.1:7000-7002 is up"
fi
# The data-source tests' databases: PostgreSQL and MariaDB on 127.0.0.1, each with the user
# `fleet_test` (password `fleet_test_pw`) owning a database `fleet_ds`. The tests make a schema
# (PostgreSQL) or a database `t_…` (MariaDB) of their own in them and drop it at the end.
# Seed 000's own example (tests/seeds/000/data-sources.sh) reads a database `sales` as
# `readonly_user` (password `secure_password`), allowed to read it only; `fleet_test` fills it.
DS_USER=fleet_test
DS_PASSWORD=fleet_test_pw
DS_DATABASE=fleet_ds
SEED_USER=readonly_user
SEED_PASSWORD=secure_password
SEED_DATABASE=sales

# psql as the cluster's superuser: through the local socket as `postgres` when root, else over TCP.
psql_admin() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 "$@"
  else
    psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres "$@"
  fi
}

ensure_postgres() {
  if ! port_open 5432; then
    command -v pg_ctlcluster >/dev/null || install_pkg postgresql
    local cluster
    cluster=$(pg_lsclusters --no-header 2>/dev/null | awk 'NR == 1 {print $1 " " $2}')
    [ -n "$cluster" ] || { echo "ensure-services: no PostgreSQL cluster to start" >&2; return 1; }
    echo "ensure-services: starting PostgreSQL $cluster"
    # shellcheck disable=SC2086 # version and name, two words
    pg_ctlcluster $cluster start
    wait_port 5432 PostgreSQL
  fi
  # A wrong password must fail even where the cluster trusts local connections: the test user's
  # TCP logins are checked (scram-sha-256), by lines ahead of every other.
  local hba
  hba=$(psql_admin -Atc 'SHOW hba_file')
  local user
  for user in "$DS_USER" "$SEED_USER"; do
    if [ -w "$hba" ] && ! grep -q "^host all $user " "$hba"; then
      { printf 'host all %s 127.0.0.1/32 scram-sha-256\nhost all %s ::1/128 scram-sha-256\n' "$user" "$user"
        cat "$hba"; } >"$hba.fleet" && cat "$hba.fleet" >"$hba" && rm -f "$hba.fleet"
      psql_admin -c 'SELECT pg_reload_conf()' >/dev/null
    fi
  done
  psql_admin <<SQL
SET password_encryption = 'scram-sha-256';
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$DS_USER') THEN CREATE ROLE $DS_USER LOGIN; END IF;
END \$\$;
ALTER ROLE $DS_USER LOGIN PASSWORD '$DS_PASSWORD';
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$SEED_USER') THEN CREATE ROLE $SEED_USER LOGIN; END IF;
END \$\$;
ALTER ROLE $SEED_USER LOGIN PASSWORD '$SEED_PASSWORD';
SQL
  local database
  for database in "$DS_DATABASE" "$SEED_DATABASE"; do
    if [ -z "$(psql_admin -Atc "SELECT 1 FROM pg_database WHERE datname = '$database'")" ]; then
      psql_admin -c "CREATE DATABASE $database OWNER $DS_USER" >/dev/null
    fi
  done
  # What fleet_test makes in `sales` the seed's user may read, and nothing more.
  psql_admin -d "$SEED_DATABASE" \
    -c "ALTER DEFAULT PRIVILEGES FOR ROLE $DS_USER IN SCHEMA public GRANT SELECT ON TABLES TO $SEED_USER" >/dev/null
  echo "ensure-services: PostgreSQL 127.0.0.1:5432 is up ($DS_USER owns $DS_DATABASE and $SEED_DATABASE)"
}

# The MariaDB client as root: through the local socket when root, else over TCP.
mariadb_admin() {
  local client
  client=$(command -v mariadb || command -v mysql)
  if [ "$(id -u)" = 0 ]; then "$client" -uroot "$@"; else "$client" -uroot -h127.0.0.1 "$@"; fi
}

ensure_mariadb() {
  if ! port_open 3306; then
    command -v mariadbd >/dev/null || command -v mysqld >/dev/null || [ -x /usr/sbin/mariadbd ] \
      || install_pkg mariadb-server
    echo "ensure-services: starting MariaDB"
    if ! service mariadb start >/dev/null 2>&1; then
      mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
      (setsid mysqld_safe --bind-address=127.0.0.1 >/dev/null 2>&1 &)
    fi
    wait_port 3306 MariaDB
  fi
  # The test databases are `t_…`: the user may make and drop those, and nothing else but its own.
  mariadb_admin <<SQL
CREATE DATABASE IF NOT EXISTS $DS_DATABASE;
CREATE USER IF NOT EXISTS '$DS_USER'@'localhost' IDENTIFIED BY '$DS_PASSWORD';
CREATE USER IF NOT EXISTS '$DS_USER'@'%' IDENTIFIED BY '$DS_PASSWORD';
ALTER USER '$DS_USER'@'localhost' IDENTIFIED BY '$DS_PASSWORD';
ALTER USER '$DS_USER'@'%' IDENTIFIED BY '$DS_PASSWORD';
GRANT ALL PRIVILEGES ON \`$DS_DATABASE\`.* TO '$DS_USER'@'localhost', '$DS_USER'@'%';
GRANT ALL PRIVILEGES ON \`t\\_%\`.* TO '$DS_USER'@'localhost', '$DS_USER'@'%';
CREATE DATABASE IF NOT EXISTS $SEED_DATABASE;
GRANT ALL PRIVILEGES ON \`$SEED_DATABASE\`.* TO '$DS_USER'@'localhost', '$DS_USER'@'%';
CREATE USER IF NOT EXISTS '$SEED_USER'@'localhost' IDENTIFIED BY '$SEED_PASSWORD';
CREATE USER IF NOT EXISTS '$SEED_USER'@'%' IDENTIFIED BY '$SEED_PASSWORD';
ALTER USER '$SEED_USER'@'localhost' IDENTIFIED BY '$SEED_PASSWORD';
ALTER USER '$SEED_USER'@'%' IDENTIFIED BY '$SEED_PASSWORD';
GRANT SELECT ON \`$SEED_DATABASE\`.* TO '$SEED_USER'@'localhost', '$SEED_USER'@'%';
FLUSH PRIVILEGES;
SQL
  echo "ensure-services: MariaDB 127.0.0.1:3306 is up ($DS_USER owns $DS_DATABASE, $SEED_DATABASE and t_* databases)"
}

if [ "${FLEET_TEST_DATABASES:-1}" != 0 ]; then
  ensure_postgres
  ensure_mariadb
fi
echo "ensure-services: RabbitMQ 127.0.0.1:5672 and Redis 127.0.0.1:6379 are up"
