//! The cross-process suite as one test binary: one module per area, each against real dispatcher
//! and worker processes, RabbitMQ and Redis. The tests that stop, block or cluster the shared
//! services (`broker_restart`, `broker_blocked`, `broker_cluster`, `redis_failover`) are binaries
//! of their own beside this one, so they can run alone.

// Every other file of this folder is a module: `build.rs` declares them.
include!(concat!(env!("OUT_DIR"), "/fleet_modules.rs"));
