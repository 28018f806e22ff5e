//! Timers (issue 29 §3, API.md §2.10): a message scheduled for later under
//! a key, `POST /api/v1/timers` and the reads of `GET /api/v1/timers/…`.
//!
//! A schedule stores the message as it will be pushed (its JSON payload,
//! partition, transactionId `txn` and message id, both known now) in
//! `queen.timers` (migrations/0013_timers.sql); the fire service ([`fire`])
//! pushes due timers through the push path and deletes them in one
//! transaction, so each fires exactly once. The verdicts live in the stored
//! functions; this module validates operations and renders answers. The
//! same [`run`] serves the route and a transaction's `timers` rider.
//!
//! A timer of a queue that encrypts keeps its payload sealed until it fires
//! (migrations/0024_sealed_timers.sql): the envelope is bound to the timer's
//! message id; a broker without the key refuses to schedule one (503).

pub mod fire;

use base64::Engine as _;
use deadpool_postgres::GenericClient;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::json::iso_ms;
use crate::db::DbError;

/// Why [`run`] failed: the database, or a schedule to a queue that
/// encrypts on a broker without the key (nothing applied).
#[derive(Debug, thiserror::Error)]
pub enum TimerError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    NoKey(#[from] crate::crypto::NoKeyToSeal),
}

impl From<tokio_postgres::Error> for TimerError {
    fn from(e: tokio_postgres::Error) -> Self {
        TimerError::Db(DbError::from(e))
    }
}

/// Opens a sealed timer's payload (bound to its message id).
pub fn open_sealed(ring: Option<&crate::crypto::KeyRing>, sealed: &[u8], message_id: &Uuid) -> Result<String, crate::crypto::OpenError> {
    crate::crypto::open(ring, sealed, message_id.as_bytes()).map(|p| String::from_utf8_lossy(&p).into_owned())
}

/// Largest payload, as JSON text after base64 (and zstd) decoding.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// Longest timer key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Most operations in one call.
pub const MAX_OPS: usize = 1000;
/// Rows of a list page: the default and the ceiling a `limit` is clamped to.
pub const DEFAULT_LIST: i64 = 100;
pub const MAX_LIST: i64 = 1000;
/// A delay beyond ten years is a mistake, not a plan.
const MAX_DELAY_MS: i64 = 10 * 366 * 24 * 3600 * 1000;

/// Fields the broker owns: refused on input (the client refuses them too).
const SERVER_OWNED: &[&str] = &[
    "producerSub", "producer_sub", "messageId", "message_id", "tenant", "tenantId", "tenant_id", "deliverAt", "deliver_at",
    "delaySeconds", "delay_seconds", "attempts", "claimToken", "claim_token", "claimedUntil",
];

/// One validated operation.
#[derive(Debug, Clone, PartialEq)]
pub enum TimerOp {
    /// `schedule` and `reschedule` (the same upsert).
    Schedule { queue: String, key: String, partition: String, payload: String, txn: String, delay_ms: i64 },
    Cancel { queue: String, key: String, txn: Option<String> },
}

impl TimerOp {
    /// Moves the operation to `tenant`'s queue of the same name.
    pub fn own(&mut self, tenant: crate::tenancy::Tenant) {
        match self {
            TimerOp::Schedule { queue, .. } | TimerOp::Cancel { queue, .. } => *queue = tenant.stored(queue),
        }
    }
}

/// Reads `operations` (the route's body or a transaction's `timers`); the
/// error names the operation and the field.
pub fn parse(operations: &Value, at: &str) -> Result<Vec<TimerOp>, String> {
    let list = operations.as_array().ok_or_else(|| format!("{at}: required, an array of operations"))?;
    if list.len() > MAX_OPS {
        return Err(format!("{at}: at most {MAX_OPS} operations per call, got {}", list.len()));
    }
    let ops: Vec<TimerOp> = list.iter().enumerate().map(|(i, op)| parse_one(op, &format!("{at}[{i}]"))).collect::<Result<_, _>>()?;
    // A key is one timer: two operations on it in one call would leave its
    // fate to their order, so such a call is refused before anything runs.
    let mut seen = std::collections::HashMap::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        if let Some(first) = seen.insert(op.identity(), i) {
            let (queue, key) = op.identity();
            return Err(format!(
                "{at}[{i}].timerKey: {key:?} of queue {queue:?} appears twice in one call (first at {at}[{first}]); one operation per timer key"
            ));
        }
    }
    Ok(ops)
}

