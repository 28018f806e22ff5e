//! The operator routes (API.md §1.2 rows 9–24, §2.6, §2.7): configure, queue
//! resources, consumer groups and seek.

use crate::tenancy::Tenant;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::query::Params;
use super::AppState;
use crate::admin::{configure, groups, resources};
use crate::pop::QUEUE_MODE;

/// A JSON body; empty is `None` (the client sends no body for `{}`).
fn bad(body: Value) -> Response {
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

fn queue_not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"error": "Queue not found"}))).into_response()
}

pub async fn configure(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let v = super::body::optional_json(&state, &headers, body).await?.unwrap_or(Value::Null);
    let mut req = match configure::parse(&v, state.coalescer.encryption().ring().is_some()) {
        Ok(r) => r,
        Err(refusal) => {
            let mut body = json!({"error": refusal.error});
            if let Some(option) = refusal.invalid {
                body["invalid"] = json!(option);
            }
            return Ok(bad(body));
        }
    };
    req.queue = tenant.stored(&req.queue);
    state.quotas.push(tenant, &[&req.queue], 0, 0)?;
    let mut answer = state.configure(&req).await?;
    show(&mut answer, "queue");
    Ok(Json(answer).into_response())
}

/// `answer[field]`, a stored queue name, as its tenant knows it.
fn show(answer: &mut Value, field: &str) {
    if let Some(name) = answer[field].as_str().map(|n| crate::tenancy::shown(n).to_string()) {
        answer[field] = Value::String(name);
    }
}

pub async fn list_queues(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    let search = p.text("search");
    let answer = resources::list_queues(&state.pool, tenant, search.as_deref(), p.int("limit", 100, 1, 1000)?, p.int("offset", 0, 0, i64::MAX)?).await?;
    Ok(Json(answer).into_response())
}

pub async fn get_queue(State(state): State<AppState>, tenant: Tenant, Path(queue): Path<String>) -> Result<Response, ApiError> {
    Ok(match resources::get_queue(&state.pool, &tenant.stored(&queue)).await? {
        Some(v) => Json(v).into_response(),
        None => queue_not_found(),
    })
}

pub async fn queue_depth(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(queue): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let group = Params::parse(q)?.text("group").unwrap_or_else(|| QUEUE_MODE.to_string());
    Ok(match resources::depth(&state.pool, &tenant.stored(&queue), &group).await? {
        Some(mut v) => {
            show(&mut v, "queue");
            Json(v).into_response()
        }
        None => queue_not_found(),
    })
}

pub async fn delete_queue(State(state): State<AppState>, tenant: Tenant, Path(queue): Path<String>) -> Result<Response, ApiError> {
    let mut answer = state.delete_queue(&tenant.stored(&queue)).await?;
    show(&mut answer, "queue");
    Ok(Json(answer).into_response())
}

/// The tenant a listing is confined to: the request's with tenancy on,
/// none (every queue) with it off.
fn confined(state: &AppState, tenant: Tenant) -> Option<Tenant> {
    crate::tenancy::enabled(&state.config).then_some(tenant)
}

pub async fn overview(State(state): State<AppState>, tenant: Tenant) -> Result<Response, ApiError> {
    Ok(Json(resources::overview(&state.pool, confined(&state, tenant)).await?).into_response())
}

pub async fn namespaces(State(state): State<AppState>, tenant: Tenant) -> Result<Response, ApiError> {
    Ok(Json(resources::by_label(&state.pool, false, confined(&state, tenant)).await?).into_response())
}

pub async fn tasks(State(state): State<AppState>, tenant: Tenant) -> Result<Response, ApiError> {
    Ok(Json(resources::by_label(&state.pool, true, confined(&state, tenant)).await?).into_response())
}

pub async fn list_groups(State(state): State<AppState>, tenant: Tenant) -> Result<Response, ApiError> {
    Ok(Json(groups::list(&state.pool, tenant).await?).into_response())
}

pub async fn get_group(State(state): State<AppState>, tenant: Tenant, Path(group): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(groups::get(&state.pool, tenant, &group).await?).into_response())
}

pub async fn lagging(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let min = Params::parse(q)?.int("minLagSeconds", 3600, 0, i64::MAX / 2)?;
    Ok(Json(groups::lagging(&state.pool, tenant, min).await?).into_response())
}

fn delete_metadata(q: Option<String>) -> Result<bool, ApiError> {
    match Params::parse(q)?.text("deleteMetadata") {
        None => Ok(true),
        Some(v) => crate::config::parse_bool(&v)
            .ok_or_else(|| ApiError::BadRequest(format!("deleteMetadata: must be true or false, got {v:?}"))),
    }
}

pub async fn delete_group(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(group): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let (n, meta) = state.delete_group(tenant, &group, None, delete_metadata(q)?).await?;
    Ok(Json(json!({"success": true, "consumerGroup": group, "deletedPartitions": n, "metadataDeleted": meta})).into_response())
}

