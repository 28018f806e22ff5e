//! The tenants themselves (issue 49): `POST|GET /api/v1/resources/quota`,
//! `GET /api/v1/resources/tenants` and `DELETE /api/v1/resources/tenant`.
//! Parse, check who may act on which tenant, hand to `tenancy::quota` or
//! the purge, render.
//!
//! A route acts on the caller's tenant unless the request names another
//! (`tenant` or `tenantId`), which only an admin across tenants may do
//! (`tenancy::admin_all`). With tenancy on, quotas are set only by such an
//! admin: a tenant does not raise its own limits.

use std::time::{Duration, Instant};

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::auth::Principal;
use super::error::ApiError;
use super::query::Params;
use super::AppState;
use crate::tenancy::quota::{Kind, Limit};
use crate::tenancy::Tenant;

fn refuse(status: StatusCode, error: String, code: &str) -> Response {
    (status, Json(json!({"error": error, "code": code}))).into_response()
}

fn forbidden_across() -> Response {
    refuse(
        StatusCode::FORBIDDEN,
        "acting on another tenant, or setting quotas, needs an admin across tenants (QUEEN_TENANCY_ADMIN_ALL or QUEEN_TENANCY_ADMIN_CLAIM)".into(),
        "tenant_forbidden",
    )
}

/// The tenant the request acts on: the one it names, else the caller's.
#[allow(clippy::result_large_err)]
fn target(state: &AppState, caller: Tenant, principal: Option<&Principal>, named: Option<&Value>) -> Result<Tenant, Response> {
    let t = match named {
        None | Some(Value::Null) => return Ok(caller),
        Some(v) => match v.as_str().and_then(crate::tenancy::parse) {
            Some(t) => Tenant(t),
            None => return Err(refuse(StatusCode::BAD_REQUEST, "tenant: must be a UUID (8-4-4-4-12 hex digits)".into(), "bad_request")),
        },
    };
    if crate::tenancy::reserved(t) {
        return Err(refuse(StatusCode::FORBIDDEN, "this tenant is reserved: no route acts on it".into(), "reserved_tenant"));
    }
    if t != caller && !crate::tenancy::admin_all(&state.config, principal) {
        return Err(forbidden_across());
    }
    Ok(t)
}

/// A limit's value as the route takes it: a whole number, or null for none.
fn limit_value(field: &str, v: &Value) -> Result<Value, String> {
    match v {
        Value::Null => Ok(Value::Null),
        v if v.as_u64().is_some_and(|n| n <= i64::MAX as u64) => Ok(v.clone()),
        other => Err(format!("{field}: a whole number of at least 0, or null for no limit, got {other}")),
    }
}

/// camelCase to the snake_case older clients send.
fn snake(field: &str) -> String {
    field.chars().flat_map(|c| if c.is_ascii_uppercase() { vec!['_', c.to_ascii_lowercase()] } else { vec![c] }).collect()
}

/// A kind's limits in force, by field.
fn kind_json(eff: &crate::tenancy::quota::Effective, kind: Kind, configured: bool) -> Value {
    let mut m = Map::new();
    m.insert("enabled".into(), json!(eff.enabled(kind)));
    m.insert("configured".into(), json!(configured));
    for l in kind.limits() {
        m.insert(l.field().into(), json!(l.get(&eff.limits)));
    }
    Value::Object(m)
}

/// `POST /api/v1/resources/quota` `{tenant?, kind, enabled?, <limits>}`.
pub async fn set_quota(
    State(state): State<AppState>,
    caller: Tenant,
    principal: Option<axum::Extension<Principal>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let principal = principal.map(|p| p.0);
    let v = super::body::optional_json(&state, &headers, body).await?.unwrap_or(Value::Null);
    let Some(body) = v.as_object() else { return Err(ApiError::BadRequest("body: must be an object {tenant?, kind, enabled?, limits}".into())) };
    let tenant = match target(&state, caller, principal.as_ref(), body.get("tenant").or_else(|| body.get("tenantId"))) {
        Ok(t) => t,
        Err(r) => return Ok(r),
    };
    if crate::tenancy::enabled(&state.config) && !crate::tenancy::admin_all(&state.config, principal.as_ref()) {
        return Ok(forbidden_across());
    }
    let kind = match body.get("kind").and_then(Value::as_str).and_then(Kind::parse) {
        Some(k) => k,
        None => return Err(ApiError::BadRequest("kind: must be queues, kv or ephemeral".into())),
    };
    let enabled = match body.get("enabled") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(ApiError::BadRequest(format!("enabled: must be true or false, got {other}"))),
    };
    let mut limits = Map::new();
    for (key, value) in body {
        if matches!(key.as_str(), "tenant" | "tenantId" | "kind" | "enabled") {
            continue;
        }
        let Some(limit) = kind.limits().find(|l| l.field() == key || snake(l.field()) == *key) else {
            let known: Vec<&str> = kind.limits().map(Limit::field).collect();
            return Err(ApiError::BadRequest(format!("{key}: not a limit of kind {} (its limits: {})", kind.name(), known.join(", "))));
        };
        limits.insert(limit.field().into(), limit_value(key, value).map_err(ApiError::BadRequest)?);
    }
    crate::tenancy::quota::store(&state.pool, &state.quotas, tenant, kind, enabled, &limits).await?;
    let mut answer = json!({"success": true, "tenant": tenant.to_string(), "kind": kind.name(), "enabled": enabled});
    for (k, v) in &limits {
        answer[k] = v.clone();
    }
    answer["effective"] = kind_json(&state.quotas.effective(tenant), kind, true);
    Ok(Json(answer).into_response())
}

