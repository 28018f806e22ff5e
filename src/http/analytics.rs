//! `GET /api/v1/analytics/*` (issue 28 §3): parse the shared query keys
//! (`from`, `to`, `queue`, `namespace`, `task`, `interval`, `limit`,
//! `offset`), hand to `reads::analytics`, render.

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::admin::scope;
use super::error::ApiError;
use super::query::Params;
use super::AppState;
use crate::reads::analytics::{self, Interval, Page};
use crate::tenancy::Tenant;

fn interval(p: &Params) -> Result<Interval, ApiError> {
    Interval::parse(p.text("interval").as_deref()).map_err(ApiError::BadRequest)
}

fn page(p: &Params) -> Result<Page, ApiError> {
    Ok(Page { limit: p.int("limit", 100, 1, 1000)?, offset: p.int("offset", 0, 0, i64::MAX)? })
}

pub async fn system_metrics(State(state): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(analytics::system_metrics(&state.pool, &scope(&state, &p, None)?, interval(&p)?).await?).into_response())
}

pub async fn worker_metrics(State(state): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(analytics::worker_metrics(&state.pool, &scope(&state, &p, None)?, interval(&p)?).await?).into_response())
}

pub async fn queue_lag(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(analytics::queue_lag(&state.pool, &scope(&state, &p, Some(tenant))?, page(&p)?).await?).into_response())
}

pub async fn queue_ops(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(analytics::queue_ops(&state.pool, &scope(&state, &p, Some(tenant))?, interval(&p)?, page(&p)?).await?).into_response())
}

pub async fn workload(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(analytics::workload(&state.pool, &scope(&state, &p, Some(tenant))?, page(&p)?).await?).into_response())
}

pub async fn retention(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(analytics::retention(&state.pool, &scope(&state, &p, Some(tenant))?, page(&p)?).await?).into_response())
}

pub async fn dlq_signatures(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    // The whole DLQ unless the caller bounds it.
    let bounds = (p.time("from")?, p.time("to")?);
    Ok(Json(analytics::dlq_signatures(&state.pool, &scope(&state, &p, Some(tenant))?, bounds, page(&p)?).await?).into_response())
}

pub async fn partition_liveness(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    Ok(Json(analytics::partition_liveness(&state.pool, &scope(&state, &p, Some(tenant))?, page(&p)?).await?).into_response())
}

pub async fn postgres_stats(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(Json(analytics::postgres_stats(&state.pool).await?).into_response())
}

pub async fn parked_replicas(State(state): State<AppState>) -> Result<Response, ApiError> {
    let parked = state.telemetry.parked.load(std::sync::atomic::Ordering::Relaxed);
    Ok(Json(analytics::parked_replicas(&state.pool, &state.config.server_id, parked).await?).into_response())
}
