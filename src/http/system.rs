//! System switches. Pop maintenance: while on, every pop answers 204 at once
//! with no work done. The switch is per broker process and not persisted.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;

pub async fn get_pop_maintenance(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"enabled": state.pop.maintenance()}))
}

pub async fn set_pop_maintenance(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = super::body::read_limited(&headers, body, 4096).await?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::BadRequest(format!("bad body: {e}")))?;
    let enabled =
        v.get("enabled").and_then(Value::as_bool).ok_or_else(|| ApiError::BadRequest("enabled: required, a boolean".into()))?;
    state.pop.set_maintenance(enabled);
    tracing::info!(enabled, "pop maintenance switched");
    Ok(Json(json!({"enabled": enabled})))
}
