//! `POST /api/v1/ack`, `POST /api/v1/ack/batch` (API.md §2.3) and
//! `POST /api/v1/lease/{leaseId}/extend` (§2.5). Both ack routes always
//! answer 200 with an array in request order; refusals are per item.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::body::read_limited;
use super::error::ApiError;
use super::AppState;
use crate::ack::{AckItem, AckOutcome, AckStatus, Released};
use crate::pop::QUEUE_MODE;

async fn json_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Option<Value>, ApiError> {
    let bytes = read_limited(headers, body, state.config.max_body_bytes).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| ApiError::BadRequest(format!("bad body: {e}")))
}

/// `consumerGroup`: null or absent is queue mode.
fn group_of(v: &Value, fallback: &str) -> String {
    v.get("consumerGroup").and_then(Value::as_str).filter(|g| !g.is_empty()).unwrap_or(fallback).to_string()
}

fn status_of(v: &Value) -> AckStatus {
    match v.get("status") {
        Some(Value::Bool(true)) => AckStatus::Completed,
        Some(Value::Bool(false)) => AckStatus::Failed,
        Some(Value::String(s)) => AckStatus::normalize(Some(s)),
        _ => AckStatus::normalize(None),
    }
}

/// One acknowledgement; `Err` names the field that is missing or not a string.
fn item_of(v: &Value, group: &str) -> Result<AckItem, String> {
    if !v.is_object() {
        return Err("must be an object".into());
    }
    let field = |k: &str| match v.get(k) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => Err(format!("{k}: required, a non-empty string")),
        Some(_) => Err(format!("{k}: must be a string")),
    };
    Ok(AckItem {
        transaction_id: field("transactionId")?,
        partition_id: field("partitionId")?,
        status: status_of(v),
        error: v.get("error").and_then(Value::as_str).map(str::to_string),
        lease_id: v.get("leaseId").and_then(Value::as_str).filter(|l| !l.is_empty()).map(str::to_string),
        group: group_of(v, group),
    })
}

fn render(o: &AckOutcome) -> Value {
    json!({"index": o.index, "transactionId": o.transaction_id, "success": o.success, "error": o.error,
           "leaseReleased": o.lease_released, "dlq": o.dlq, "noop": o.noop})
}

/// A released lease may leave messages behind it (the rest of a partly
/// acked batch, a nacked one, new pushes that piled up meanwhile): wake the
/// queue's parked long-polls rather than let them wait out their backoff.
fn wake_after(state: &AppState, released: &[Released]) {
    for r in released {
        if let Some(q) = &r.queue {
            state.pop.wake.pushed(q);
        }
    }
}

pub async fn ack_one(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Result<Json<Value>, ApiError> {
    let v = json_body(&state, &headers, body).await?.ok_or_else(|| ApiError::BadRequest("bad body: empty".into()))?;
    let item = item_of(&v, QUEUE_MODE).map_err(ApiError::BadRequest)?;
    let (outcomes, released) = state.ack.ack(std::slice::from_ref(&item)).await.map_err(ApiError::from)?;
    state.count_acks(&outcomes);
    wake_after(&state, &released);
    Ok(Json(Value::Array(outcomes.iter().map(render).collect())))
}

pub async fn ack_batch(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Result<Json<Value>, ApiError> {
    let v = json_body(&state, &headers, body).await?.ok_or_else(|| ApiError::BadRequest("bad body: empty".into()))?;
    let list = v
        .get("acknowledgments")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::BadRequest("acknowledgments: required, an array".into()))?;
    let group = group_of(&v, QUEUE_MODE);
    let mut valid = Vec::new();
    let mut answers: Vec<Option<Value>> = vec![None; list.len()];
    let mut positions = Vec::new();
    for (i, a) in list.iter().enumerate() {
        match item_of(a, &group) {
            Ok(item) => {
                positions.push(i);
                valid.push(item);
            }
            Err(e) => {
                let txn = a.get("transactionId").cloned().unwrap_or(Value::Null);
                answers[i] = Some(json!({"index": i, "transactionId": txn, "success": false, "error": e,
                                         "leaseReleased": false, "dlq": false, "noop": false}));
            }
        }
    }
    if !valid.is_empty() {
        let (outcomes, released) = state.ack.ack(&valid).await.map_err(ApiError::from)?;
        state.count_acks(&outcomes);
        wake_after(&state, &released);
        for (o, &i) in outcomes.iter().zip(&positions) {
            let mut r = render(o);
            r["index"] = json!(i);
            answers[i] = Some(r);
        }
    }
    Ok(Json(Value::Array(answers.into_iter().map(|a| a.expect("every ack answered")).collect())))
}

pub async fn extend_lease(
    State(state): State<AppState>,
    Path(lease_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    // Empty, absent or unparseable: 60 seconds.
    let seconds = json_body(&state, &headers, body)
        .await
        .ok()
        .flatten()
        .and_then(|v| v.get("seconds").and_then(Value::as_i64))
        .filter(|s| *s > 0)
        .unwrap_or(60)
        .min(i32::MAX as i64) as i32;
    let (renewed, expires) = state.ack.extend(&lease_id, seconds).await.map_err(ApiError::from)?;
    let at = expires.map(|t| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string());
    Ok(Json(json!({"leaseId": lease_id, "success": renewed > 0, "renewed": renewed,
                   "newExpiresAt": at, "expiresAt": at, "lease_expires_at": at})))
}

/// `POST /api/v1/transaction`: the JSON form, or a binary `QTB1` body.
pub async fn transaction(
    State(state): State<AppState>,
    principal: Option<axum::Extension<super::auth::Principal>>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::response::Response, ApiError> {
    let producer = principal.and_then(|p| p.0.sub);
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use crate::ack::transaction::{run, TxnError};
    let bytes = read_limited(&headers, body, state.config.max_body_bytes).await?;
    let refused = |status: StatusCode, error: String| {
        (status, Json(json!({"transactionId": uuid::Uuid::now_v7().to_string(), "success": false, "error": error, "results": []})))
            .into_response()
    };
    // Dispatched on the magic, not the content type (API.md §6 A-12).
    let parsed;
    let binary_items;
    let (text, pushes, counts_only) = if bytes.starts_with(b"QTB1") {
        parsed = match crate::log::binary::parse_transaction(&bytes, state.config.max_body_bytes) {
            Ok(p) => p,
            Err(e) => return Ok(refused(StatusCode::BAD_REQUEST, e.to_string())),
        };
        binary_items = match crate::push::validate::from_binary(&parsed.items) {
            Ok(items) => items,
            Err(e) => return Ok(refused(StatusCode::BAD_REQUEST, e)),
        };
        (parsed.head.as_str(), binary_items.as_slice(), parsed.counts_only)
    } else {
        let text = std::str::from_utf8(&bytes).map_err(|e| ApiError::BadRequest(format!("bad body: not UTF-8: {e}")))?;
        (text, &[][..], false)
    };
    match run(&state.pool, &state.ack, state.config.coalesce.zstd_level, text, pushes, counts_only, producer.as_deref()).await {
        Ok(done) => {
            for (queue, pid, partition, n) in &done.pushed {
                state.committed_push(queue, *pid, partition, *n);
            }
            wake_after(&state, &done.released);
            Ok(Json(done.answer).into_response())
        }
        Err(TxnError::BadRequest(e)) => Ok(refused(StatusCode::BAD_REQUEST, e)),
        Err(TxnError::RidersDisabled) => Ok(refused(StatusCode::FORBIDDEN, TxnError::RidersDisabled.to_string())),
        Err(TxnError::Db(e)) => Err(e.into()),
    }
}
