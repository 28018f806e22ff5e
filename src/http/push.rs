//! `POST /api/v1/push` (API.md §2.1): thin on purpose. Parse, hand to the
//! push path, render.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::{read_limited, utf8};
use super::error::ApiError;
use super::AppState;
use crate::json::{decimal, indexed_objects, string};
use crate::push::{self, ItemResult, Outcome};
use crate::tenancy::Tenant;

/// The push answer, written by hand into one buffer: one object per item,
/// with both spellings of the ids (upstream brokers used snake_case, newer
/// clients read camelCase). Built with serde it was the broker's top symbol
/// in a binary push (escaping four id strings per message, docs/PERFORMANCE.md).
/// Only the client's strings are escaped, each once: the transactionId is
/// copied into both spellings, and the queue name is reused while it repeats.
fn render_answer(results: &[ItemResult]) -> Vec<u8> {
    let mut txn = Vec::with_capacity(64);
    let mut queue: (Option<&str>, Vec<u8>) = (None, Vec::new());
    indexed_objects(results, 280, |r| r.index, |out, r| {
        out.extend_from_slice(match r.outcome {
            Outcome::Queued { .. } => b",\"status\":\"queued\",\"messageId\":\"",
            Outcome::Duplicate { .. } => b",\"status\":\"duplicate\",\"messageId\":\"",
        });
        let mut buf = uuid::Uuid::encode_buffer();
        let id = r.outcome.message_id().as_hyphenated().encode_lower(&mut buf).as_bytes();
        out.extend_from_slice(id);
        out.extend_from_slice(b"\",\"message_id\":\"");
        out.extend_from_slice(id);
        out.extend_from_slice(b"\",\"transactionId\":");
        txn.clear();
        string(&mut txn, &r.transaction_id);
        out.extend_from_slice(&txn);
        out.extend_from_slice(b",\"transaction_id\":");
        out.extend_from_slice(&txn);
        out.extend_from_slice(b",\"queueName\":");
        if queue.0 != Some(r.queue) {
            queue.1.clear();
            string(&mut queue.1, crate::tenancy::shown(r.queue));
            queue.0 = Some(r.queue);
        }
        out.extend_from_slice(&queue.1);
        out.extend_from_slice(b",\"partitionId\":\"");
        decimal(out, r.outcome.partition_id());
        out.push(b'"');
    })
}

/// A 201 with a body already rendered as JSON.
fn created_json(body: Vec<u8>) -> Response {
    (StatusCode::CREATED, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

pub async fn push(
    State(state): State<AppState>,
    principal: Option<axum::Extension<super::auth::Principal>>,
    tenant: Tenant,
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
        let mut items = push::validate::from_binary(&parsed.items).map_err(ApiError::BadRequest)?;
        tenant.own(&mut items);
        state.quotas.push_items(tenant, &items)?;
        return push_and_answer(&state, &items, &parsed.groups, parsed.counts_only, producer.as_deref()).await;
    }
    let text = utf8(&bytes)?;
    let mut items = push::parse_push_body(text).map_err(ApiError::BadRequest)?;
    tenant.own(&mut items);
    state.quotas.push_items(tenant, &items)?;
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
        if state.push_maintenance() {
            return spooled(spool, items, producer).await;
        }
        if spool.has_pending() {
            let txns = spool.append_if_pending(items, producer).await.map_err(|e| ApiError::Internal(e.to_string()))?;
            if let Some(txns) = txns {
                return Ok(buffered(items, txns));
            }
        }
    }
    match push::push_items_prepacked(&state.coalescer, items, producer, prepacked).await {
        Ok(results) => {
            state.committed_results(&results);
            if counts_only {
                let queued = results.iter().filter(|r| matches!(r.outcome, Outcome::Queued { .. })).count();
                let answer = serde_json::json!({"count": results.len(), "queued": queued,
                                                "duplicate": results.len() - queued, "error": 0});
                return Ok((StatusCode::CREATED, Json(answer)).into_response());
            }
            Ok(created_json(render_answer(&results)))
        }
        Err(e) if e.database_unreachable() && state.spool.is_some() => {
            static SPOOLING: crate::telemetry::Throttle = crate::telemetry::Throttle::new(5_000);
            if let Some(skipped) = SPOOLING.admit() {
                tracing::warn!(error = %e, skipped, "PostgreSQL unreachable; spooling the push");
            }
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
    Ok(buffered(items, txns))
}

/// The answer to a spooled request: `buffered` per item.
fn buffered(items: &[crate::push::PushItem<'_>], txns: Vec<String>) -> Response {
    let answer: Vec<serde_json::Value> = items
        .iter()
        .zip(txns)
        .enumerate()
        .map(|(index, (item, txn))| {
            serde_json::json!({"index": index, "status": "buffered", "messageId": null, "message_id": null,
                               "transactionId": txn, "transaction_id": txn, "queueName": crate::tenancy::shown(&item.queue),
                               "partitionId": null})
        })
        .collect();
    (StatusCode::CREATED, Json(answer)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_matches_what_serde_would_write_across_queues_and_outcomes() {
        let id = |n: u128| uuid::Uuid::from_u128(n);
        let result = |index, queue: &'static str, txn: &'static str, outcome| ItemResult {
            index,
            queue,
            partition: "p",
            transaction_id: txn.into(),
            outcome,
        };
        let results = [
            result(0, "q\"1", "t\\a", Outcome::Queued { message_id: id(1), partition_id: 5, offset: 0 }),
            result(1, "q\"1", "t\u{1}", Outcome::Duplicate { message_id: id(2), partition_id: 5 }),
            result(2, "é", "plain", Outcome::Queued { message_id: id(3), partition_id: -1, offset: 9 }),
        ];
        let got: serde_json::Value = serde_json::from_slice(&render_answer(&results)).unwrap();
        let want: Vec<serde_json::Value> = results
            .iter()
            .map(|r| {
                let status = if matches!(r.outcome, Outcome::Queued { .. }) { "queued" } else { "duplicate" };
                let mid = r.outcome.message_id().to_string();
                serde_json::json!({"index": r.index, "status": status, "messageId": mid, "message_id": mid,
                                   "transactionId": r.transaction_id, "transaction_id": r.transaction_id,
                                   "queueName": r.queue, "partitionId": r.outcome.partition_id().to_string()})
            })
            .collect();
        assert_eq!(got, serde_json::Value::Array(want));
    }
}
