//! `POST /api/v1/push` (API.md §2.1): thin on purpose. Parse, hand to the
//! push path, render.

use std::io::Write;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::{read_limited, utf8};
use super::error::ApiError;
use super::AppState;
use crate::push::{self, ItemResult, Outcome};

/// The push answer, written by hand into one buffer: one object per item,
/// with both spellings of the ids (upstream brokers used snake_case, newer
/// clients read camelCase). Built with serde it was the broker's top symbol
/// in a binary push (escaping four id strings per message, docs/PERFORMANCE.md);
/// the ids the broker made itself (uuid, partition id) need no escaping.
fn render_answer(results: &[ItemResult]) -> Vec<u8> {
    let text = |out: &mut Vec<u8>, s: &str| serde_json::to_writer(out, s).expect("writing to a Vec does not fail");
    let mut out = Vec::with_capacity(2 + results.len() * 280);
    out.push(b'[');
    for (n, r) in results.iter().enumerate() {
        let status = match r.outcome {
            Outcome::Queued { .. } => "queued",
            Outcome::Duplicate { .. } => "duplicate",
        };
        let mut buf = uuid::Uuid::encode_buffer();
        let id = r.outcome.message_id().as_hyphenated().encode_lower(&mut buf);
        if n > 0 {
            out.push(b',');
        }
        write!(out, "{{\"index\":{},\"status\":\"{status}\",\"messageId\":\"{id}\",\"message_id\":\"{id}\",\"transactionId\":", r.index)
            .expect("vec write");
        text(&mut out, &r.transaction_id);
        out.extend_from_slice(b",\"transaction_id\":");
        text(&mut out, &r.transaction_id);
        out.extend_from_slice(b",\"queueName\":");
        text(&mut out, &r.queue);
        write!(out, ",\"partitionId\":\"{}\"}}", r.outcome.partition_id()).expect("vec write");
    }
    out.push(b']');
    out
}

/// A 201 with a body already rendered as JSON.
fn created_json(body: Vec<u8>) -> Response {
    (StatusCode::CREATED, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

pub async fn push(
    State(state): State<AppState>,
    principal: Option<axum::Extension<super::auth::Principal>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // The JWT subject, when authentication is on; a body field is never trusted.
    let producer = principal.and_then(|p| p.0.sub);
    let bytes = read_limited(&headers, body, state.config.max_body_bytes).await?;
    // Dispatched on the magic, not the content type (API.md §6 A-12).
    if bytes.starts_with(b"QPB1") {
        let parsed = crate::log::binary::parse_push(&bytes, state.config.max_body_bytes)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let items = push::validate::from_binary(&parsed.items).map_err(ApiError::BadRequest)?;
        return push_and_answer(&state, &items, &parsed.groups, parsed.counts_only, producer.as_deref()).await;
    }
    let text = utf8(&bytes)?;
    let items = push::parse_push_body(text).map_err(ApiError::BadRequest)?;
    push_and_answer(&state, &items, &[], false, producer.as_deref()).await
}

/// Pushes validated items and answers: one result per item, or the counts.
async fn push_and_answer(
    state: &AppState,
    items: &[push::PushItem<'_>],
    prepacked: &[crate::log::binary::FramedGroup],
    counts_only: bool,
    producer: Option<&str>,
) -> Result<Response, ApiError> {
    if items.is_empty() {
        return Ok(created_json(b"[]".to_vec()));
    }
    if let Some(spool) = &state.spool {
        // Maintenance, or older spooled pushes still waiting: join the queue
        // behind them so a partition keeps the order pushes were answered in.
        if state.push_maintenance() || spool.has_pending() {
            return spooled(spool, items, producer).await;
        }
    }
    match push::push_items_prepacked(&state.coalescer, items, producer, prepacked).await {
        Ok(results) => {
            notify_consumers(state, &results);
            if counts_only {
                let queued = results.iter().filter(|r| matches!(r.outcome, Outcome::Queued { .. })).count();
                let answer = serde_json::json!({"count": results.len(), "queued": queued,
                                                "duplicate": results.len() - queued, "error": 0});
                return Ok((StatusCode::CREATED, Json(answer)).into_response());
            }
            Ok(created_json(render_answer(&results)))
        }
        Err(e) if e.database_unreachable() && state.spool.is_some() => {
            tracing::warn!(error = %e, "PostgreSQL unreachable; spooling the push");
            spooled(state.spool.as_ref().expect("checked above"), items, producer).await
        }
        Err(e) => Err(ApiError::from(&*e)),
    }
}

/// Spools the request and answers `buffered` per item (201: the data is on
/// disk, fsynced, and will be replayed in order).
async fn spooled(
    spool: &crate::push::spool::Spool,
    items: &[crate::push::PushItem<'_>],
    producer: Option<&str>,
) -> Result<Response, ApiError> {
    let txns = spool.append(items, producer).await.map_err(|e| ApiError::Internal(e.to_string()))?;
    let answer: Vec<serde_json::Value> = items
        .iter()
        .zip(txns)
        .enumerate()
        .map(|(index, (item, txn))| {
            serde_json::json!({"index": index, "status": "buffered", "messageId": null, "message_id": null,
                               "transactionId": txn, "transaction_id": txn, "queueName": item.queue, "partitionId": null})
        })
        .collect();
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// Tells the pop side which partitions just received how many messages.
fn notify_consumers(state: &AppState, results: &[ItemResult]) {
    let mut counts: Vec<(&ItemResult, u64)> = Vec::new();
    let mut slot: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    for r in results {
        if let Outcome::Queued { partition_id, .. } = r.outcome {
            let i = *slot.entry(partition_id).or_insert_with(|| {
                counts.push((r, 0));
                counts.len() - 1
            });
            counts[i].1 += 1;
        }
    }
    for (r, n) in counts {
        state.committed_push(&r.queue, r.outcome.partition_id(), &r.partition, n);
    }
}