pub async fn delete_group_for_queue(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((group, queue)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let (n, meta) = state.delete_group(tenant, &group, Some(&tenant.stored(&queue)), delete_metadata(q)?).await?;
    Ok(Json(json!({"success": true, "consumerGroup": group, "queueName": queue, "deletedPartitions": n, "metadataDeleted": meta}))
        .into_response())
}

const SEEK_REFUSAL: &str = "Must specify toEnd=true or a timestamp";

/// `{"toEnd": true}` or `{"timestamp": ISO}`; `empty` is what an empty body means.
fn seek_target(body: Option<Value>, empty: Option<(bool, Option<chrono::DateTime<chrono::Utc>>)>) -> Option<(bool, Option<chrono::DateTime<chrono::Utc>>)> {
    let Some(v) = body else { return empty };
    if v.get("toEnd").and_then(Value::as_bool) == Some(true) {
        return Some((true, None));
    }
    v.get("timestamp").and_then(Value::as_str).and_then(crate::pop::params::parse_timestamp).map(|t| (false, Some(t)))
}

async fn seek(state: &AppState, group: &str, queue: &str, partition: Option<&str>, target: Option<(bool, Option<chrono::DateTime<chrono::Utc>>)>) -> Result<Response, ApiError> {
    let Some((to_end, ts)) = target else { return Ok(bad(json!({"error": SEEK_REFUSAL}))) };
    let Some(n) = groups::seek(&state.pool, group, queue, to_end, ts, partition).await? else {
        return Ok(queue_not_found());
    };
    state.pop.hotlist.forget(Some(queue), Some(group));
    state.pop.wake.pushed(queue);
    let mut answer = json!({"success": true, "consumerGroup": group, "queueName": crate::tenancy::shown(queue), "partitionsUpdated": n});
    if let Some(p) = partition {
        answer["partition"] = json!(p);
    }
    Ok(Json(answer).into_response())
}

pub async fn seek_queue(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((group, queue)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = super::body::optional_json(&state, &headers, body).await.unwrap_or(None);
    seek(&state, &group, &tenant.stored(&queue), None, seek_target(body, None)).await
}

pub async fn seek_partition(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((group, queue, partition)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = super::body::optional_json(&state, &headers, body).await.unwrap_or(None);
    seek(&state, &group, &tenant.stored(&queue), Some(&partition), seek_target(body, Some((true, None)))).await
}

pub async fn subscription(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(group): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = super::body::optional_json(&state, &headers, body).await?;
    let Some(ts) = body
        .as_ref()
        .and_then(|v| v.get("subscriptionTimestamp"))
        .and_then(Value::as_str)
        .and_then(crate::pop::params::parse_timestamp)
    else {
        return Ok(bad(json!({"error": "subscriptionTimestamp is required"})));
    };
    let n = groups::set_subscription(&state.pool, tenant, &group, ts).await?;
    Ok(Json(json!({"success": true, "consumerGroup": group, "subscriptionTimestamp": crate::json::iso_ms(ts), "queuesUpdated": n}))
        .into_response())
}

/// `POST /api/v1/stats/refresh`: figures are computed on read, so there is
/// nothing to rebuild; the answer says when the next read will be current.
pub async fn refresh_stats() -> Json<Value> {
    Json(json!({"success": true, "message": "statistics are computed on read", "refreshedAt": crate::json::iso_ms(chrono::Utc::now())}))
}

/// The scope of a status or analytics read: its window and filters, and
/// with tenancy on the tenant's queues only (`tenant` None: a broker-wide
/// read, every queue).
pub(super) fn scope(state: &AppState, p: &Params, tenant: Option<Tenant>) -> Result<crate::admin::status::Scope, ApiError> {
    let mut s = crate::admin::status::Scope::new(p.time("from")?, p.time("to")?);
    s.tenant = tenant.and_then(|t| confined(state, t));
    s.queue = p.text("queue").map(|q| tenant.unwrap_or_default().stored(&q));
    s.namespace = p.text("namespace");
    s.task = p.text("task");
    Ok(s)
}

pub async fn status(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(crate::admin::status::overview(&state.pool, &scope(&state, &p, Some(tenant))?).await?).into_response())
}

pub async fn status_queues(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    let answer = crate::admin::status::queues(&state.pool, &scope(&state, &p, Some(tenant))?, p.int("limit", 100, 1, 1000)?, p.int("offset", 0, 0, i64::MAX)?).await?;
    Ok(Json(answer).into_response())
}

pub async fn status_queue(State(state): State<AppState>, tenant: Tenant, Path(queue): Path<String>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(match crate::admin::status::queue(&state.pool, &tenant.stored(&queue), &scope(&state, &p, Some(tenant))?).await? {
        Some(v) => Json(v).into_response(),
        None => queue_not_found(),
    })
}

pub async fn status_queue_messages(State(state): State<AppState>, tenant: Tenant, Path(queue): Path<String>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let mut filter = super::messages::message_filter(&Params::parse(q)?, tenant)?;
    filter.queue = Some(tenant.stored(&queue));
    Ok(Json(crate::admin::messages::list(&state.pool, state.coalescer.encryption().ring(), &filter).await?).into_response())
}

pub async fn analytics(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    let interval = crate::reads::analytics::Interval::parse(p.text("interval").as_deref()).map_err(ApiError::BadRequest)?;
    Ok(Json(crate::admin::status::analytics(&state.pool, &scope(&state, &p, Some(tenant))?, interval.unit()).await?).into_response())
}
