//! The three pop routes (API.md §2.2). Parse, hand to the pop path, render:
//! 200 with the JSON answer, or 204 with no body at all.

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::tenancy::Tenant;
use super::AppState;
use crate::pop::{PopError, PopParams, Route};

fn query_pairs(raw: Option<String>) -> Result<Vec<(String, String)>, ApiError> {
    super::query::Params::parse(raw).map(|p| p.0)
}

async fn serve(state: &AppState, route: Route, pairs: &[(String, String)]) -> Result<Response, ApiError> {
    let params = PopParams::parse(pairs, state.pop.config()).map_err(ApiError::BadRequest)?;
    match state.pop.pop(&route, &params).await {
        Ok(Some((body, false))) => Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response()),
        Ok(Some((body, true))) => Ok(([(header::CONTENT_TYPE, "application/x-queen-pop")], body).into_response()),
        Ok(None) => Ok(StatusCode::NO_CONTENT.into_response()),
        // A stored-procedure error answers a bare 204, as the seed says; the
        // operator still gets the text in the log.
        Err(PopError::Database(e)) => {
            tracing::warn!(error = %crate::db::describe(&e), "pop failed in PostgreSQL; answering 204");
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Err(e) => Err(e.into()),
    }
}

/// A discovery pop naming neither label (seeds/pop-routes.md, to the byte).
const DISCOVERY_REFUSAL: &str = r#"{"success":false,"error":"namespace or task is required","messages":[]}"#;

fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    crate::push::validate::check_name(name).map_err(|p| ApiError::BadRequest(format!("{what}: {p}")))
}

pub async fn pop_queue(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(queue): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    check_name("queue", &queue)?;
    serve(&state, Route::Wildcard { queue: tenant.into_stored(queue) }, &query_pairs(q)?).await
}

pub async fn pop_partition(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((queue, partition)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    check_name("queue", &queue)?;
    check_name("partition", &partition)?;
    serve(&state, Route::Specific { queue: tenant.into_stored(queue), partition }, &query_pairs(q)?).await
}

pub async fn pop_discovery(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let pairs = query_pairs(q)?;
    let label = |k: &str| pairs.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone()).filter(|v| !v.is_empty());
    let (namespace, task) = (label("namespace"), label("task"));
    if namespace.is_none() && task.is_none() {
        // The documented bytes, key order included (a JSON map would sort them).
        return Ok((
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            DISCOVERY_REFUSAL,
        )
            .into_response());
    }
    serve(&state, Route::Discovery { tenant: tenant.0, namespace, task }, &pairs).await
}
