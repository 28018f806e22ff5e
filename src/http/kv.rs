//! `POST /api/v1/kv`, the per-key sugar `GET|PUT|DELETE /api/v1/kv/{ns}/{key…}`
//! and the console reads under `/api/v1/resources/kv/` (issue 29 §1). Parse,
//! hand to `kv`, render; KV errors use the `{error, reason, detail}`
//! envelope the clients read.

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::query::Params;
use super::AppState;
use crate::kv::{self, KvError, Op};
use crate::tenancy::Tenant;

/// The parsed operations moved to `tenant`'s namespaces, once the
/// reserved-namespace rule has read the names as the client gave them.
fn parsed(state: &AppState, tenant: Tenant, operations: &Value) -> Result<Vec<Op>, Response> {
    let mut ops = kv::parse(operations, "operations", &state.config.kv.limits).map_err(refused)?;
    kv::refuse_reserved(&ops, "operations").map_err(refused)?;
    let reads = ops.iter().filter(|op| !op.is_write()).count() as u64;
    state.quotas.kv(tenant, reads, ops.len() as u64 - reads).map_err(IntoResponse::into_response)?;
    if !tenant.is_default() {
        ops.iter_mut().for_each(|op| op.own(tenant));
    }
    Ok(ops)
}

pub(super) fn envelope(status: StatusCode, error: &str, reason: &str, detail: &str) -> Response {
    let mut r = (status, Json(json!({"error": error, "reason": reason, "detail": detail}))).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    r
}

fn refused(e: KvError) -> Response {
    match e {
        KvError::BadRequest { reason, detail } => envelope(StatusCode::BAD_REQUEST, "kv_bad_request", reason, &detail),
        KvError::TooLarge { detail } => envelope(StatusCode::PAYLOAD_TOO_LARGE, "kv_value_too_large", "value_too_large", &detail),
        KvError::Reserved { detail } => envelope(StatusCode::FORBIDDEN, "kv_forbidden", "reserved_namespace", &detail),
    }
}

/// A database failure: the client may retry.
pub(super) fn unavailable(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "kv call failed");
    envelope(StatusCode::SERVICE_UNAVAILABLE, "kv_unavailable", "database", &e.to_string())
}

/// The switches: `QUEEN_KV_ENABLED=false` or `POST /api/v1/system/kv-timers`
/// answer every KV route 503.
pub(super) fn disabled(state: &AppState) -> Option<Response> {
    (!state.kv_enabled()).then(|| {
        envelope(StatusCode::SERVICE_UNAVAILABLE, "kv_disabled", "disabled", "KV is switched off (QUEEN_KV_ENABLED, or /api/v1/system/kv-timers)")
    })
}

/// A JSON body (absent: null); unreadable JSON is a `400 {error}` envelope.
pub(super) async fn json_body(state: &AppState, headers: &HeaderMap, body: axum::body::Body, error: &str) -> Result<Value, Response> {
    match super::body::optional_json(state, headers, body).await {
        Ok(v) => Ok(v.unwrap_or(Value::Null)),
        Err(super::error::ApiError::BadRequest(detail)) => Err(envelope(StatusCode::BAD_REQUEST, error, "invalid_body", &detail)),
        Err(other) => Err(other.into_response()),
    }
}

async fn body(state: &AppState, headers: &HeaderMap, body: axum::body::Body) -> Result<Value, Response> {
    json_body(state, headers, body, "kv_bad_request").await
}

async fn call(state: &AppState, ops: &[Op]) -> Response {
    match state.kv.call(ops).await {
        Ok(kv::Outcome { results, failed: None }) => Json(json!({"success": true, "results": results})).into_response(),
        Ok(kv::Outcome { results, failed: Some(i) }) => {
            let lost = &results[i];
            Json(json!({"success": false, "reason": "kv_precondition", "failedIndex": i, "kvReason": lost["reason"],
                        "version": lost["version"], "value": lost["value"], "results": results}))
            .into_response()
        }
        Err(e) => unavailable(e),
    }
}

/// `POST /api/v1/kv` `{operations: [...]}` (or a bare array).
pub async fn batch(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, raw: axum::body::Body) -> Response {
    if let Some(r) = disabled(&state) {
        return r;
    }
    let v = match body(&state, &headers, raw).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let operations = if v.is_array() { &v } else { v.get("operations").unwrap_or(&Value::Null) };
    match parsed(&state, tenant, operations) {
        Ok(ops) => call(&state, &ops).await,
        Err(r) => r,
    }
}

