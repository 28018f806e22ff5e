//! `POST /api/v1/ack`, `POST /api/v1/ack/batch` (API.md §2.3) and
//! `POST /api/v1/lease/{leaseId}/extend` (§2.5). Both ack routes answer an
//! array in request order; the batch route refuses a malformed item alone,
//! inside its 200, and the single route answers such an item with a 400.

use crate::tenancy::Tenant;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::borrow::Cow;

use super::body::{read_limited, utf8};
use super::error::ApiError;
use super::AppState;
use crate::ack::{AckItem, AckOutcome, AckStatus, Released};
use crate::json::ObjectOnly;
use crate::pop::QUEUE_MODE;
use crate::push::validate::NUL_REFUSED;

async fn json_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Option<Value>, ApiError> {
    let bytes = read_limited(headers, body, state.config.max_body_bytes).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&bytes).map(Some).map_err(bad_body)
}

/// One field of an acknowledgement, as far as the ack tells values apart.
/// Borrowed from the request body unless the string holds escapes: a batch
/// of 500 acks read as `serde_json::Value` was 500 maps to build and drop
/// (and 500 more for the answers), about 8 % of the machine in a leased
/// drain.
enum Field<'a> {
    Str(Cow<'a, str>),
    Bool(bool),
    /// A number, an array or an object: wrong for every field.
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Field<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Field<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Field<'a>, E> {
                Ok(Field::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Field<'a>, E> {
                Ok(Field::Str(Cow::Owned(v.to_string())))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Field<'a>, E> {
                Ok(Field::Bool(v))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Field<'a>, E> {
                Ok(Field::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Field<'a>, E> {
                Ok(Field::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Field<'a>, E> {
                Ok(Field::Other)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Field<'a>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Field::Other)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Field<'a>, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Field::Other)
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

impl Field<'_> {
    /// The string, when it is a non-empty one.
    fn text(&self) -> Option<&str> {
        match self {
            Field::Str(s) if !s.is_empty() => Some(s),
            _ => None,
        }
    }
}

/// The fields of one acknowledgement (null reads as absent; others are ignored).
#[derive(Deserialize)]
struct AckFields<'a> {
    #[serde(rename = "transactionId", alias = "transaction_id", borrow)]
    transaction_id: Option<Field<'a>>,
    #[serde(rename = "partitionId", alias = "partition_id", borrow)]
    partition_id: Option<Field<'a>>,
    #[serde(borrow)]
    status: Option<Field<'a>>,
    #[serde(borrow)]
    error: Option<Field<'a>>,
    #[serde(rename = "leaseId", alias = "lease_id", borrow)]
    lease_id: Option<Field<'a>>,
    #[serde(rename = "consumerGroup", alias = "consumer_group", borrow)]
    consumer_group: Option<Field<'a>>,
}

/// A well-formed batch read in one pass, every item straight into its
/// fields. The raw reading below (the body, the array, each item on its own)
/// scans every item three times; it now runs only for a batch this one
/// refuses or with an item to refuse, so that such an item is refused alone.
#[derive(Deserialize)]
struct ItemsBatch<'a> {
    #[serde(borrow)]
    acknowledgments: Vec<ObjectOnly<AckFields<'a>>>,
    #[serde(rename = "consumerGroup", alias = "consumer_group", borrow)]
    consumer_group: Option<Field<'a>>,
}

/// The batch body: its items stay raw until each is read on its own, so that
/// one malformed item is refused alone.
#[derive(Deserialize)]
struct BatchBody<'a> {
    #[serde(borrow)]
    acknowledgments: Option<&'a RawValue>,
    #[serde(rename = "consumerGroup", alias = "consumer_group", borrow)]
    consumer_group: Option<Field<'a>>,
}

fn is_object(raw: &str) -> bool {
    raw.trim_start().starts_with('{')
}

async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, ApiError> {
    let bytes = read_limited(headers, body, state.config.max_body_bytes).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("bad body: empty".into()));
    }
    Ok(bytes)
}

fn bad_body(e: serde_json::Error) -> ApiError {
    ApiError::BadRequest(format!("bad body: {e}"))
}

/// `consumerGroup`: null, empty or absent is the fallback (queue mode).
fn group_of(f: Option<&Field>, fallback: &str) -> String {
    f.and_then(Field::text).unwrap_or(fallback).to_string()
}