/// `GET /api/v1/resources/quota?tenant=`: the limits in force by kind and
/// the usage they are checked against.
pub async fn get_quota(
    State(state): State<AppState>,
    caller: Tenant,
    principal: Option<axum::Extension<Principal>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    let named = p.text("tenant").or_else(|| p.text("tenantId")).map(Value::String);
    let tenant = match target(&state, caller, principal.as_ref().map(|p| &p.0), named.as_ref()) {
        Ok(t) => t,
        Err(r) => return Ok(r),
    };
    let eff = state.quotas.effective(tenant);
    let rows = state.quotas.rows(tenant);
    let quotas: Map<String, Value> = Kind::ALL.into_iter().map(|k| (k.name().to_string(), kind_json(&eff, k, rows.contains_key(&k)))).collect();
    let client = state.pool.get().await.map_err(crate::db::DbError::from)?;
    let totals = client
        .query_one(
            "SELECT (SELECT count(*) FROM queen.queues WHERE tenant_id = $1)::bigint,
                    (SELECT COALESCE(sum(pg_column_size(s.blob)), 0) FROM queen.queues q
                     JOIN queen.partitions p ON p.queue_id = q.id JOIN queen.segments s ON s.partition_id = p.id
                     WHERE q.tenant_id = $1)::bigint",
            &[&tenant.0],
        )
        .await
        .map_err(crate::db::DbError::from)?;
    let mut usage = state.quotas.usage(tenant);
    usage["queues"] = json!(totals.get::<_, i64>(0));
    usage["storedBytes"] = json!(totals.get::<_, i64>(1));
    usage["ephemeralBytesOnThisBroker"] = json!(state.ephemeral.held_by(|name| tenant.owns(name)));
    Ok(Json(json!({"tenant": tenant.to_string(), "quotas": quotas, "usage": usage})).into_response())
}

/// `GET /api/v1/resources/tenants`: every tenant that holds anything (or
/// has quotas), with what it holds. An admin across tenants only.
pub async fn list(State(state): State<AppState>, principal: Option<axum::Extension<Principal>>) -> Result<Response, ApiError> {
    if !crate::tenancy::admin_all(&state.config, principal.as_ref().map(|p| &p.0)) {
        return Ok(forbidden_across());
    }
    let client = state.pool.get().await.map_err(crate::db::DbError::from)?;
    let rows = client
        .query(
            "WITH queues AS (
                 SELECT q.tenant_id AS t, count(DISTINCT q.id) AS queues, count(p.id) AS partitions,
                        COALESCE(sum(p.last_offset + 1 - p.log_start), 0) AS messages
                 FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id GROUP BY 1),
             kv AS (
                 SELECT CASE WHEN left(ns, 1) = chr(1) AND substr(ns, 38, 1) = chr(1) THEN substr(ns, 2, 36)::uuid
                             ELSE '00000000-0000-0000-0000-000000000001'::uuid END AS t, count(*) AS keys
                 FROM queen.kv GROUP BY 1),
             quotas AS (SELECT tenant_id AS t, array_agg(kind ORDER BY kind) AS kinds FROM queen.tenant_quotas GROUP BY 1)
             SELECT t, COALESCE(queues.queues, 0)::bigint, COALESCE(queues.partitions, 0)::bigint, COALESCE(queues.messages, 0)::bigint,
                    COALESCE(kv.keys, 0)::bigint, COALESCE(quotas.kinds, '{}')
             FROM queues FULL JOIN kv USING (t) FULL JOIN quotas USING (t) ORDER BY t",
            &[],
        )
        .await
        .map_err(crate::db::DbError::from)?;
    let tenants: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"tenant": r.get::<_, uuid::Uuid>(0).to_string(), "queues": r.get::<_, i64>(1), "partitions": r.get::<_, i64>(2),
                   "messages": r.get::<_, i64>(3), "kvKeys": r.get::<_, i64>(4), "quotas": r.get::<_, Vec<String>>(5)})
        })
        .collect();
    Ok(Json(json!({"tenants": tenants, "total": tenants.len()})).into_response())
}

/// How long one purge request works before it answers `done: false`
/// (sent again, it goes on where it stopped).
const PURGE_BUDGET: Duration = Duration::from_secs(20);
/// Rows of one table removed per statement.
const PURGE_BATCH: i64 = 5_000;

