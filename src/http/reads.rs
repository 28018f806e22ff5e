//! The lease-free reads of the log (issue 28 §2): fetch by offset and
//! partition discovery.
//! Parse, hand to `reads`, render.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::AppState;

/// `POST /api/v1/partitions/changed`.
pub async fn partitions_changed(State(state): State<AppState>, headers: HeaderMap, body: axum::body::Body) -> Result<Response, ApiError> {
    let v = super::body::optional_json(&state, &headers, body).await?.unwrap_or(serde_json::Value::Null);
    let entries = crate::reads::changed::parse(&v).map_err(ApiError::BadRequest)?;
    Ok(Json(crate::reads::changed::answer(&state.pool, &entries).await?).into_response())
}

/// `POST /api/v1/fetch`.
pub async fn fetch(State(state): State<AppState>, headers: HeaderMap, body: axum::body::Body) -> Result<Response, ApiError> {
    let v = super::body::optional_json(&state, &headers, body).await?.unwrap_or(serde_json::Value::Null);
    let req = crate::reads::fetch::parse(&v).map_err(ApiError::BadRequest)?;
    let ring = state.coalescer.encryption().ring();
    let answer = crate::reads::fetch::fetch(&state.pool, ring, &state.pop.wake, state.pop.config(), &req).await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], answer.body).into_response())
}
