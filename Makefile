# The two commands: `make demo` (a local fleet with a demo turn of the callback pipeline) and
# `make test` (the whole suite). `make bench` measures the fleet against the raw broker
# (`make bench-peers` against Celery);
# `make bench-streams` measures session streams at scale.
SHELL := /bin/bash
.PHONY: demo test test-rust check-monitoring check-chart check-api bench bench-peers bench-streams soak failover lint

demo:
	scripts/ensure-services.sh
	cargo build --workspace --bins
	scripts/demo.sh

test: check-monitoring check-chart test-rust check-api

# broker_restart stops the shared RabbitMQ and broker_blocked blocks it with a memory alarm, so
# each runs alone after everything else; so do redis_failover (a 6-node Redis Cluster of its own,
# 2,000 jobs) and broker_cluster (a 3-node RabbitMQ cluster of its own, one test at a time).
test-rust:
	scripts/ensure-services.sh
	scripts/ensure-chromium.sh
	cargo build --workspace --all-targets
	if cargo nextest --version >/dev/null 2>&1; then \
	  cargo nextest run --workspace --no-fail-fast --test-threads 8 -E '$(ALONE_EXCLUDED)' && \
	  cargo nextest run --workspace --no-fail-fast -E 'binary(broker_restart)' && \
	  cargo nextest run --workspace --no-fail-fast -E 'binary(broker_blocked)' && \
	  cargo nextest run --workspace --no-fail-fast -E 'binary(redis_failover)' && \
	  cargo nextest run --workspace --no-fail-fast --test-threads 1 -E 'binary(broker_cluster)'; \
	else \
	  cargo test --workspace --no-fail-fast -- --test-threads 8 --skip a_broker_restart --skip a_publish_unconfirmed_while_the_broker_is_blocked \
	    --skip a_cluster_losing_its_leader --skip a_dispatcher_that_reconnected_during --skip a_node_cut_off_the_network --skip a_redis_master_killed && \
	  cargo test -p fleet-tests --test broker_restart && \
	  cargo test -p fleet-tests --test broker_blocked && \
	  cargo test -p fleet-tests --test redis_failover && \
	  cargo test -p fleet-tests --test broker_cluster -- --test-threads 1; \
	fi

ALONE_EXCLUDED := not binary(broker_restart) and not binary(broker_blocked) and not binary(broker_cluster) and not binary(redis_failover)

# The failover figures at a larger size (CI runs 2,000 jobs each): the RabbitMQ cluster losing its
# leader, restarted node by node and partitioned, and the Redis Cluster losing a master.
failover:
	scripts/ensure-services.sh
	cargo build --workspace --all-targets
	FLEET_CLUSTER_JOBS=$${FLEET_CLUSTER_JOBS:-10000} cargo nextest run -p fleet-tests --test broker_cluster --test-threads 1 --no-capture
	FLEET_FAILOVER_JOBS=$${FLEET_FAILOVER_JOBS:-10000} cargo nextest run -p fleet-tests --test redis_failover --no-capture

# The chaos soak at full size (CI runs it with 2000 jobs).
soak:
	scripts/ensure-services.sh
	cargo build --workspace --all-targets
	FLEET_SOAK_JOBS=10000 cargo nextest run -p fleet-tests --test chaos --no-capture

# The API contract: schemathesis against a real dispatcher with docs/openapi.json (see README).
check-api:
	scripts/ensure-services.sh
	cargo build --workspace --bins
	scripts/check-api.sh

check-monitoring:
	bash deploy/prometheus/check.sh

check-chart:
	bash helm/check.sh

bench:
	scripts/ensure-services.sh
	cargo build --release --workspace --bins
	target/release/fleet-bench

# The drain beside Celery 5.7 (from PyPI, into a venv under ~/.cache) doing the same signed
# callback on the same broker, Redis and receiver; optional, not part of `make test`.
bench-peers:
	scripts/ensure-services.sh
	scripts/bench-peers/ensure-celery.sh
	cargo build --release --workspace --bins
	FLEET_BENCH_PEERS=1 target/release/fleet-bench

# Session SSE streams at scale: Redis commands/s with 2,000 and 10,000 idle streams, event latency
# with 1,000 streams each receiving a turn, dispatcher RSS (its own redis-server; raises ulimit -n).
bench-streams:
	scripts/ensure-services.sh
	cargo build --release --workspace --bins
	target/release/fleet-stream-bench

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
