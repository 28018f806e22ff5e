//! `/streams/v1/*` (issue 30): registration, state reads and the cycle.
//! Parse, hand to `streams`, render. Every answer carries `success`; a
//! business refusal is `200 {success: false, error}` (the client raises on
//! it), a malformed body `400` with the same shape.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::push::validate::PushItem;
use crate::streams::{self, parse, Registered};

fn refused(status: StatusCode, error: String) -> Response {
    (status, Json(json!({"success": false, "error": error}))).into_response()
}

async fn body(state: &AppState, headers: &HeaderMap, raw: axum::body::Body) -> Result<Value, Response> {
    match super::body::optional_json(state, headers, raw).await {
        Ok(v) => Ok(v.unwrap_or(Value::Null)),
        Err(ApiError::BadRequest(e)) => Err(refused(StatusCode::BAD_REQUEST, e)),
        Err(other) => Err(other.into_response()),
    }
}

/// `POST /streams/v1/queries`.
pub async fn register(
    State(state): State<AppState>,
    principal: Option<axum::Extension<super::auth::Principal>>,
    headers: HeaderMap,
    raw: axum::body::Body,
) -> Result<Response, ApiError> {
    let v = match body(&state, &headers, raw).await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let r = match parse::register(&v) {
        Ok(r) => r,
        Err(e) => return Ok(refused(StatusCode::BAD_REQUEST, e)),
    };
    // A reset deletes the query's consumer group, as DELETE
    // /api/v1/consumer-groups/… does: admin.
    if r.reset && !super::auth::permits(principal.as_ref().map(|p| &p.0), super::auth::Level::Admin) {
        return Ok(super::auth::insufficient("reset: discarding a query's state and cursors needs admin"));
    }
    match streams::register(&state.pool, &r.name, &r.source, r.sink.as_deref(), &r.hash, r.reset).await? {
        Registered::Conflict { stored_hash } => Ok(refused(
            StatusCode::CONFLICT,
            format!(
                "config_hash mismatch: query {:?} is registered with config_hash {stored_hash:?}, this registration has {:?}; pass reset to start it over",
                r.name, r.hash
            ),
        )),
        Registered::Ok { id, fresh, reset } => {
            if reset {
                // From scratch: the default group's cursors went with the
                // state (streams::register); its candidate ring goes too.
                state.pop.hotlist.forget(Some(&r.source), Some(&streams::default_group(&r.name)));
            }
            Ok(Json(json!({"success": true, "query_id": id, "name": r.name, "config_hash": r.hash, "fresh": fresh, "reset": reset})).into_response())
        }
    }
}

/// `POST /streams/v1/state/get`.
pub async fn state_get(State(state): State<AppState>, headers: HeaderMap, raw: axum::body::Body) -> Result<Response, ApiError> {
    let v = match body(&state, &headers, raw).await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    match parse::state_get(&v) {
        Ok(q) if q.keys.len() > streams::STATE_GET_MAX_ROWS as usize => {
            Ok(refused(StatusCode::PAYLOAD_TOO_LARGE, format!("keys: at most {} per call, got {}", streams::STATE_GET_MAX_ROWS, q.keys.len())))
        }
        Ok(q) => match streams::state(&state.pool, &q).await? {
            Ok(answer) => Ok(Json(answer).into_response()),
            Err(too_much) => Ok(refused(StatusCode::PAYLOAD_TOO_LARGE, too_much)),
        },
        Err(e) => Ok(refused(StatusCode::BAD_REQUEST, e)),
    }
}

/// `POST /streams/v1/cycle`.
pub async fn cycle(State(state): State<AppState>, headers: HeaderMap, raw: axum::body::Body) -> Result<Response, ApiError> {
    let v = match body(&state, &headers, raw).await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let c = match parse::cycle(&v) {
        Ok(c) => c,
        Err(e) => return Ok(refused(StatusCode::BAD_REQUEST, e)),
    };
    let push_items: Vec<PushItem<'_>> = c
        .pushes
        .iter()
        .map(|(queue, partition, payload, txn)| PushItem {
            queue: queue.as_str().into(),
            partition: partition.as_str().into(),
            transaction_id: txn.as_deref().map(Into::into),
            trace_id: None,
            payload,
            message_id: None,
        })
        .collect();
    let cycle = streams::Cycle {
        query: c.query,
        partition_id: c.partition_id,
        group: c.group.clone(),
        state_ops: c.state_ops.clone(),
        push_items,
        ack: c.ack.clone(),
        release_lease: c.release_lease,
    };
    match streams::cycle(&state.pool, &state.ack, &state.coalescer, &cycle).await {
        Ok(done) => {
            for (queue, pid, partition, n) in &done.pushed {
                state.committed_push(queue, *pid, partition, *n);
            }
            super::ack::wake_after(&state, &done.released);
            Ok(Json(done.answer).into_response())
        }
        Err(crate::ack::transaction::TxnError::Db(e)) => Err(e.into()),
        Err(crate::ack::transaction::TxnError::NoKey(k)) => Err(super::error::ApiError::NoKey(k.to_string())),
        Err(e) => Ok(refused(StatusCode::BAD_REQUEST, e.to_string())),
    }
}
