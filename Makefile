# The two commands: `make demo` (a local fleet with a demo turn of the callback pipeline) and
# `make test` (the whole suite). `make bench` measures the fleet against the raw broker.
SHELL := /bin/bash
.PHONY: demo test test-rust check-monitoring check-chart bench lint

demo:
	scripts/ensure-services.sh
	cargo build --workspace --bins
	scripts/demo.sh

test: check-monitoring check-chart test-rust

test-rust:
	scripts/ensure-services.sh
	cargo build --workspace --all-targets
	if cargo nextest --version >/dev/null 2>&1; then \
	  cargo nextest run --workspace --no-fail-fast --test-threads 8; \
	else \
	  cargo test --workspace --no-fail-fast -- --test-threads 8; \
	fi

check-monitoring:
	bash deploy/prometheus/check.sh

check-chart:
	bash helm/check.sh

bench:
	scripts/ensure-services.sh
	cargo build --release --workspace --bins
	target/release/fleet-bench

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