/// One acknowledgement; `Err` names the field that is missing or not a string.
fn item_of(raw: &str, group: &str) -> Result<AckItem, String> {
    if !is_object(raw) {
        return Err("must be an object".into());
    }
    // The position inside one item says nothing useful about the batch.
    let f: AckFields = serde_json::from_str(raw).map_err(|e| {
        let mut e = e.to_string();
        if let Some(at) = e.rfind(" at line ") {
            e.truncate(at);
        }
        e
    })?;
    item_from(f, group)
}

/// The rules for one acknowledgement's fields.
fn item_from(f: AckFields<'_>, group: &str) -> Result<AckItem, String> {
    // PostgreSQL's text holds no NUL character: refused here, by name,
    // rather than failing the statement (and every ack sharing its commit).
    let no_nul = |k: &str, s: &str| if s.contains('\0') { Err(format!("{k}: {NUL_REFUSED}")) } else { Ok(()) };
    let field = |k: &str, v: &Option<Field>| match v {
        Some(Field::Str(s)) if !s.is_empty() => no_nul(k, s).map(|()| s.to_string()),
        Some(Field::Str(_)) | None => Err(format!("{k}: required, a non-empty string")),
        Some(_) => Err(format!("{k}: must be a string")),
    };
    let optional = |k: &str, v: Option<&str>| v.map(|s| no_nul(k, s).map(|()| s.to_string())).transpose();
    let group = group_of(f.consumer_group.as_ref(), group);
    no_nul("consumerGroup", &group)?;
    let status = match &f.status {
        Some(Field::Bool(true)) => AckStatus::Completed,
        Some(Field::Bool(false)) => AckStatus::Failed,
        Some(Field::Str(s)) => AckStatus::normalize(Some(s)),
        _ => AckStatus::normalize(None),
    };
    Ok(AckItem {
        transaction_id: field("transactionId", &f.transaction_id)?,
        partition_id: field("partitionId", &f.partition_id)?,
        status,
        error: optional("error", match &f.error {
            Some(Field::Str(s)) => Some(s),
            _ => None,
        })?,
        lease_id: optional("leaseId", f.lease_id.as_ref().and_then(Field::text))?,
        group,
    })
}

/// One answer of the array both ack routes return, in request order.
#[derive(Serialize)]
struct Answer<'a> {
    index: usize,
    #[serde(rename = "transactionId")]
    transaction_id: Echo<'a>,
    success: bool,
    error: Option<&'a str>,
    #[serde(rename = "leaseReleased")]
    lease_released: bool,
    dlq: bool,
    noop: bool,
}

/// The transactionId answered: the acknowledged one, or whatever a refused
/// item carried there (echoed as sent, or null).
#[derive(Serialize)]
#[serde(untagged)]
enum Echo<'a> {
    Id(&'a str),
    Sent(Value),
}

/// The answers, written by hand into one buffer: serialized through serde, a
/// batch of 500 acks was about 5 % of the broker's samples in a leased drain.
fn answers_json(answers: &[Answer]) -> Response {
    use crate::json::{indexed_objects, string};
    let flag = |out: &mut Vec<u8>, key: &[u8], v: bool| {
        out.extend_from_slice(key);
        out.extend_from_slice(if v { b"true" } else { b"false" });
    };
    let out = indexed_objects(answers, 128, |a| a.index, |out, a| {
        out.extend_from_slice(b",\"transactionId\":");
        match &a.transaction_id {
            Echo::Id(id) => string(out, id),
            Echo::Sent(v) => serde_json::to_writer(&mut *out, v).expect("writing to a Vec does not fail"),
        }
        flag(out, b",\"success\":", a.success);
        out.extend_from_slice(b",\"error\":");
        match a.error {
            Some(e) => string(out, e),
            None => out.extend_from_slice(b"null"),
        }
        flag(out, b",\"leaseReleased\":", a.lease_released);
        flag(out, b",\"dlq\":", a.dlq);
        flag(out, b",\"noop\":", a.noop);
    });
    ([(axum::http::header::CONTENT_TYPE, "application/json")], out).into_response()
}

fn answer(o: &AckOutcome, index: usize) -> Answer<'_> {
    Answer {
        index,
        transaction_id: Echo::Id(&o.transaction_id),
        success: o.success,
        error: o.error.as_deref(),
        lease_released: o.lease_released,
        dlq: o.dlq,
        noop: o.noop,
    }
}

/// A released lease may leave messages behind it (the rest of a partly
/// acked batch, a nacked one, new pushes that piled up meanwhile): wake the
/// queue's parked long-polls, here and on the other brokers, rather than let
/// them wait out their backoff.
pub(super) fn wake_after(state: &AppState, released: &[Released]) {
    for r in released {
        if let Some(q) = &r.queue {
            state.pop.wake.pushed(q);
            state.cluster.released(q);
        }
    }
}

