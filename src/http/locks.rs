//! `POST /api/v1/locks` (issue 29 §2): parse, hand to `locks`, render with
//! the KV envelope (a permit is a KV row, so KV's switch covers locks too).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::kv::{disabled, envelope, json_body, unavailable};
use super::AppState;

pub async fn locks(
    State(state): State<AppState>,
    tenant: crate::tenancy::Tenant,
    principal: Option<axum::Extension<super::auth::Principal>>,
    headers: HeaderMap,
    raw: axum::body::Body,
) -> Response {
    if let Some(r) = disabled(&state) {
        return r;
    }
    let body = match json_body(&state, &headers, raw, "locks_bad_request").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let ops = match crate::locks::parse(&body) {
        Ok(ops) => ops,
        Err(e) => {
            let status = if e.too_many { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::BAD_REQUEST };
            return envelope(status, "locks_bad_request", e.reason, &e.detail);
        }
    };
    // A permit is a KV row: a get reads one, the others write one.
    let reads = ops.iter().filter(|op| matches!(op, crate::locks::LockOp::Get { .. })).count() as u64;
    if let Err(r) = state.quotas.kv(tenant, reads, ops.len() as u64 - reads) {
        return r.into_response();
    }
    match crate::locks::run(&state.pool, tenant, &ops, principal.as_ref().and_then(|p| p.sub.as_deref())).await {
        Ok(results) => Json(json!({"results": results})).into_response(),
        Err(e) => unavailable(e),
    }
}
