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
use crate::tenancy::Tenant;

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
    tenant: Tenant,
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
    let (name, source) = (tenant.stored(&r.name), tenant.stored(&r.source));
    let sink = r.sink.as_deref().map(|s| tenant.stored(s));
    match streams::register(&state.pool, tenant, &name, &source, sink.as_deref(), &r.hash, r.reset).await? {
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
                state.pop.hotlist.forget(Some(&source), Some(&streams::default_group(&name)));
            }
            Ok(Json(json!({"success": true, "query_id": id, "name": r.name, "config_hash": r.hash, "fresh": fresh, "reset": reset})).into_response())
        }
    }
}

/// `POST /streams/v1/state/get`.
pub async fn state_get(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, raw: axum::body::Body) -> Result<Response, ApiError> {
    let v = match body(&state, &headers, raw).await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    match parse::state_get(&v) {
        Ok(q) if q.keys.len() > streams::STATE_GET_MAX_ROWS as usize => {
            Ok(refused(StatusCode::PAYLOAD_TOO_LARGE, format!("keys: at most {} per call, got {}", streams::STATE_GET_MAX_ROWS, q.keys.len())))
        }
        // Another tenant's query reads as an unregistered one: no rows.
        Ok(q) if tenancy_on(&state) && !streams::owned(&state.pool, tenant, q.query).await? => {
            Ok(Json(json!({"success": true, "rows": []})).into_response())
        }
        Ok(q) => match streams::state(&state.pool, &q).await? {
            Ok(answer) => Ok(Json(answer).into_response()),
            Err(too_much) => Ok(refused(StatusCode::PAYLOAD_TOO_LARGE, too_much)),
        },
        Err(e) => Ok(refused(StatusCode::BAD_REQUEST, e)),
    }
}

/// `POST /streams/v1/cycle`.
fn tenancy_on(state: &AppState) -> bool {
    crate::tenancy::enabled(&state.config)
}

pub async fn cycle(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, raw: axum::body::Body) -> Result<Response, ApiError> {
    let v = match body(&state, &headers, raw).await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let c = match parse::cycle(&v) {
        Ok(c) => c,
        Err(e) => return Ok(refused(StatusCode::BAD_REQUEST, e)),
    };
    let mut foreign = false;
    if tenancy_on(&state) {
        if !streams::owned(&state.pool, tenant, c.query).await? {
            return Ok(Json(streams::not_registered(c.query)).into_response());
        }
        foreign = !state.owners.foreign(&state.pool, tenant, &[c.partition_id]).await?.is_empty();
    }
    let mut push_items: Vec<PushItem<'_>> = c
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
    tenant.own(&mut push_items);
    state.quotas.push_items(tenant, &push_items)?;
    let cycle = streams::Cycle {
        query: c.query,
        partition_id: c.partition_id,
        foreign,
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
