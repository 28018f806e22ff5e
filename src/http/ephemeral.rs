//! `/api/v1/ephemeral/*` (issue 33): parse, hand to [`crate::ephemeral`],
//! render. Refusals are `{error, detail}` (and `field` for a bad request),
//! the `error` being the stable code the clients branch on:
//! `ephemeral_bad_request` (400), `ephemeral_queue_not_found` (404, depth
//! only: push and pop create a queue, reset and delete say they did
//! nothing), `ephemeral_request_too_large` (413), `ephemeral_queue_full`
//! (429), `ephemeral_memory_full` and `ephemeral_disabled` (503); 429 and 503
//! carry `Retry-After`.
// The helpers answer a refusal as the response itself, ready to return.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::query::Params;
use super::AppState;
use crate::ephemeral::{Refusal, QUEUE_MODE};
use crate::tenancy::Tenant;

/// Longest queue, partition and group name.
const MAX_NAME: usize = 256;
/// Longest long-poll a pop may ask for.
const MAX_WAIT_MS: i64 = 60_000;

fn refuse(status: StatusCode, code: &str, detail: &str) -> Response {
    let mut r = (status, Json(json!({"error": code, "detail": detail}))).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    r
}

fn bad(field: &str, detail: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": "ephemeral_bad_request", "field": field, "detail": format!("{field}: {detail}")})))
        .into_response()
}

/// `Err` (a 503) while the family is switched off.
fn enabled(state: &AppState) -> Result<(), Response> {
    match state.ephemeral_enabled() {
        true => Ok(()),
        false => Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "ephemeral_disabled",
            "ephemeral queues are switched off (QUEEN_EPHEMERAL_ENABLED, or /api/v1/system/ephemeral)",
        )),
    }
}

/// A handler's answer: what it computed, or the refusal it stopped at.
fn answer(r: Result<Response, Response>) -> Response {
    r.unwrap_or_else(|refusal| refusal)
}

/// A JSON body of type `T`; unreadable, a 400 saying what was expected.
async fn typed<T: serde::de::DeserializeOwned>(state: &AppState, headers: &HeaderMap, body: axum::body::Body, expected: &str) -> Result<T, Response> {
    let bytes = body_bytes(state, headers, body).await?;
    serde_json::from_slice(&bytes).map_err(|e| bad("body", &format!("not {expected}: {e}")))
}

fn name(field: &str, v: Option<&str>) -> Result<String, Response> {
    match v.map(str::trim) {
        None | Some("") => Err(bad(field, "required, a non-empty string")),
        Some(s) if s.len() > MAX_NAME => Err(bad(field, &format!("at most {MAX_NAME} bytes"))),
        Some(s) => Ok(s.to_string()),
    }
}

fn optional_name(field: &str, v: Option<&str>) -> Result<Option<String>, Response> {
    match v {
        None => Ok(None),
        Some(_) => name(field, v).map(Some),
    }
}

async fn body_bytes(state: &AppState, headers: &HeaderMap, body: axum::body::Body) -> Result<bytes::Bytes, Response> {
    super::body::read_limited(headers, body, state.config.max_body_bytes).await.map_err(IntoResponse::into_response)
}

async fn json_object(state: &AppState, headers: &HeaderMap, body: axum::body::Body) -> Result<Map<String, Value>, Response> {
    let bytes = body_bytes(state, headers, body).await?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad("body", "must be a JSON object")),
        Err(e) => Err(bad("body", &format!("not JSON: {e}"))),
    }
}

#[derive(Deserialize)]
struct PushBody {
    queue: Option<String>,
    partition: Option<String>,
    messages: Option<Vec<PushMessage>>,
}

#[derive(Deserialize)]
struct PushMessage {
    payload: Option<Box<RawValue>>,
    /// The older clients' spelling of `payload`.
    data: Option<Box<RawValue>>,
}

/// `POST /api/v1/ephemeral/push` → `{pushed}`.
pub async fn push(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, body: axum::body::Body) -> Response {
    answer(push_inner(&state, tenant, &headers, body).await)
}