/// Applies valid acknowledgements (none: nothing to do), counts them and
/// wakes the queues whose leases they released.
async fn apply(state: &AppState, tenant: Tenant, items: &[AckItem]) -> Result<Vec<AckOutcome>, ApiError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let mut owned = std::borrow::Cow::Borrowed(items);
    if crate::tenancy::enabled(&state.config) {
        let ids: Vec<Option<i64>> = items.iter().map(|i| i.partition_id.parse().ok()).collect();
        let named: Vec<i64> = ids.iter().flatten().copied().collect();
        // A partition this broker leased out is known by its batch's queue.
        let hint = |pid: i64| {
            items.iter().zip(&ids).find(|(_, id)| **id == Some(pid)).and_then(|(item, _)| {
                let queue = state.ack.registry.queue_of(item.lease_id.as_deref()?, pid)?;
                Some(crate::tenancy::owner_of(&queue))
            })
        };
        let foreign = state.owners.foreign_with(&state.pool, tenant, &named, hint).await.map_err(|e| ApiError::from_db(&e))?;
        if !foreign.is_empty() {
            for (item, id) in owned.to_mut().iter_mut().zip(&ids) {
                if id.is_some_and(|id| foreign.contains(&id)) {
                    item.partition_id = crate::tenancy::NO_PARTITION.to_string();
                }
            }
        }
    }
    let (outcomes, released) = state.ack.ack(&owned).await.map_err(|e| ApiError::from_db(&e))?;
    state.count_acks(&outcomes);
    wake_after(state, &released);
    Ok(outcomes)
}

pub async fn ack_one(
    State(state): State<AppState>,
    tenant: Tenant,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&state, &headers, body).await?;
    let text = utf8(&bytes)?;
    serde_json::from_str::<IgnoredAny>(text).map_err(bad_body)?;
    let item = item_of(text, QUEUE_MODE).map_err(ApiError::BadRequest)?;
    let outcomes = apply(&state, tenant, std::slice::from_ref(&item)).await?;
    let answers: Vec<Answer> = outcomes.iter().map(|o| answer(o, o.index)).collect();
    Ok(answers_json(&answers))
}

pub async fn ack_batch(
    State(state): State<AppState>,
    tenant: Tenant,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&state, &headers, body).await?;
    let text = utf8(&bytes)?;
    let missing = || ApiError::BadRequest("acknowledgments: required, an array".into());
    if !is_object(text) {
        // Valid JSON that is not an object has no acknowledgments either.
        serde_json::from_str::<IgnoredAny>(text).map_err(bad_body)?;
        return Err(missing());
    }
    if let Ok(batch) = serde_json::from_str::<ItemsBatch>(text) {
        let group = group_of(batch.consumer_group.as_ref(), QUEUE_MODE);
        let items: Result<Vec<AckItem>, String> =
            batch.acknowledgments.into_iter().map(|ObjectOnly(f)| item_from(f, &group)).collect();
        if let Ok(valid) = items {
            let outcomes = apply(&state, tenant, &valid).await?;
            let answers: Vec<Answer> = outcomes.iter().enumerate().map(|(i, o)| answer(o, i)).collect();
            return Ok(answers_json(&answers));
        }
    }
    let parsed: BatchBody = serde_json::from_str(text).map_err(bad_body)?;
    let list: Vec<&RawValue> = match parsed.acknowledgments {
        Some(raw) if raw.get().trim_start().starts_with('[') => serde_json::from_str(raw.get()).map_err(bad_body)?,
        _ => return Err(missing()),
    };
    let group = group_of(parsed.consumer_group.as_ref(), QUEUE_MODE);
    let mut valid = Vec::new();
    let mut refused: Vec<(usize, String)> = Vec::new();
    let mut positions = Vec::new();
    for (i, a) in list.iter().enumerate() {
        match item_of(a.get(), &group) {
            Ok(item) => {
                positions.push(i);
                valid.push(item);
            }
            Err(e) => refused.push((i, e)),
        }
    }
    let outcomes = apply(&state, tenant, &valid).await?;
    let mut answers: Vec<Option<Answer>> = (0..list.len()).map(|_| None).collect();
    for (o, &i) in outcomes.iter().zip(&positions) {
        answers[i] = Some(answer(o, i));
    }
    for (i, e) in &refused {
        // Rare: the refused item is read again to echo what it carried.
        let sent = serde_json::from_str::<Value>(list[*i].get())
            .ok()
            .and_then(|v| v.get("transactionId").cloned())
            .unwrap_or(Value::Null);
        answers[*i] = Some(Answer {
            index: *i,
            transaction_id: Echo::Sent(sent),
            success: false,
            error: Some(e),
            lease_released: false,
            dlq: false,
            noop: false,
        });
    }
    let answers: Vec<Answer> = answers.into_iter().map(|a| a.expect("every ack answered")).collect();
    Ok(answers_json(&answers))
}