/// `DELETE /api/v1/resources/tenant` (`?tenant=`, or a body `{tenant}`,
/// else the caller's): removes everything the tenant holds, in bounded
/// batches, each committed on its own.
pub async fn purge(
    State(state): State<AppState>,
    caller: Tenant,
    principal: Option<axum::Extension<Principal>>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let p = Params::parse(q)?;
    let body = super::body::optional_json(&state, &headers, body).await?.unwrap_or(Value::Null);
    let named = p.text("tenant").map(Value::String).or_else(|| body.get("tenant").or_else(|| body.get("tenantId")).cloned());
    let tenant = match target(&state, caller, principal.as_ref().map(|p| &p.0), named.as_ref()) {
        Ok(t) => t,
        Err(r) => return Ok(r),
    };
    if tenant.is_default() {
        return Err(ApiError::BadRequest("tenant: refusing to purge the default tenant".into()));
    }
    let prefix = tenant.stored("");
    let started = Instant::now();
    let client = state.pool.get().await.map_err(crate::db::DbError::from)?;
    let mut counts = Map::new();
    let mut done = true;
    // Batched deletes of the rows keyed by the tenant's stored names, timers
    // first (they would push into the queues being removed).
    let batched: [(&str, &str); 5] = [
        ("timersDeleted", "DELETE FROM queen.timers WHERE ctid IN (SELECT ctid FROM queen.timers WHERE starts_with(queue, $1) LIMIT $2)"),
        // Its Kafka producers, with their windows and anything staged (the
        // prefix holds the tenant's UUID between its marks).
        ("kafkaProducersDeleted", "DELETE FROM queen.kafka_producers WHERE producer_id IN
             (SELECT producer_id FROM queen.kafka_producers WHERE tenant_id = substr($1, 2, 36)::uuid LIMIT $2)"),
        ("streamQueriesDeleted", "DELETE FROM queen.stream_queries WHERE id IN (SELECT id FROM queen.stream_queries WHERE starts_with(name, $1) LIMIT 10) AND $2::bigint > 0"),
        ("kvKeysDeleted", "DELETE FROM queen.kv WHERE ctid IN (SELECT ctid FROM queen.kv WHERE starts_with(ns, $1) LIMIT $2)"),
        ("traceNamesDeleted", "DELETE FROM queen.trace_names WHERE ctid IN (SELECT ctid FROM queen.trace_names WHERE starts_with(name, $1) LIMIT $2)"),
    ];
    'tables: for (what, sql) in batched {
        let mut n = 0u64;
        loop {
            if started.elapsed() > PURGE_BUDGET {
                done = false;
                counts.insert(what.into(), json!(n));
                break 'tables;
            }
            let gone = client.execute(sql, &[&prefix, &PURGE_BATCH]).await.map_err(crate::db::DbError::from)?;
            n += gone;
            if gone == 0 {
                break;
            }
        }
        counts.insert(what.into(), json!(n));
    }
    // The queues, one at a time: each with its traces, then the queue and
    // everything it holds (`delete_queue_v1`).
    let (mut queues, mut partitions, mut messages) = (0u64, 0i64, 0i64);
    while done {
        if started.elapsed() > PURGE_BUDGET {
            done = false;
            break;
        }
        let next = client
            .query_opt("SELECT id, name FROM queen.queues WHERE tenant_id = $1 ORDER BY id LIMIT 1", &[&tenant.0])
            .await
            .map_err(crate::db::DbError::from)?;
        let Some(row) = next else { break };
        let (qid, name): (i64, String) = (row.get(0), row.get(1));
        client
            .execute(
                "DELETE FROM queen.traces t USING queen.partitions p WHERE t.partition_id = p.id AND p.queue_id = $1",
                &[&qid],
            )
            .await
            .map_err(crate::db::DbError::from)?;
        let answer = state.delete_queue(&name).await?;
        queues += 1;
        partitions += answer["partitionsDeleted"].as_i64().unwrap_or(0);
        messages += answer["messagesDeleted"].as_i64().unwrap_or(0);
    }
    counts.insert("queuesDeleted".into(), json!(queues));
    counts.insert("partitionsDeleted".into(), json!(partitions));
    counts.insert("messagesDeleted".into(), json!(messages));
    if done {
        client.execute("DELETE FROM queen.tenant_quotas WHERE tenant_id = $1", &[&tenant.0]).await.map_err(crate::db::DbError::from)?;
        // This broker's ephemeral queues of the tenant; the other brokers'
        // go with their idle sweep.
        let names = state.ephemeral.names_of(|name| tenant.owns(name));
        for name in &names {
            state.ephemeral.delete(name);
        }
        counts.insert("ephemeralQueuesDeleted".into(), json!(names.len()));
        state.quotas.forget(tenant);
        if let Err(e) = state.quotas.sample(&state.pool).await {
            tracing::warn!(error = %e, "quota sample after a purge failed; the next one applies it");
        }
    }
    let mut answer = json!({"success": true, "tenant": tenant.to_string(), "done": done});
    for (k, v) in counts {
        answer[k] = v;
    }
    Ok(Json(answer).into_response())
}