async fn push_inner(state: &AppState, tenant: Tenant, headers: &HeaderMap, body: axum::body::Body) -> Result<Response, Response> {
    enabled(state)?;
    let parsed: PushBody = typed(state, headers, body, "a push body {queue, partition?, messages:[{payload}]}").await?;
    let queue = name("queue", parsed.queue.as_deref())?;
    let partition = optional_name("partition", parsed.partition.as_deref())?.unwrap_or_else(|| "Default".to_string());
    let Some(messages) = parsed.messages else { return Err(bad("messages", "required, an array of {payload}")) };
    let mut payloads = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        match m.payload.or(m.data) {
            Some(p) => payloads.push(Arc::<RawValue>::from(p)),
            None => return Err(bad(&format!("messages[{i}].payload"), "required (null is a payload: write \"payload\": null)")),
        }
    }
    if payloads.is_empty() {
        return Ok(Json(json!({"pushed": 0})).into_response());
    }
    let bytes = payloads.iter().map(|p| p.get().len() as u64).sum();
    state
        .quotas
        .ephemeral(tenant, payloads.len() as u64, bytes, || state.ephemeral.held_by(|name| tenant.owns(name)))
        .map_err(IntoResponse::into_response)?;
    Ok(match state.ephemeral.push(&tenant.stored(&queue), &partition, payloads) {
        Ok(n) => Json(json!({"pushed": n, "queue": queue, "partition": partition})).into_response(),
        Err(Refusal::Full { detail }) => refuse(StatusCode::TOO_MANY_REQUESTS, "ephemeral_queue_full", &detail),
        Err(Refusal::TooLarge { detail }) => refuse(StatusCode::PAYLOAD_TOO_LARGE, "ephemeral_request_too_large", &detail),
        Err(Refusal::MemoryFull) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "ephemeral_memory_full",
            "the broker's memory for ephemeral queues (QUEEN_EPHEMERAL_MAX_MB) is full",
        ),
    })
}

#[derive(Serialize)]
struct Popped<'a> {
    id: &'a str,
    partition: &'a str,
    payload: &'a RawValue,
    attempts: u32,
}

/// `GET /api/v1/ephemeral/pop?queue&partition&batch&wait&timeout&group&autoAck`
/// → `{queue, messages:[{id, partition, payload, attempts}]}` (an empty
/// list when there was nothing).
pub async fn pop(State(state): State<AppState>, tenant: Tenant, RawQuery(raw): RawQuery) -> Response {
    answer(pop_inner(&state, tenant, raw).await)
}

async fn pop_inner(state: &AppState, tenant: Tenant, raw: Option<String>) -> Result<Response, Response> {
    enabled(state)?;
    let p = Params::parse(raw).map_err(|e| bad("query", &e.to_string()))?;
    let flag = |k: &str| -> Result<bool, Response> {
        match p.text(k) {
            None => Ok(false),
            Some(v) => crate::config::parse_bool(&v).ok_or_else(|| bad(k, &format!("must be true or false, got {v:?}"))),
        }
    };
    let int = |k: &str, default: i64, min: i64, max: i64| p.int(k, default, min, max).map_err(|e| bad(k, &e.to_string()));
    let queue = name("queue", p.text("queue").as_deref())?;
    let partition = optional_name("partition", p.text("partition").as_deref())?;
    let group = optional_name("group", p.text("group").or_else(|| p.text("consumerGroup")).as_deref())?.unwrap_or_else(|| QUEUE_MODE.to_string());
    let batch = int("batch", 1, 1, 10_000)? as usize;
    let wait = flag("wait")?;
    let timeout = int("timeout", 30_000, 0, MAX_WAIT_MS)?;
    let commit = flag("autoAck")? || flag("auto_ack")?;
    let wait = wait.then(|| Duration::from_millis(timeout as u64));
    let got = state.ephemeral.pop(&tenant.stored(&queue), &group, partition.as_deref(), batch, commit, wait).await;
    let messages: Vec<Popped> =
        got.iter().map(|m| Popped { id: &m.id, partition: &m.partition, payload: &m.payload, attempts: m.attempts }).collect();
    #[derive(Serialize)]
    struct Answer<'a> {
        queue: &'a str,
        messages: Vec<Popped<'a>>,
    }
    Ok(Json(Answer { queue: &queue, messages }).into_response())
}

#[derive(Deserialize)]
struct AckBody<'a> {
    #[serde(borrow)]
    queue: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, alias = "consumerGroup")]
    group: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    acks: Option<Vec<AckEntry<'a>>>,
}

#[derive(Deserialize)]
struct AckEntry<'a> {
    #[serde(borrow)]
    id: Option<std::borrow::Cow<'a, str>>,
    status: Option<Value>,
}

/// `POST /api/v1/ephemeral/ack` `{queue, group?, acks:[{id, status?, error?}]}`
/// → `{results:[{id, outcome}]}`.
pub async fn ack(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, body: axum::body::Body) -> Response {
    answer(ack_inner(&state, tenant, &headers, body).await)
}

