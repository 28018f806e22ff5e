//! `POST /api/v1/timers`, `GET /api/v1/timers/{queue}` and
//! `GET|DELETE /api/v1/timers/{queue}/{key…}` (issue 29 §3): parse, hand to
//! `timers`, render. Errors use the `{error, reason, detail}` envelope. A
//! cancel by `DELETE` is never refused by the kill switch: a producer that
//! cannot stop its timers would keep producing messages it cannot stop.

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::auth::Principal;
use super::kv::{envelope, json_body, unavailable};
use super::query::Params;
use super::AppState;
use crate::tenancy::Tenant;
use crate::timers::{self, TimerOp};

fn bad(detail: String) -> Response {
    envelope(StatusCode::BAD_REQUEST, "timers_bad_request", "invalid_operation", &detail)
}

/// `POST /api/v1/timers` `{operations: [...]}` (or a bare array).
pub async fn batch(State(state): State<AppState>, tenant: Tenant, principal: Option<axum::Extension<Principal>>, headers: HeaderMap, raw: axum::body::Body) -> Response {
    if !state.timers_enabled() {
        return envelope(StatusCode::SERVICE_UNAVAILABLE, "timers_disabled", "disabled", "timers are switched off (/api/v1/system/kv-timers)");
    }
    let v = match json_body(&state, &headers, raw, "timers_bad_request").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let operations = if v.is_array() { &v } else { v.get("operations").unwrap_or(&Value::Null) };
    let mut ops = match timers::parse(operations, "operations") {
        Ok(ops) => ops,
        Err(detail) => return bad(detail),
    };
    ops.iter_mut().for_each(|op| op.own(tenant));
    if let Err(refused) = state.quotas.push_and_schedule(tenant, &[], &ops) {
        return refused.into_response();
    }
    // Scheduling is a producer's (write-only); cancelling destroys what
    // another scheduled, as DELETE /api/v1/timers/… does: read-write.
    if let Some(i) = ops.iter().position(|op| matches!(op, TimerOp::Cancel { .. })) {
        if !super::auth::permits(principal.as_ref().map(|p| &p.0), super::auth::Level::ReadWrite) {
            return super::auth::insufficient(&format!("operations[{i}]: a cancel needs read-write"));
        }
    }
    let producer = principal.and_then(|p| p.0.sub);
    // One transaction: a call is applied whole or not at all, also when the
    // database fails half-way through it.
    let applied = async {
        let mut client = state.pool.get().await.map_err(crate::db::DbError::from)?;
        let tx = client.transaction().await?;
        let results = timers::run(&tx, &ops, producer.as_deref(), state.coalescer.encryption()).await?;
        tx.commit().await.map_err(crate::db::DbError::from)?;
        Ok::<_, timers::TimerError>(results)
    };
    match applied.await {
        Ok(results) => Json(json!({"results": results})).into_response(),
        Err(timers::TimerError::Db(e)) => unavailable(e),
        Err(timers::TimerError::NoKey(k)) => super::error::ApiError::NoKey(k.to_string()).into_response(),
    }
}

/// `GET /api/v1/timers/{queue}` (`after`, `limit`; `mode=count&prefix=`).
pub async fn list(State(state): State<AppState>, tenant: Tenant, Path(queue): Path<String>, RawQuery(q): RawQuery) -> Response {
    let queue = tenant.stored(&queue);
    let p = match Params::parse(q) {
        Ok(p) => p,
        Err(e) => return bad(e.to_string()),
    };
    let answer = if p.text("mode").as_deref() == Some("count") {
        timers::count(&state.pool, &queue, &p.text("prefix").unwrap_or_default()).await
    } else {
        let limit = match p.text("limit").map(|l| l.parse::<i64>()) {
            None => timers::DEFAULT_LIST,
            Some(Ok(l)) => l.clamp(1, timers::MAX_LIST),
            Some(Err(_)) => return bad("limit: must be an integer".into()),
        };
        timers::list(&state.pool, &queue, p.text("after").as_deref(), limit).await
    };
    answer.map(|v| Json(v).into_response()).unwrap_or_else(unavailable)
}

/// `GET /api/v1/timers/{queue}/{key…}`: the pending timer or `{found: false}`.
pub async fn peek(State(state): State<AppState>, tenant: Tenant, Path((queue, key)): Path<(String, String)>) -> Response {
    timers::peek(&state.pool, state.coalescer.encryption().ring(), &tenant.stored(&queue), &key).await.map(|v| Json(v).into_response()).unwrap_or_else(unavailable)
}

/// `DELETE /api/v1/timers/{queue}/{key…}` (`?txn=`): one cancel result.
pub async fn cancel(State(state): State<AppState>, tenant: Tenant, Path((queue, key)): Path<(String, String)>, RawQuery(q): RawQuery) -> Response {
    let queue = tenant.stored(&queue);
    let txn = match Params::parse(q) {
        Ok(p) => p.text("txn"),
        Err(e) => return bad(e.to_string()),
    };
    let client = match state.pool.get().await {
        Ok(c) => c,
        Err(e) => return unavailable(crate::db::DbError::from(e)),
    };
    match timers::run(&client, &[TimerOp::Cancel { queue, key, txn }], None, state.coalescer.encryption()).await {
        Ok(mut results) => Json(results.remove(0)).into_response(),
        Err(timers::TimerError::Db(e)) => unavailable(e),
        Err(timers::TimerError::NoKey(k)) => super::error::ApiError::NoKey(k.to_string()).into_response(),
    }
}
