//! The cross-process suite as one test binary: one module per area, each against real dispatcher
//! and worker processes, RabbitMQ and Redis. The tests that stop, block or cluster the shared
//! services (`broker_restart`, `broker_blocked`, `broker_cluster`, `redis_failover`) are binaries
//! of their own beside this one, so they can run alone.

mod acceptance;
mod api;
mod api_surface;
mod batch;
mod browser_stream;
mod callbacks;
mod cancel;
mod chaos;
mod checker;
mod circuit;
mod console;
mod console_browser;
mod dead_letters;
mod deployment;
mod events;
mod exactly_once;
mod fair_calls;
mod faults;
mod hostile;
mod image;
mod isolation;
mod layers;
mod llm_budget;
mod observability;
mod outbound;
mod redis_cluster;
mod redis_round_trips;
mod response_table;
mod retry_policy;
mod retry_timing;
mod seed_agents;
mod seed_events;
mod seed_receiver;
mod seed_streaming;
mod session_streams;
mod sessions;
mod signatures;
mod step_copies;
mod stream_access;
mod tenant_walk;
mod tenants;
mod tls;
mod tool_limits;
mod tools;
mod turn_defects;
mod turn_inputs;
mod turn_life;
mod turn_stream;
mod turns;
mod worker_bounds;
