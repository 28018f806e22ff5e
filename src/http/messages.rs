//! Dead letters and messages (API.md §2.8): `GET /api/v1/dlq`,
//! `GET /api/v1/messages`, and one message by address with its retry and
//! delete.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::AppState;
use super::query::Params;
use crate::admin::{dlq, messages};

fn partition_id(raw: &str) -> Option<i64> {
    raw.trim().parse().ok()
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"error": "Message not found"}))).into_response()
}

pub async fn list_dlq(State(state): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    let filter = dlq::DlqFilter {
        queue: p.text("queue").ok_or_else(|| ApiError::BadRequest("queue: required".into()))?,
        group: p.text("consumerGroup").or_else(|| p.text("consumer_group")),
        partition: p.text("partition"),
        from: p.time("from")?,
        to: p.time("to")?,
        limit: p.int("limit", 100, 1, 1000)?,
        offset: p.int("offset", 0, 0, i64::MAX)?,
    };
    Ok(Json(dlq::list(&state.pool, state.coalescer.encryption().ring(), &filter).await?).into_response())
}

/// The filters of a message listing, from the query string.
pub fn message_filter(p: &Params) -> Result<messages::MessageFilter, ApiError> {
    Ok(messages::MessageFilter {
        queue: p.text("queue"),
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

pub async fn list_messages(State(state): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let filter = message_filter(&Params::parse(q)?)?;
    Ok(Json(messages::list(&state.pool, state.coalescer.encryption().ring(), &filter).await?).into_response())
}

pub async fn get_message(State(state): State<AppState>, Path((pid, txn)): Path<(String, String)>) -> Result<Response, ApiError> {
    let Some(pid) = partition_id(&pid) else { return Ok(not_found()) };
    match messages::detail(&state.pool, state.coalescer.encryption().ring(), pid, &txn).await? {
        Some(v) => Ok(Json(v).into_response()),
        None => Ok(not_found()),
    }
}

pub async fn delete_message(State(state): State<AppState>, Path((raw_pid, txn)): Path<(String, String)>) -> Result<Response, ApiError> {
    let deleted = match partition_id(&raw_pid) {
        Some(pid) => messages::delete_dead_letter(&state.pool, pid, &txn).await?,
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

pub async fn retry_message(State(state): State<AppState>, Path((pid, txn)): Path<(String, String)>) -> Result<Response, ApiError> {
    let Some(pid) = partition_id(&pid) else { return Ok(not_found()) };
    match messages::replay_dead_letter(&state.pool, &state.coalescer, pid, &txn).await? {
        Some(r) => {
            if r.queued {
                state.committed_push(&r.queue, r.partition_id, &r.partition, 1);
            }
            Ok(Json(r.answer).into_response())
        }
        None => Ok((StatusCode::NOT_FOUND, Json(json!({"error": "no dead-lettered message at this address"}))).into_response()),
    }
}
