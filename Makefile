# The two commands: `make demo` (a local fleet with a demo turn of the callback pipeline) and
# `make test` (the whole suite). `make bench` measures the fleet against the raw broker
# (`make bench-peers` against Celery);
# `make bench-streams` measures session streams at scale. `make image` builds the container image.
SHELL := /bin/bash
.PHONY: demo test test-rust check-docs check-monitoring check-chart check-api check-mcp bench bench-budget bench-peers bench-streams bench-console soak failover lint image

demo:
	scripts/ensure-services.sh
	cargo build --workspace --bins
	scripts/demo.sh

test: check-docs check-monitoring check-chart test-rust check-api check-mcp

# broker_restart stops the shared RabbitMQ and broker_blocked blocks it with a memory alarm, so
# each runs alone after everything else; so do redis_failover (a 6-node Redis Cluster of its own,
# 2,000 jobs) and broker_cluster (a 3-node RabbitMQ cluster of its own, one test at a time).
test-rust:
	scripts/ensure-services.sh
	scripts/ensure-chromium.sh
	scripts/ensure-seed-clients.sh
	scripts/ensure-mcp.sh
	scripts/ensure-podman.sh
	cargo build --workspace --all-targets
	if cargo nextest --version >/dev/null 2>&1; then \
	  cargo nextest run --workspace --no-fail-fast --test-threads 8 -E '$(ALONE_EXCLUDED)' && \
	  cargo nextest run --workspace --no-fail-fast -E 'binary(broker_restart)' && \
	  cargo nextest run --workspace --no-fail-fast --test-threads 1 -E 'binary(broker_blocked)' && \
	  cargo nextest run --workspace --no-fail-fast -E 'binary(redis_failover)' && \
	  cargo nextest run --workspace --no-fail-fast --test-threads 1 -E 'binary(broker_cluster)'; \
	else \
	  cargo test --workspace --no-fail-fast -- --test-threads 8 --skip a_broker_restart --skip a_publish_unconfirmed_while_the_broker_is_blocked \
	    --skip a_cluster_losing_its_leader --skip a_dispatcher_that_reconnected_during --skip a_node_cut_off_the_network --skip a_redis_master_killed && \
	  cargo test -p fleet-tests --test broker_restart && \
	  cargo test -p fleet-tests --test broker_blocked -- --test-threads 1 && \
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

# The soaks at full size: the chaos soak (CI runs it with 2000 jobs) and the exactly-once checker
# with workers SIGKILLed (CI runs it small, without kills).
soak:
	scripts/ensure-services.sh
	cargo build --workspace --all-targets
	FLEET_SOAK_JOBS=10000 cargo nextest run -p fleet-tests --test fleet --no-capture -E 'test(/^chaos::/)'
	FLEET_CHECKER_SCALE=$${FLEET_CHECKER_SCALE:-50} cargo nextest run -p fleet-tests --test fleet --no-capture -E 'test(/^checker::/)'

# The API contract: schemathesis against a real dispatcher with docs/openapi.json (see docs/testing.md).
check-api:
	scripts/ensure-services.sh
	cargo build --workspace --bins
	scripts/check-api.sh

# The MCP conformance suite's client scenarios against `fleetctl mcp conformance`.
check-mcp:
	scripts/ensure-mcp.sh
	cargo build -p fleetctl
	scripts/check-mcp-conformance.sh

# The documentation: relative links and anchors in every Markdown page resolve, and every path
# ARCHITECTURE.md names exists (offline; see docs/testing.md).
check-docs:
	bash scripts/check-docs.sh

check-monitoring:
	bash deploy/prometheus/check.sh

check-chart:
	bash helm/check.sh

# The container image without a registry (see docs/images.md): release binaries on a Debian base
# made by mmdebstrap, built with podman from deploy/Dockerfile's runtime stage. Writes
# localhost/agent-fleet:<version>, and target/image/agent-fleet_<version>.{tar,cdx.json} (the
# image as a docker-archive and its CycloneDX SBOM). The image test (tests/tests/fleet/image.rs, part of
# `make test`) builds the same recipe from the debug binaries.
image:
	scripts/ensure-podman.sh
	cargo build --release --locked -p fleet-dispatcher -p fleet-worker -p fleetctl
	scripts/image.sh --save

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

# Only the bench's last part: two tenants' turns against a provider enforcing 600 requests and
# 200,000 tokens a minute, the fleet's budget just under it (docs/performance.md).
bench-budget:
	scripts/ensure-services.sh
	cargo build --release --workspace --bins
	FLEET_BENCH_BUDGET=1 target/release/fleet-bench

# Session SSE streams at scale: Redis commands/s with 2,000 and 10,000 idle streams, event latency
# with 1,000 streams each receiving a turn, dispatcher RSS (its own redis-server; raises ulimit -n).
bench-streams:
	scripts/ensure-services.sh
	cargo build --release --workspace --bins
	target/release/fleet-stream-bench

# The console's page timings with 1,000,000 executions and 100,000 dead letters (docs/console.md).
bench-console:
	scripts/ensure-services.sh
	cargo build --workspace --bins
	target/debug/fleet-console-bench

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