pub async fn extend_lease(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(lease_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    // No body, `{}` or `seconds: null`: 60 seconds. Anything else is the
    // number of seconds or a 400 naming it (it used to extend by 60 s).
    use crate::pop::params::MAX_LEASE_SECONDS;
    let seconds = match json_body(&state, &headers, body).await?.as_ref().map(|v| v.get("seconds")) {
        None | Some(None) | Some(Some(Value::Null)) => 60,
        Some(Some(v)) => match v.as_i64() {
            Some(s) if (1..=MAX_LEASE_SECONDS).contains(&s) => s as i32,
            _ => return Err(ApiError::BadRequest(format!("seconds: a whole number from 1 to {MAX_LEASE_SECONDS}, got {v}"))),
        },
    };
    if lease_id.contains('\0') {
        return Err(ApiError::BadRequest(format!("leaseId: {NUL_REFUSED}")));
    }
    let (renewed, expires) = if crate::tenancy::enabled(&state.config) {
        // Only the tenant's own partitions: another tenant's lease renews
        // nothing, as an unknown one.
        let pids = state.ack.lease_partitions(&lease_id).await.map_err(ApiError::from)?;
        let foreign = state.owners.foreign(&state.pool, tenant, &pids).await.map_err(|e| ApiError::from_db(&e))?;
        let own: Vec<i64> = pids.into_iter().filter(|p| !foreign.contains(p)).collect();
        state.ack.extend_at(&lease_id, seconds, Some(own)).await.map_err(ApiError::from)?
    } else {
        state.ack.extend(&lease_id, seconds).await.map_err(ApiError::from)?
    };
    let at = expires.map(|t| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string());
    Ok(Json(json!({"leaseId": lease_id, "success": renewed > 0, "renewed": renewed,
                   "newExpiresAt": at, "expiresAt": at, "lease_expires_at": at})))
}

/// `POST /api/v1/transaction`: the JSON form, or a binary `QTB1` body.
pub async fn transaction(
    State(state): State<AppState>,
    tenant: Tenant,
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
        let text = utf8(&bytes)?;
        (text, &[][..], false)
    };
    let riders = crate::ack::transaction::Riders { kv: state.kv_enabled().then_some(&state.config.kv.limits), timers: state.timers_enabled() };
    let bundle = crate::ack::transaction::Bundle { body: text, binary_pushes: pushes, counts_only, producer: producer.as_deref(), riders,
        tenant, owners: crate::tenancy::enabled(&state.config).then_some(&*state.owners), quotas: Some(&state.quotas) };
    match run(&state.pool, &state.ack, &state.coalescer, bundle).await {
        Ok(done) => {
            for (queue, pid, partition, n) in &done.pushed {
                state.committed_push(queue, *pid, partition, *n);
            }
            wake_after(&state, &done.released);
            Ok(Json(done.answer).into_response())
        }
        Err(TxnError::BadRequest(e)) => Ok(refused(StatusCode::BAD_REQUEST, e)),
        Err(e @ (TxnError::RidersDisabled(_) | TxnError::Forbidden(_))) => Ok(refused(StatusCode::FORBIDDEN, e.to_string())),
        Err(TxnError::NoKey(k)) => Err(ApiError::NoKey(k.to_string())),
        Err(TxnError::Quota(r)) => Err(r.into()),
        Err(TxnError::Db(e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_answers_match_what_serde_would_write() {
        let answers = [
            Answer { index: 0, transaction_id: Echo::Id("t\"1\\é"), success: true, error: None, lease_released: true, dlq: false, noop: false },
            Answer {
                index: 17,
                transaction_id: Echo::Sent(serde_json::json!({"n": [1, "x"]})),
                success: false,
                error: Some("transactionId: must be a string\n"),
                lease_released: false,
                dlq: true,
                noop: true,
            },
            Answer { index: 2, transaction_id: Echo::Sent(Value::Null), success: false, error: Some("é"), lease_released: false, dlq: false, noop: false },
        ];
        let response = answers_json(&answers);
        assert_eq!(response.headers()[axum::http::header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        assert_eq!(std::str::from_utf8(&body).unwrap(), serde_json::to_string(&answers).unwrap());
    }
}