async fn ack_inner(state: &AppState, tenant: Tenant, headers: &HeaderMap, body: axum::body::Body) -> Result<Response, Response> {
    enabled(state)?;
    let bytes = body_bytes(state, headers, body).await?;
    let parsed: AckBody = serde_json::from_slice(&bytes).map_err(|e| bad("body", &format!("not an ack body {{queue, group?, acks:[{{id, status?}}]}}: {e}")))?;
    let queue = name("queue", parsed.queue.as_deref())?;
    let group = match parsed.group.as_deref() {
        None => QUEUE_MODE.to_string(),
        Some(g) => name("group", Some(g))?,
    };
    let Some(list) = parsed.acks else { return Err(bad("acks", "required, an array of {id, status?}")) };
    let mut acks = Vec::with_capacity(list.len());
    for (i, a) in list.iter().enumerate() {
        let Some(id) = a.id.as_deref().filter(|s| !s.is_empty()) else {
            return Err(bad(&format!("acks[{i}].id"), "required, the id a pop answered"));
        };
        let settle = match &a.status {
            None | Some(Value::Null) | Some(Value::Bool(true)) => true,
            Some(Value::Bool(false)) => false,
            Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
                "completed" | "success" | "acked" | "ok" => true,
                "failed" | "retry" | "error" => false,
                _ => return Err(bad(&format!("acks[{i}].status"), "completed, failed or retry")),
            },
            Some(_) => return Err(bad(&format!("acks[{i}].status"), "completed, failed or retry")),
        };
        acks.push((id, settle));
    }
    let outcomes = state.ephemeral.ack(&tenant.stored(&queue), &group, &acks);
    #[derive(Serialize)]
    struct Result<'a> {
        id: &'a str,
        outcome: &'static str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        dropped: bool,
    }
    #[derive(Serialize)]
    struct Answer<'a> {
        queue: &'a str,
        results: Vec<Result<'a>>,
    }
    let results = acks
        .iter()
        .zip(outcomes)
        .map(|(&(id, _), o)| Result { id, outcome: o.as_str(), dropped: o == crate::ephemeral::Outcome::Dropped })
        .collect();
    Ok(Json(Answer { queue: &queue, results }).into_response())
}

/// `POST /api/v1/ephemeral/configure` `{queue, options}`.
pub async fn configure(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, body: axum::body::Body) -> Response {
    answer(configure_inner(&state, tenant, &headers, body).await)
}

async fn configure_inner(state: &AppState, tenant: Tenant, headers: &HeaderMap, body: axum::body::Body) -> Result<Response, Response> {
    enabled(state)?;
    let body = json_object(state, headers, body).await?;
    let queue = name("queue", body.get("queue").and_then(Value::as_str))?;
    let empty = Map::new();
    let options = match body.get("options") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("options", "must be an object")),
    };
    let configured = state.ephemeral.configure(&tenant.stored(&queue), options).map_err(|(field, problem)| bad(&field, &problem))?;
    Ok(Json(configured).into_response())
}

/// `POST /api/v1/ephemeral/reset` `{queue}` → `{dropped}`.
pub async fn reset(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, body: axum::body::Body) -> Response {
    answer(reset_inner(&state, tenant, &headers, body).await)
}

async fn reset_inner(state: &AppState, tenant: Tenant, headers: &HeaderMap, body: axum::body::Body) -> Result<Response, Response> {
    enabled(state)?;
    let body = json_object(state, headers, body).await?;
    let queue = name("queue", body.get("queue").and_then(Value::as_str))?;
    Ok(Json(json!({"queue": queue, "dropped": state.ephemeral.reset(&tenant.stored(&queue))})).into_response())
}

/// `DELETE /api/v1/ephemeral/queue/{queue}` → `{deleted}`.
pub async fn delete(State(state): State<AppState>, tenant: Tenant, Path(queue): Path<String>) -> Response {
    answer(enabled(&state).map(|()| Json(json!({"queue": queue, "deleted": state.ephemeral.delete(&tenant.stored(&queue))})).into_response()))
}

/// `GET /api/v1/ephemeral/queues`.
pub async fn queues(State(state): State<AppState>, tenant: Tenant) -> Response {
    let tenant = crate::tenancy::enabled(&state.config).then_some(tenant);
    Json(state.ephemeral.list(state.ephemeral_enabled(), tenant)).into_response()
}

/// `GET /api/v1/ephemeral/queues/{queue}/depth`.
pub async fn depth(State(state): State<AppState>, tenant: Tenant, Path(queue): Path<String>) -> Response {
    match state.ephemeral.depth(&tenant.stored(&queue)) {
        Some(d) => Json(d).into_response(),
        None => refuse(StatusCode::NOT_FOUND, "ephemeral_queue_not_found", &format!("no ephemeral queue {queue:?} on this broker")),
    }
}
