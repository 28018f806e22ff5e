//! `POST /api/v1/push` (API.md §2.1): thin on purpose. Parse, hand to the
//! push path, render.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::body::{read_limited, utf8};
use super::error::ApiError;
use super::AppState;
use crate::push::{self, ItemResult, Outcome};

/// One element of the push answer. Both spellings of the ids are emitted:
/// upstream brokers used snake_case, newer clients read camelCase.
#[derive(Serialize)]
struct PushAnswer<'a> {
    index: usize,
    status: &'static str,
    #[serde(rename = "messageId")]
    message_id_camel: String,
    message_id: String,
    #[serde(rename = "transactionId")]
    transaction_id_camel: &'a str,
    transaction_id: &'a str,
    #[serde(rename = "queueName")]
    queue_name: &'a str,
    #[serde(rename = "partitionId")]
    partition_id: String,
}

impl<'a> From<&'a ItemResult> for PushAnswer<'a> {
    fn from(r: &'a ItemResult) -> Self {
        let status = match r.outcome {
            Outcome::Queued { .. } => "queued",
            Outcome::Duplicate { .. } => "duplicate",
        };
        let id = r.outcome.message_id().to_string();
        PushAnswer {
            index: r.index,
            status,
            message_id_camel: id.clone(),
            message_id: id,
            transaction_id_camel: &r.transaction_id,
            transaction_id: &r.transaction_id,
            queue_name: &r.queue,
            partition_id: r.outcome.partition_id().to_string(),
        }
    }
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
        return Ok((StatusCode::CREATED, Json(Vec::<PushAnswer>::new())).into_response());
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
            let answer: Vec<PushAnswer> = results.iter().map(PushAnswer::from).collect();
            Ok((StatusCode::CREATED, Json(answer)).into_response())
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
