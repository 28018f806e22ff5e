//! `GET /health` (API.md §2.9): healthy exactly when a trivial round trip to
//! PostgreSQL works right now and reaches a primary (a standby cannot take
//! a write).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;

pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let version = env!("CARGO_PKG_VERSION");
    // Pushes answered from the spool while the database was away, not yet
    // replayed: an operator watching a failover sees them drain.
    let spooled = state.spool.as_ref().is_some_and(|s| s.has_pending());
    match crate::db::ping(&state.pool).await {
        Ok(p) if !p.in_recovery => (
            StatusCode::OK,
            Json(json!({"status": "healthy", "database": "connected", "engine": "postgres", "version": version,
                        "spoolPending": spooled})),
        ),
        // Reachable but a standby: nothing can be written until it is
        // promoted (or the URL lists the primary too).
        Ok(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unhealthy", "database": "read-only", "engine": "postgres", "version": version,
                        "spoolPending": spooled, "error": "the database is a standby (in recovery)"})),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unhealthy", "database": "disconnected", "engine": "postgres",
                        "version": version, "spoolPending": spooled, "error": e.to_string()})),
        ),
    }
}
