//! The lease-free reads of the log (issue 28): fetch by offset, partition
//! discovery, and traces (whose one write lives here with its reads).
//! Parse, hand to `reads`, render.

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::query::Params;
use crate::reads::traces::TraceError;
use super::AppState;
use crate::tenancy::Tenant;

/// `POST /api/v1/partitions/changed`.
pub async fn partitions_changed(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, body: axum::body::Body) -> Result<Response, ApiError> {
    let v = super::body::optional_json(&state, &headers, body).await?.unwrap_or(serde_json::Value::Null);
    let mut entries = crate::reads::changed::parse(&v).map_err(ApiError::BadRequest)?;
    entries.iter_mut().for_each(|e| e.queue = tenant.stored(&e.queue));
    Ok(Json(crate::reads::changed::answer(&state.pool, &entries).await?).into_response())
}

/// `POST /api/v1/fetch`.
pub async fn fetch(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, body: axum::body::Body) -> Result<Response, ApiError> {
    let v = super::body::optional_json(&state, &headers, body).await?.unwrap_or(serde_json::Value::Null);
    let mut req = crate::reads::fetch::parse(&v).map_err(ApiError::BadRequest)?;
    req.entries.iter_mut().for_each(|e| e.queue = tenant.stored(&e.queue));
    let ring = state.coalescer.encryption().ring();
    let answer = crate::reads::fetch::fetch(&state.pool, ring, &state.pop.wake, state.pop.config(), &req).await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], answer.body).into_response())
}

/// `POST /api/v1/traces`: 200 once stored, 404 for a partition that does
/// not exist, 400 naming the field.
pub async fn post_trace(State(state): State<AppState>, tenant: Tenant, headers: HeaderMap, body: axum::body::Body) -> Result<Response, ApiError> {
    let v = super::body::optional_json(&state, &headers, body).await?.unwrap_or(serde_json::Value::Null);
    let mut event = crate::reads::traces::parse(&v).map_err(ApiError::BadRequest)?;
    // The tenant's own partitions and names (`tenancy`): another tenant's
    // partition answers as one that does not exist.
    if crate::tenancy::enabled(&state.config) {
        let foreign = state.owners.foreign(&state.pool, tenant, &[event.partition_id]).await.map_err(|e| ApiError::from_db(&e))?;
        if !foreign.is_empty() {
            return Err(ApiError::NotFound(TraceError::UnknownPartition(event.partition_id).to_string()));
        }
        event.names.iter_mut().for_each(|n| *n = tenant.stored(n));
    }
    let trace_id = event.trace_id;
    match state.traces.write(event).await {
        Ok(()) => Ok(Json(serde_json::json!({"success": true, "traceId": trace_id})).into_response()),
        Err(e @ TraceError::UnknownPartition(_)) => Err(ApiError::NotFound(e.to_string())),
        Err(TraceError::Pool) => Err(ApiError::Pool),
        Err(e @ TraceError::Db(_)) => Err(ApiError::Internal(e.to_string())),
    }
}

/// Paging and time bounds of the trace reads.
fn trace_page(p: &Params) -> Result<crate::reads::traces::Page, ApiError> {
    Ok(crate::reads::traces::Page {
        limit: p.int("limit", 100, 1, 1000)?,
        offset: p.int("offset", 0, 0, i64::MAX)?,
        from: p.time("from")?,
        to: p.time("to")?,
    })
}

/// `GET /api/v1/traces/names`.
pub async fn trace_names(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    let tenant = crate::tenancy::enabled(&state.config).then_some(tenant);
    Ok(Json(crate::reads::traces::names(&state.pool, tenant, p.text("search").as_deref(), &trace_page(&p)?).await?).into_response())
}

/// `GET /api/v1/traces/by-name/{name}`.
pub async fn traces_by_name(State(state): State<AppState>, tenant: Tenant, Path(name): Path<String>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(crate::reads::traces::by_name(&state.pool, &tenant.stored(&name), &trace_page(&p)?).await?).into_response())
}

/// `GET /api/v1/traces/{partitionId}/{transactionId}`: 404 when the
/// partition does not exist; a message without traces has an empty list.
pub async fn traces_for_message(State(state): State<AppState>, tenant: Tenant, Path((pid, txn)): Path<(String, String)>) -> Result<Response, ApiError> {
    let not_found = || ApiError::NotFound(format!("partition {pid:?} not found"));
    let Some(id) = pid.trim().parse::<i64>().ok().filter(|id| *id > 0) else { return Err(not_found()) };
    match crate::reads::traces::for_message(&state.pool, tenant, id, &txn).await? {
        Some(v) => Ok(Json(v).into_response()),
        None => Err(not_found()),
    }
}
