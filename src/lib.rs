//! Queen: a partitioned message-queue broker on PostgreSQL.
//!
//! The layout follows the data (README.md, "Layout"): `http` is the thin
//! surface; `push` the write path, `pop` the claim path and `ack` the commit
//! path, with `registry` the leased batches those two share; `admin` and
//! `maintenance` the operator routes and the background services; `reads`
//! the lease-free reads of the log (fetch, partition discovery, traces,
//! analytics); `kv` the namespaced keys beside the log and `locks` the
//! permits kept as KV rows; `timers` the messages scheduled for later and
//! their fire service; `streams` the server half of the clients' stream
//! processors; `log` the
//! pure byte formats; `crypto` the envelope of encrypted payloads and the
//! key ring; `db` the pool, claim permits and migrations;
//! `embedded_pg` the private cluster used when no database is configured,
//! `config` every setting, and `app` boot and shutdown; `json` holds what the
//! body readers share, `cache` the per-queue settings copied into a broker.

pub mod ack;
pub mod admin;
pub mod app;
pub mod cache;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod crypto;
pub mod dashboard;
pub mod db;
pub mod embedded_pg;
pub mod ephemeral;
pub mod http;
pub mod json;
pub mod kafka;
pub mod kv;
pub mod locks;
pub mod log;
pub mod maintenance;
pub mod metrics;
pub mod pop;
pub mod push;
pub mod reads;
pub mod registry;
pub mod streams;
pub mod telemetry;
pub mod tenancy;
pub mod timers;
