//! `GET /health` (API.md §2.9): healthy exactly when a trivial round trip to
//! PostgreSQL works right now.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;

pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let version = env!("CARGO_PKG_VERSION");
    match crate::db::ping(&state.pool).await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"status": "healthy", "database": "connected", "engine": "postgres", "version": version})),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unhealthy", "database": "disconnected", "engine": "postgres",
                        "version": version, "error": e.to_string()})),
        ),
    }
}