/// The one result of a single-operation call, or its failure.
async fn single(state: &AppState, tenant: Tenant, op: Value) -> Result<Value, Response> {
    let ops = parsed(state, tenant, &json!([op]))?;
    let mut outcome = state.kv.call(&ops).await.map_err(unavailable)?;
    // A per-key route answers its one row; a batch position means nothing there.
    let mut result = outcome.results.remove(0);
    if let Some(m) = result.as_object_mut() {
        m.remove("index");
    }
    Ok(result)
}

/// `GET /api/v1/kv/{ns}/{key…}`: the row, or `404 {found: false}`.
pub async fn get_key(State(state): State<AppState>, tenant: Tenant, Path((ns, key)): Path<(String, String)>) -> Response {
    if let Some(r) = disabled(&state) {
        return r;
    }
    match single(&state, tenant, json!({"op": "get", "ns": ns, "key": key})).await {
        Ok(v) if v["found"] == true => Json(v).into_response(),
        Ok(v) => (StatusCode::NOT_FOUND, Json(v)).into_response(),
        Err(r) => r,
    }
}

/// `PUT /api/v1/kv/{ns}/{key…}` `{value, ttlSeconds | forever, expect?}`.
pub async fn put_key(State(state): State<AppState>, tenant: Tenant, Path((ns, key)): Path<(String, String)>, headers: HeaderMap, raw: axum::body::Body) -> Response {
    if let Some(r) = disabled(&state) {
        return r;
    }
    let mut op = match body(&state, &headers, raw).await {
        Ok(Value::Object(m)) => Value::Object(m),
        Ok(_) => return envelope(StatusCode::BAD_REQUEST, "kv_bad_request", "invalid_body", "body: required, {value, ttlSeconds | forever, expect?}"),
        Err(r) => return r,
    };
    op["op"] = json!("put");
    op["ns"] = json!(ns);
    op["key"] = json!(key);
    single(&state, tenant, op).await.map(|v| Json(v).into_response()).unwrap_or_else(|r| r)
}

/// `DELETE /api/v1/kv/{ns}/{key…}` (`?expect=N`).
pub async fn delete_key(State(state): State<AppState>, tenant: Tenant, Path((ns, key)): Path<(String, String)>, RawQuery(q): RawQuery) -> Response {
    if let Some(r) = disabled(&state) {
        return r;
    }
    let mut op = json!({"op": "delete", "ns": ns, "key": key});
    match Params::parse(q).and_then(|p| p.int("expect", -1, 0, i64::MAX)) {
        Ok(-1) => {}
        Ok(e) => op["expect"] = json!(e),
        Err(e) => return envelope(StatusCode::BAD_REQUEST, "kv_bad_request", "invalid_expect", &e.to_string()),
    }
    single(&state, tenant, op).await.map(|v| Json(v).into_response()).unwrap_or_else(|r| r)
}

/// `GET /api/v1/resources/kv/namespaces`.
pub async fn namespaces(State(state): State<AppState>, tenant: Tenant) -> Response {
    match kv::namespaces(&state.pool, tenant).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => unavailable(e),
    }
}

/// `POST /api/v1/resources/kv/list` `{ns, prefix?, after?, limit?}`: keys
/// without values, a page at a time.
pub async fn list(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, raw: axum::body::Body) -> Response {
    let v = match body(&state, &headers, raw).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let text = |k: &str| v.get(k).and_then(Value::as_str);
    let Some(ns) = text("ns") else {
        return envelope(StatusCode::BAD_REQUEST, "kv_bad_request", "invalid_namespace", "ns: required, a string");
    };
    let limit = match v.get("limit") {
        None | Some(Value::Null) => kv::ops::DEFAULT_PREFIX_LIMIT,
        Some(l) => match l.as_i64() {
            Some(l) => l.clamp(1, state.config.kv.limits.max_prefix_limit),
            None => return envelope(StatusCode::BAD_REQUEST, "kv_bad_request", "invalid_field", "limit: must be an integer"),
        },
    };
    match kv::list(&state.pool, &tenant.stored(ns), text("prefix").unwrap_or(""), text("after"), limit).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => unavailable(e),
    }
}

/// `GET /api/v1/consumers` (`?group=`): the live consumers the clients'
/// supervision publishes.
pub async fn consumers(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Response {
    let group = match Params::parse(q) {
        Ok(p) => p.text("group"),
        Err(e) => return envelope(StatusCode::BAD_REQUEST, "kv_bad_request", "invalid_query", &e.to_string()),
    };
    match kv::supervision::consumers(&state.pool, tenant, group.as_deref()).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => unavailable(e),
    }
}