impl TimerOp {
    /// (queue, timerKey): what names a timer.
    fn identity(&self) -> (&str, &str) {
        match self {
            TimerOp::Schedule { queue, key, .. } | TimerOp::Cancel { queue, key, .. } => (queue, key),
        }
    }
}

fn parse_one(op: &Value, at: &str) -> Result<TimerOp, String> {
    let obj = op.as_object().ok_or_else(|| format!("{at}: must be an object"))?;
    if let Some(owned) = obj.keys().find(|k| SERVER_OWNED.contains(&k.as_str()) || k.starts_with('_')) {
        return Err(format!("{at}.{owned}: server-owned; it cannot be supplied"));
    }
    let text = |f: &str| -> Result<Option<String>, String> {
        match obj.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(_) => Err(format!("{at}.{f}: must be a non-empty string")),
        }
    };
    let queue = text("queue")?.ok_or_else(|| format!("{at}.queue: required"))?;
    crate::push::validate::check_name(&queue).map_err(|e| format!("{at}.queue: {e}"))?;
    let key = text("timerKey")?.ok_or_else(|| format!("{at}.timerKey: required"))?;
    if key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(format!("{at}.timerKey: at most {MAX_KEY_BYTES} bytes, without control characters"));
    }
    let txn = text("txn")?;
    if txn.as_ref().is_some_and(|t| t.len() > crate::push::validate::MAX_TRANSACTION_ID_BYTES) {
        return Err(format!("{at}.txn: longer than {} bytes", crate::push::validate::MAX_TRANSACTION_ID_BYTES));
    }
    match obj.get("op").and_then(Value::as_str) {
        Some("schedule") | Some("reschedule") => {
            let partition = text("partition")?.unwrap_or_else(|| crate::push::validate::DEFAULT_PARTITION.to_string());
            crate::push::validate::check_name(&partition).map_err(|e| format!("{at}.partition: {e}"))?;
            let delay_ms = obj
                .get("delayMs")
                .and_then(|d| d.as_i64().or_else(|| d.as_f64().filter(|f| f.is_finite()).map(|f| f.floor() as i64)))
                .filter(|d| d.abs() <= MAX_DELAY_MS)
                .ok_or_else(|| format!("{at}.delayMs: required, a whole number of milliseconds (at most ten years)"))?;
            let encoded = text("payload")?.ok_or_else(|| format!("{at}.payload: required, base64 of the message's JSON"))?;
            let mut bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .map_err(|e| format!("{at}.payload: not base64 ({e})"))?;
            match obj.get("payloadZstd") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                Some(Value::Bool(true)) => {
                    bytes = crate::log::decompress_frames(&bytes, MAX_PAYLOAD_BYTES).map_err(|e| format!("{at}.payload: not a zstd frame within {MAX_PAYLOAD_BYTES} bytes ({e})"))?;
                }
                Some(_) => return Err(format!("{at}.payloadZstd: must be a boolean")),
            }
            if bytes.len() > MAX_PAYLOAD_BYTES {
                return Err(format!("{at}.payload: more than {MAX_PAYLOAD_BYTES} bytes"));
            }
            let payload = String::from_utf8(bytes).map_err(|_| format!("{at}.payload: the decoded bytes are not UTF-8 JSON"))?;
            serde_json::from_str::<serde::de::IgnoredAny>(&payload).map_err(|e| format!("{at}.payload: the decoded bytes are not JSON ({e})"))?;
            if crate::push::validate::holds_nul(&payload) {
                return Err(format!("{at}.payload: {}", crate::push::validate::NUL_REFUSED));
            }
            let txn = txn.unwrap_or_else(|| Uuid::now_v7().to_string());
            Ok(TimerOp::Schedule { queue, key, partition, payload, txn, delay_ms })
        }
        Some("cancel") => Ok(TimerOp::Cancel { queue, key, txn }),
        Some(other) => Err(format!("{at}.op: unknown operation {other:?} (schedule, reschedule, cancel)")),
        None => Err(format!("{at}.op: required, a string")),
    }
}

