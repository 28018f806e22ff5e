//! Dead letters and messages (API.md §2.8): `GET /api/v1/dlq`,
//! `GET /api/v1/messages`, and one message by address with its retry and
//! delete.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use super::query::Params;
use crate::admin::{dlq, messages};
use crate::tenancy::Tenant;

fn partition_id(raw: &str) -> Option<i64> {
    raw.trim().parse().ok()
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"error": "Message not found"}))).into_response()
}

/// The filters of the DLQ routes, from the query string (`queue` required),
/// on `tenant`'s queue of that name.
fn dlq_filter(p: &Params, tenant: Tenant) -> Result<dlq::DlqFilter, ApiError> {
    Ok(dlq::DlqFilter {
        queue: tenant.stored(&p.text("queue").ok_or_else(|| ApiError::BadRequest("queue: required".into()))?),
        group: p.text("consumerGroup").or_else(|| p.text("consumer_group")),
        partition: p.text("partition"),
        from: p.time("from")?,
        to: p.time("to")?,
        limit: p.int("limit", 100, 1, 1000)?,
        offset: p.int("offset", 0, 0, i64::MAX)?,
    })
}

pub async fn list_dlq(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let filter = dlq_filter(&Params::parse(q)?, tenant)?;
    Ok(Json(dlq::list(&state.pool, state.coalescer.encryption().ring(), &filter).await?).into_response())
}

/// `DELETE /api/v1/dlq?queue=…[&consumerGroup][&partition][&from][&to]` (admin).
pub async fn purge_dlq(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let filter = dlq_filter(&Params::parse(q)?, tenant)?;
    let deleted = dlq::purge(&state.pool, &filter).await?;
    Ok(Json(json!({"success": true, "queue": crate::tenancy::shown(&filter.queue), "deleted": deleted})).into_response())
}

/// The filters of a message listing of `tenant`'s queues, from the query
/// string.
pub fn message_filter(p: &Params, tenant: Tenant) -> Result<messages::MessageFilter, ApiError> {
    Ok(messages::MessageFilter {
        tenant,
        queue: p.text("queue").map(|q| tenant.stored(&q)),
        partition: p.text("partition"),
        namespace: p.text("namespace").or_else(|| p.text("ns")),
        task: p.text("task"),
        status: p.text("status"),
        from: p.time("from")?,
        to: p.time("to")?,
        limit: p.int("limit", 200, 1, 1000)? as usize,
        offset: p.int("offset", 0, 0, 1_000_000)? as usize,
    })
}

pub async fn list_messages(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let filter = message_filter(&Params::parse(q)?, tenant)?;
    Ok(Json(messages::list(&state.pool, state.coalescer.encryption().ring(), &filter).await?).into_response())
}

pub async fn get_message(State(state): State<AppState>, tenant: Tenant, Path((pid, txn)): Path<(String, String)>) -> Result<Response, ApiError> {
    let Some(pid) = partition_id(&pid) else { return Ok(not_found()) };
    match messages::detail(&state.pool, state.coalescer.encryption().ring(), tenant, pid, &txn).await? {
        Some(v) => Ok(Json(v).into_response()),
        None => Ok(not_found()),
    }
}

pub async fn delete_message(State(state): State<AppState>, tenant: Tenant, Path((raw_pid, txn)): Path<(String, String)>) -> Result<Response, ApiError> {
    let deleted = match partition_id(&raw_pid) {
        Some(pid) => messages::delete_dead_letter(&state.pool, tenant, pid, &txn).await?,
        None => false,
    };
    if deleted {
        Ok(Json(json!({"success": true, "partitionId": raw_pid, "transactionId": txn, "message": "Message deleted successfully"}))
            .into_response())
    } else {
        Ok((StatusCode::NOT_FOUND, Json(json!({"success": false, "partitionId": raw_pid, "transactionId": txn, "error": "Message not found"})))
            .into_response())
    }
}

pub async fn retry_message(State(state): State<AppState>, tenant: Tenant, Path((pid, txn)): Path<(String, String)>) -> Result<Response, ApiError> {
    let Some(partition_id) = partition_id(&pid) else { return Ok(not_found()) };
    replay(&state, tenant, messages::DeadLetter::Address { partition_id, transaction_id: &txn }, &Default::default()).await
}

/// `POST /api/v1/dlq/{id}/replay`, body optional: `{queue?, partition?}`
/// names another destination.
pub async fn replay_dlq(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let Ok(id) = id.trim().parse::<i64>() else {
        return Ok((StatusCode::NOT_FOUND, Json(json!({"error": "no dead letter with this id"}))).into_response());
    };
    let v = super::body::optional_json(&state, &headers, body).await?.unwrap_or(Value::Null);
    if !(v.is_null() || v.is_object()) {
        return Err(ApiError::BadRequest("body: must be an object {queue?, partition?}".into()));
    }
    let name = |k: &str| -> Result<Option<String>, ApiError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => {
                crate::push::validate::check_name(s).map_err(|p| ApiError::BadRequest(format!("{k}: {p}")))?;
                Ok(Some(s.clone()))
            }
            Some(_) => Err(ApiError::BadRequest(format!("{k}: must be a string"))),
        }
    };
    let target = messages::ReplayTarget { queue: name("queue")?.map(|q| tenant.stored(&q)), partition: name("partition")? };
    replay(&state, tenant, messages::DeadLetter::Id(id), &target).await
}

/// A replay refused while push maintenance is on (it writes through the
/// push path, which is spooling), else done, waking consumers of what it wrote.
async fn replay(state: &AppState, tenant: Tenant, which: messages::DeadLetter<'_>, target: &messages::ReplayTarget) -> Result<Response, ApiError> {
    if state.push_maintenance() {
        return Ok((StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "push maintenance is on: replays wait until it is off"}))).into_response());
    }
    match messages::replay_dead_letter(&state.pool, &state.coalescer, tenant, which, target).await? {
        Some(r) => {
            if r.queued {
                state.committed_push(&r.queue, r.partition_id, &r.partition, 1);
            }
            Ok(Json(r.answer).into_response())
        }
        None => Ok((StatusCode::NOT_FOUND, Json(json!({"error": "no such dead letter"}))).into_response()),
    }
}
