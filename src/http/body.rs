//! Reading request bodies under `QUEEN_MAX_BODY_BYTES`, so that an oversized
//! body is refused with a JSON 413 before it is buffered whole.

use axum::body::Body;
use axum::http::header::CONTENT_LENGTH;
use axum::http::HeaderMap;
use bytes::Bytes;
use std::sync::OnceLock;
use std::time::Duration;

use super::error::ApiError;

static BODY_TIMEOUT: OnceLock<Duration> = OnceLock::new();

/// Sets how long a request may take to send its body (once, at boot).
pub fn set_body_timeout(d: Duration) {
    let _ = BODY_TIMEOUT.set(d);
}

/// Reads the whole body, refusing anything over `limit` bytes, and any body
/// that does not arrive within the body timeout (a slow sender holds a
/// connection, never the broker).
pub async fn read_limited(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let announced = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let deadline = *BODY_TIMEOUT.get().unwrap_or(&Duration::from_secs(30));
    let read = tokio::time::timeout(deadline, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| ApiError::BodyTimeout { ms: deadline.as_millis() as u64 })?;
    read.map_err(|e| {
        let inner = e.into_inner();
        if inner.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            ApiError::PayloadTooLarge { limit }
        } else {
            ApiError::BadRequest(format!("bad body: {inner}"))
        }
    })
}

/// The body as text: every JSON body must be UTF-8.
pub fn utf8(bytes: &[u8]) -> Result<&str, ApiError> {
    std::str::from_utf8(bytes).map_err(|e| ApiError::BadRequest(format!("bad body: not UTF-8: {e}")))
}

/// A JSON body under `QUEEN_MAX_BODY_BYTES`; `None` for an empty one.
pub async fn optional_json(state: &super::AppState, headers: &HeaderMap, body: Body) -> Result<Option<serde_json::Value>, ApiError> {
    let bytes = read_limited(headers, body, state.config.max_body_bytes).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| ApiError::BadRequest(format!("bad body: {e}")))
}