/// Applies `ops` in order on `client` (a connection, or a bundle's
/// transaction); one result per operation. `producer` is the caller's JWT
/// subject, stamped on the message the timer becomes.
pub async fn run<C: GenericClient>(
    client: &C,
    ops: &[TimerOp],
    producer: Option<&str>,
    encryption: &crate::crypto::Encryption,
) -> Result<Vec<Value>, TimerError> {
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        let (queue, key, row) = match op {
            TimerOp::Schedule { queue, key, partition, payload, txn, delay_ms } => {
                let message_id = Uuid::now_v7();
                let sealed = encryption.sealing(queue)?.map(|ring| ring.seal(payload.as_bytes(), message_id.as_bytes()));
                let row = client
                    .query_one(
                        "SELECT ok, status, txn, message_id, deliver_at FROM queen.timer_schedule_v2($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                        &[queue, key, partition, payload, &sealed, txn, &message_id, &producer, delay_ms],
                    )
                    .await?;
                (queue, key, row)
            }
            TimerOp::Cancel { queue, key, txn } => {
                let row = client.query_one("SELECT ok, status, txn, message_id, deliver_at FROM queen.timer_cancel_v1($1, $2, $3)", &[queue, key, txn]).await?;
                (queue, key, row)
            }
        };
        results.push(verdict_json(queue, key, &row));
    }
    Ok(results)
}

fn verdict_json(queue: &str, key: &str, r: &tokio_postgres::Row) -> Value {
    json!({"ok": r.get::<_, Option<bool>>(0).unwrap_or(false), "status": r.get::<_, Option<String>>(1), "queue": crate::tenancy::shown(queue), "timerKey": key,
           "txn": r.get::<_, Option<String>>(2), "messageId": r.get::<_, Option<Uuid>>(3),
           "deliverAt": r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(4).map(iso_ms)})
}

/// `GET /api/v1/timers/{queue}/{key…}`: the pending timer, or `{found: false}`.
pub async fn peek(pool: &deadpool_postgres::Pool, ring: Option<&crate::crypto::KeyRing>, queue: &str, key: &str) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let row = client
        .query_opt(
            "SELECT partition, payload, txn, message_id, COALESCE(sealed_due_at, deliver_at), attempts, created_at, updated_at, last_error, sealed
             FROM queen.timers WHERE queue = $1 AND timer_key = $2",
            &[&queue, &key],
        )
        .await?;
    Ok(match row {
        None => json!({"found": false, "queue": crate::tenancy::shown(queue), "timerKey": key}),
        Some(r) => {
            let message_id: Uuid = r.get(3);
            let sealed: Option<Vec<u8>> = r.get(9);
            // A sealed payload is shown opened, or null beside why it did not open.
            let (payload, decrypt_error) = match &sealed {
                None => (serde_json::from_str::<Value>(r.get(1)).unwrap_or(Value::Null), None),
                Some(env) => match open_sealed(ring, env, &message_id) {
                    Ok(text) => (serde_json::from_str::<Value>(&text).unwrap_or(Value::Null), None),
                    Err(e) => (Value::Null, Some(format!("decrypt failed: {e}"))),
                },
            };
            let mut v = json!({"found": true, "queue": crate::tenancy::shown(queue), "timerKey": key, "partition": r.get::<_, String>(0),
                               "payload": payload, "encrypted": sealed.is_some(),
                               "txn": r.get::<_, String>(2), "messageId": message_id, "deliverAt": iso_ms(r.get(4)),
                               "attempts": r.get::<_, i32>(5), "createdAt": iso_ms(r.get(6)), "updatedAt": iso_ms(r.get(7)),
                               "lastError": r.get::<_, Option<String>>(8)});
            if let Some(e) = decrypt_error {
                v["decryptError"] = json!(e);
            }
            v
        }
    })
}

