//! System switches, every one kept in the database (`admin::switches`) and
//! announced on the brokers' channel, so every broker applies a change
//! within a second. Push maintenance: while on, pushes are spooled to disk
//! and answered `buffered`; turning it off replays the spools. Pop
//! maintenance: while on, every pop answers 204 at once with no work done.
//! The KV and timers kill switch (`/api/v1/system/kv-timers`) and the
//! ephemeral one.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;

/// Reads `{"enabled": bool}`.
async fn enabled_flag(headers: axum::http::HeaderMap, body: axum::body::Body) -> Result<bool, ApiError> {
    let bytes = super::body::read_limited(&headers, body, 4096).await?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::BadRequest(format!("bad body: {e}")))?;
    v.get("enabled").and_then(Value::as_bool).ok_or_else(|| ApiError::BadRequest("enabled: required, a boolean".into()))
}

pub async fn get_push_maintenance(State(state): State<AppState>) -> Json<Value> {
    let spooled = state.spool.as_ref().is_some_and(|s| s.has_pending());
    Json(json!({"enabled": state.push_maintenance(), "spoolPending": spooled, "spoolAvailable": state.spool.is_some()}))
}

pub async fn set_push_maintenance(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    let enabled = enabled_flag(headers, body).await?;
    if enabled && state.spool.is_none() {
        return Err(ApiError::BadRequest("enabled: push maintenance needs a writable FILE_BUFFER_DIR".into()));
    }
    state.switches.set(&state.pool, "push", !enabled).await?;
    state.push_maintenance.store(enabled, std::sync::atomic::Ordering::SeqCst);
    state.cluster.announce_change();
    tracing::info!(enabled, "push maintenance switched");
    if !enabled {
        let s = state.clone();
        tokio::spawn(async move { s.replay_spool().await });
    }
    Ok(Json(json!({"enabled": enabled})))
}

pub async fn get_pop_maintenance(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"enabled": state.pop.maintenance()}))
}

pub async fn set_pop_maintenance(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    let enabled = enabled_flag(headers, body).await?;
    state.switches.set(&state.pool, "pop", !enabled).await?;
    state.pop.set_maintenance(enabled);
    state.cluster.announce_change();
    tracing::info!(enabled, "pop maintenance switched");
    Ok(Json(json!({"enabled": enabled})))
}

pub async fn get_kv_timers(State(state): State<AppState>) -> Json<Value> {
    let kv = !state.switches.is_off("kv");
    let timers = !state.switches.is_off("timers");
    Json(json!({"enabled": kv && timers, "kv": kv, "timers": timers, "kvAllowedByEnvironment": state.config.kv.enabled}))
}

/// `{"enabled": bool}` flips both families; `{"kv": bool}` and
/// `{"timers": bool}` one each.
pub async fn set_kv_timers(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = super::body::read_limited(&headers, body, 4096).await?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::BadRequest(format!("bad body: {e}")))?;
    let flag = |k: &str| -> Result<Option<bool>, ApiError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::BadRequest(format!("{k}: must be a boolean"))),
        }
    };
    let all = flag("enabled")?;
    let mut wanted = Vec::new();
    for family in crate::admin::switches::FAMILIES {
        if let Some(enabled) = flag(family)?.or(all) {
            wanted.push((family, enabled));
        }
    }
    if wanted.is_empty() {
        return Err(ApiError::BadRequest("enabled, kv or timers: required, a boolean".into()));
    }
    // Every family named, in one statement.
    state.switches.set_many(&state.pool, &wanted).await?;
    for (family, enabled) in &wanted {
        tracing::info!(family, enabled, "switched");
    }
    state.cluster.announce_change();
    Ok(get_kv_timers(State(state)).await)
}

pub async fn get_ephemeral(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"enabled": state.ephemeral_enabled(), "allowedByEnvironment": state.config.ephemeral.enabled,
                "usedBytes": state.ephemeral.used_bytes(), "maxBytes": state.config.ephemeral.max_bytes}))
}

/// `{"enabled": bool}`: the ephemeral kill switch, kept in the database like
/// the KV one so every broker honours it. Off, every ephemeral verb answers
/// 503 and the queues keep what they hold (a reset or delete frees it).
pub async fn set_ephemeral(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    let enabled = enabled_flag(headers, body).await?;
    state.switches.set(&state.pool, "ephemeral", enabled).await?;
    state.cluster.announce_change();
    tracing::info!(enabled, "ephemeral switched");
    Ok(get_ephemeral(State(state)).await)
}

/// `GET /api/v1/system/brokers`: the brokers on this database, live or
/// recently gone, with their heartbeats.
pub async fn brokers(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(crate::cluster::brokers(&state.pool, &state.cluster.instance).await?))
}

/// The spool as the operator sees it: where, how much, whether a replay is due.
fn buffers(state: &AppState) -> Value {
    match &state.spool {
        Some(spool) => {
            let s = spool.stats();
            json!({"available": true, "dir": s.dir, "files": s.files, "bytes": s.bytes, "pending": s.pending, "quarantined": s.quarantined,
                   "pushMaintenance": state.push_maintenance()})
        }
        None => json!({"available": false, "dir": null, "files": 0, "bytes": 0, "pending": false, "quarantined": 0,
                       "pushMaintenance": state.push_maintenance()}),
    }
}

/// `GET /api/v1/status/buffers`: the push spool (issue 28 §3).
pub async fn status_buffers(State(state): State<AppState>) -> Json<Value> {
    Json(buffers(&state))
}

/// `GET /status`: one page about this broker process (issue 28 §3):
/// version, uptime, its name, the database (reachable, and how long a
/// round trip took), the spool, the maintenance switches and encryption.
pub async fn broker_status(State(state): State<AppState>) -> Json<Value> {
    let t = std::time::Instant::now();
    let database = match crate::db::ping(&state.pool).await {
        Ok(p) => json!({"reachable": true, "roundTripMs": t.elapsed().as_secs_f64() * 1000.0, "inRecovery": p.in_recovery,
                         "embedded": matches!(state.config.database, crate::config::Database::Embedded { .. })}),
        Err(e) => json!({"reachable": false, "error": e.to_string(),
                         "embedded": matches!(state.config.database, crate::config::Database::Embedded { .. })}),
    };
    let ring = state.coalescer.encryption().ring();
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "serverId": state.config.server_id,
        "uptimeSeconds": state.telemetry.uptime_seconds().floor() as u64,
        "database": database,
        "spool": buffers(&state),
        "maintenance": {"push": state.push_maintenance(), "pop": state.pop.maintenance()},
        "encryption": {"enabled": ring.is_some(), "keyId": ring.map(|r| r.current_id().to_string())},
    }))
}