/// `GET /api/v1/timers/{queue}`: pending timers by key after `after`, a page
/// at a time (no payloads).
pub async fn list(pool: &deadpool_postgres::Pool, queue: &str, after: Option<&str>, limit: i64) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT timer_key, partition, txn, message_id, COALESCE(sealed_due_at, deliver_at), attempts FROM queen.timers
             WHERE queue = $1 AND ($2::text IS NULL OR timer_key > $2) ORDER BY timer_key LIMIT $3",
            &[&queue, &after, &(limit + 1)],
        )
        .await?;
    let truncated = rows.len() as i64 > limit;
    let out: Vec<Value> = rows
        .iter()
        .take(limit as usize)
        .map(|r| {
            json!({"timerKey": r.get::<_, String>(0), "partition": r.get::<_, String>(1), "txn": r.get::<_, String>(2),
                   "messageId": r.get::<_, Uuid>(3), "deliverAt": iso_ms(r.get(4)), "attempts": r.get::<_, i32>(5)})
        })
        .collect();
    let next = if truncated { out.last().map(|r| r["timerKey"].clone()).unwrap_or(Value::Null) } else { Value::Null };
    Ok(json!({"queue": crate::tenancy::shown(queue), "rows": out, "truncated": truncated, "nextAfter": next}))
}

/// `GET /api/v1/timers/{queue}?mode=count&prefix=`: pending timers whose
/// key starts with `prefix`.
pub async fn count(pool: &deadpool_postgres::Pool, queue: &str, prefix: &str) -> Result<Value, DbError> {
    let n: i64 = pool
        .get()
        .await?
        .query_one("SELECT count(*) FROM queen.timers WHERE queue = $1 AND starts_with(timer_key, $2)", &[&queue, &prefix])
        .await?
        .get(0);
    Ok(json!({"queue": crate::tenancy::shown(queue), "prefix": prefix, "count": n}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn the_clients_operations_parse() {
        let ops = parse(&json!([{"op": "schedule", "queue": "orders", "timerKey": "o:1:expire", "payload": b64("{\"id\":1}"),
                                 "delayMs": 1500, "txn": "t1"},
                                {"op": "cancel", "queue": "orders", "timerKey": "o:2"}]), "operations")
        .unwrap();
        assert_eq!(ops[0], TimerOp::Schedule { queue: "orders".into(), key: "o:1:expire".into(), partition: "Default".into(),
                                               payload: "{\"id\":1}".into(), txn: "t1".into(), delay_ms: 1500 });
        assert_eq!(ops[1], TimerOp::Cancel { queue: "orders".into(), key: "o:2".into(), txn: None });
        let packed = base64::engine::general_purpose::STANDARD.encode(zstd::bulk::compress(b"[1,2]", 3).unwrap());
        let z = parse(&json!([{"op": "reschedule", "queue": "q", "timerKey": "k", "payload": packed, "payloadZstd": true, "delayMs": -5}]), "ops").unwrap();
        assert!(matches!(&z[0], TimerOp::Schedule { payload, delay_ms: -5, .. } if payload == "[1,2]"));
    }

    #[test]
    fn bad_operations_name_the_field() {
        for (op, want) in [
            (json!({"op": "schedule", "queue": "q", "timerKey": "k", "payload": b64("1"), "delayMs": 1, "deliverAt": "x"}), "operations[0].deliverAt: server-owned"),
            (json!({"op": "schedule", "queue": "q", "timerKey": "k", "payload": b64("1"), "delayMs": 1, "_x": 1}), "operations[0]._x"),
            (json!({"op": "schedule", "queue": "q", "timerKey": "k", "payload": "***", "delayMs": 1}), "operations[0].payload: not base64"),
            (json!({"op": "schedule", "queue": "q", "timerKey": "k", "payload": b64("not json"), "delayMs": 1}), "operations[0].payload: the decoded bytes are not JSON"),
            (json!({"op": "schedule", "queue": "q", "timerKey": "k", "payload": b64("1")}), "operations[0].delayMs"),
            (json!({"op": "schedule", "timerKey": "k", "payload": b64("1"), "delayMs": 1}), "operations[0].queue"),
            (json!({"op": "schedule", "queue": "q", "payload": b64("1"), "delayMs": 1}), "operations[0].timerKey"),
            (json!({"op": "fire", "queue": "q", "timerKey": "k"}), "operations[0].op: unknown"),
        ] {
            let e = parse(&json!([op.clone()]), "operations").unwrap_err();
            assert!(e.starts_with(want), "{op}: {e}");
        }
    }
}
