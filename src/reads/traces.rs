//! Traces (API.md §2.10): events a consumer attaches to a message while it
//! processes it, and the three reads an operator follows them by.
//!
//! A trace is written after its message, by whoever holds it, so it cannot
//! live in the message's segment (immutable, shared by many messages). It
//! goes to `queen.traces` with one `queen.trace_names` row per name
//! (migrations/0008_traces.sql), and leaves with its message: retention,
//! partition cleanup and queue deletion take it, and the trace sweeper
//! (`maintenance::traces`) takes what is older than `TRACES_RETENTION_DAYS`.
//!
//! Writes are batched. A consume loop that traces every message sends one
//! small POST per message; one INSERT per POST would cost each its own
//! round trip and commit. The [`TraceWriter`] queues requests and writes
//! whatever has gathered while the previous batch was in flight in one
//! statement (no timer: a lone trace is written at once), at most
//! [`WRITERS`] batches at a time, and answers each request after its batch
//! commits, so `success: true` means stored.

use std::sync::Arc;
use crate::tenancy::Tenant;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::json::iso_ms;
use crate::db::share::{Share, Shared};
use crate::db::DbError;
use crate::pop::params::QUEUE_MODE;
use crate::push::validate::{MAX_TRANSACTION_ID_BYTES, NUL_REFUSED};

/// Longest trace name and event type, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Most names one trace may carry.
pub const MAX_NAMES: usize = 32;
/// Longest consumer group name, in bytes.
const MAX_GROUP_BYTES: usize = 255;
/// Most traces one batch writes.
pub const MAX_BATCH: usize = 1000;
/// Batches in flight at once: one being written while the next gathers is
/// what makes batches form; more would only split them.
pub const WRITERS: usize = 2;

/// One trace, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEvent {
    pub trace_id: Uuid,
    pub partition_id: i64,
    pub transaction_id: String,
    pub consumer_group: String,
    pub event_type: String,
    pub names: Vec<String>,
    pub data: Value,
}

/// The first of the spellings a client may send for a field (camelCase
/// first: it wins when both are present).
fn get<'a>(body: &'a Value, names: &[&str]) -> Option<&'a Value> {
    names.iter().find_map(|n| body.get(*n).filter(|v| !v.is_null()))
}

/// A string field of at most `max` bytes; `None` when absent.
fn text(body: &Value, names: &[&str], max: usize) -> Result<Option<String>, String> {
    match get(body, names) {
        None => Ok(None),
        Some(Value::String(s)) if s.len() > max => Err(format!("{}: longer than {max} bytes", names[0])),
        Some(Value::String(s)) if s.contains('\0') => Err(format!("{}: {NUL_REFUSED}", names[0])),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{}: must be a string", names[0])),
    }
}

/// Reads `POST /api/v1/traces`; the error names the field and the problem.
pub fn parse(body: &Value) -> Result<TraceEvent, String> {
    if !body.is_object() {
        return Err("body: must be a JSON object".into());
    }
    let transaction_id = text(body, &["transactionId", "transaction_id"], MAX_TRANSACTION_ID_BYTES)?
        .filter(|t| !t.is_empty())
        .ok_or("transactionId: required, a non-empty string")?;
    // Partition ids are 64-bit integers rendered as decimal strings; a
    // number is accepted too.
    let partition_id = match get(body, &["partitionId", "partition_id"]) {
        None => return Err("partitionId: required".into()),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
        Some(Value::Number(n)) => n.as_i64(),
        Some(_) => None,
    }
    .filter(|id| *id > 0)
    .ok_or("partitionId: must be a partition id (a positive integer, as the pop answered it)")?;
    let consumer_group = text(body, &["consumerGroup", "consumer_group"], MAX_GROUP_BYTES)?
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| QUEUE_MODE.to_string());
    let event_type = text(body, &["eventType", "event_type"], MAX_NAME_BYTES)?.filter(|e| !e.is_empty()).unwrap_or_else(|| "info".into());
    // `traceNames` is what the clients send; older ones send `traceName`,
    // a string or an array.
    let names = match get(body, &["traceNames", "trace_names", "traceName", "trace_name"]) {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, n)| n.as_str().map(str::to_string).ok_or_else(|| format!("traceNames[{i}]: must be a string")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("traceNames: must be an array of strings or null".into()),
    };
    // De-duplicated in order, in one pass (a set, not a scan per name), and
    // refused as soon as the distinct names pass the cap.
    let mut seen = std::collections::HashSet::with_capacity(names.len().min(MAX_NAMES + 1));
    let mut kept: Vec<String> = Vec::with_capacity(names.len().min(MAX_NAMES + 1));
    for n in names {
        if !n.is_empty() && seen.insert(n.clone()) {
            if kept.len() == MAX_NAMES {
                return Err(format!("traceNames: at most {MAX_NAMES} distinct names"));
            }
            kept.push(n);
        }
    }
    let names = kept;
    if let Some(i) = names.iter().position(|n| n.contains('\0')) {
        return Err(format!("traceNames[{i}]: {NUL_REFUSED}"));
    }
    if let Some(long) = names.iter().position(|n| n.len() > MAX_NAME_BYTES) {
        return Err(format!("traceNames[{long}]: longer than {MAX_NAME_BYTES} bytes"));
    }
    let data = body.get("data").cloned().ok_or("data: required (any JSON value)")?;
    if crate::push::validate::holds_nul(&data.to_string()) {
        return Err(format!("data: {NUL_REFUSED}"));
    }
    Ok(TraceEvent { trace_id: Uuid::now_v7(), partition_id, transaction_id, consumer_group, event_type, names, data })
}

/// Why a trace was not stored.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TraceError {
    /// No partition has that id (it never existed, or it is gone).
    #[error("partition {0} not found")]
    UnknownPartition(i64),
    /// No pooled connection in time.
    #[error("no database connection")]
    Pool,
    #[error("trace write failed: {0}")]
    Db(String),
}

impl From<DbError> for TraceError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Pool(_) => TraceError::Pool,
            other => TraceError::Db(other.to_string()),
        }
    }
}

struct Pending {
    event: TraceEvent,
    reply: oneshot::Sender<Result<(), TraceError>>,
}

impl Shared for Pending {
    fn weight(&self) -> usize {
        1
    }
}

/// The batching trace writer (its queue is `db::share`'s, as for acks and
/// KV writes); cheap to clone.
#[derive(Clone)]
pub struct TraceWriter {
    pool: Pool,
    share: Arc<Share<Pending>>,
}

impl TraceWriter {
    pub fn new(pool: Pool) -> TraceWriter {
        TraceWriter { pool, share: Arc::new(Share::new(WRITERS, MAX_BATCH)) }
    }

    /// Stores one trace; answers once its batch has committed.
    pub async fn write(&self, event: TraceEvent) -> Result<(), TraceError> {
        let (reply, answer) = oneshot::channel();
        let pool = self.pool.clone();
        self.share.submit(Pending { event, reply }, move |batch| {
            let pool = pool.clone();
            async move { write_and_answer(&pool, batch).await }
        });
        answer.await.map_err(|_| TraceError::Db("trace writer stopped".into()))?
    }
}

/// Writes a batch and answers each of its traces.
async fn write_and_answer(pool: &Pool, batch: Vec<Pending>) {
    let stored = write_batch(pool, &batch).await;
    for p in batch {
        let r = match &stored {
            Ok(ids) if ids.contains(&p.event.trace_id) => Ok(()),
            Ok(_) => Err(TraceError::UnknownPartition(p.event.partition_id)),
            Err(e) => Err(e.clone()),
        };
        let _ = p.reply.send(r);
    }
}

/// One statement for the whole batch; the ids of the traces stored (those
/// whose partition exists).
async fn write_batch(pool: &Pool, batch: &[Pending]) -> Result<std::collections::HashSet<Uuid>, TraceError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let col = |f: fn(&TraceEvent) -> &str| batch.iter().map(|p| f(&p.event)).collect::<Vec<&str>>();
    let ids: Vec<Uuid> = batch.iter().map(|p| p.event.trace_id).collect();
    let partitions: Vec<i64> = batch.iter().map(|p| p.event.partition_id).collect();
    // jsonb travels as text: tokio-postgres is built without serde_json.
    let names: Vec<String> = batch.iter().map(|p| json!(p.event.names).to_string()).collect();
    let data: Vec<String> = batch.iter().map(|p| p.event.data.to_string()).collect();
    let (txns, groups, events) = (col(|e| &e.transaction_id), col(|e| &e.consumer_group), col(|e| &e.event_type));
    // One statement, its own transaction; it commits without waiting for
    // the disk (docs/DECISIONS.md, "Traces commit without waiting for the
    // disk").
    let write = client
        .prepare_cached("SELECT o_trace_id FROM queen.trace_write_v1($1, $2, $3, $4, $5, $6::text[]::jsonb[], $7::text[]::jsonb[])")
        .await
        .map_err(DbError::from)?;
    let rows = client.query(&write, &[&ids, &partitions, &txns, &groups, &events, &names, &data]).await.map_err(DbError::from)?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Paging and time bounds of the reads.
#[derive(Debug, Clone)]
pub struct Page {
    pub limit: i64,
    pub offset: i64,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
}

/// The columns every read returns, in [`trace_json`]'s order.
const TRACE_COLUMNS: &str = "t.id, t.trace_id, t.partition_id, t.transaction_id, t.consumer_group, t.event_type, t.names,
     t.data::text, t.created_at, p.name, q.name";

fn trace_json(r: &tokio_postgres::Row) -> Value {
    json!({
        "id": r.get::<_, i64>(0).to_string(),
        "traceId": r.get::<_, Uuid>(1),
        "partitionId": r.get::<_, i64>(2).to_string(),
        "transactionId": r.get::<_, String>(3),
        "consumerGroup": r.get::<_, String>(4),
        "eventType": r.get::<_, String>(5),
        "traceNames": r.get::<_, Vec<&str>>(6).into_iter().map(crate::tenancy::shown).collect::<Vec<_>>(),
        "data": r.get::<_, Option<&str>>(7).and_then(|d| serde_json::from_str::<Value>(d).ok()),
        "createdAt": iso_ms(r.get(8)),
        "partition": r.get::<_, Option<String>>(9),
        "queue": r.get::<_, Option<&str>>(10).map(crate::tenancy::shown),
    })
}

/// `GET /api/v1/traces/{partitionId}/{transactionId}`: the message's
/// traces, oldest first; `None` when the partition does not exist in
/// `tenant`'s queues.
pub async fn for_message(pool: &Pool, tenant: Tenant, partition_id: i64, transaction_id: &str) -> Result<Option<Value>, DbError> {
    let client = pool.get().await?;
    let Some(part) = client
        .query_opt(
            "SELECT p.name, q.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE p.id = $1 AND q.tenant_id = $2",
            &[&partition_id, &tenant.0],
        )
        .await?
    else {
        return Ok(None);
    };
    let rows = client
        .query(
            &format!(
                "SELECT {TRACE_COLUMNS} FROM queen.traces t
                 LEFT JOIN queen.partitions p ON p.id = t.partition_id LEFT JOIN queen.queues q ON q.id = p.queue_id
                 WHERE t.partition_id = $1 AND t.transaction_id = $2 ORDER BY t.id"
            ),
            &[&partition_id, &transaction_id],
        )
        .await?;
    let traces: Vec<Value> = rows.iter().map(trace_json).collect();
    Ok(Some(json!({
        "partitionId": partition_id.to_string(), "transactionId": transaction_id,
        "queue": crate::tenancy::shown(part.get::<_, &str>(1)), "partition": part.get::<_, String>(0),
        "count": traces.len(), "traces": traces,
    })))
}

/// `GET /api/v1/traces/by-name/{name}`: the traces carrying a name, newest
/// first, with the total in the time bounds. `name` is a stored name
/// (`tenancy`).
pub async fn by_name(pool: &Pool, name: &str, page: &Page) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let bounds = "n.name = $1 AND ($2::timestamptz IS NULL OR n.created_at >= $2) AND ($3::timestamptz IS NULL OR n.created_at <= $3)";
    let total: i64 = client
        .query_one(&format!("SELECT count(*) FROM queen.trace_names n WHERE {bounds}"), &[&name, &page.from, &page.to])
        .await?
        .get(0);
    let rows = client
        .query(
            &format!(
                "SELECT {TRACE_COLUMNS} FROM queen.trace_names n JOIN queen.traces t ON t.id = n.trace
                 LEFT JOIN queen.partitions p ON p.id = t.partition_id LEFT JOIN queen.queues q ON q.id = p.queue_id
                 WHERE {bounds} ORDER BY n.created_at DESC, n.trace DESC LIMIT $4 OFFSET $5"
            ),
            &[&name, &page.from, &page.to, &page.limit, &page.offset],
        )
        .await?;
    Ok(json!({
        "traceName": crate::tenancy::shown(name), "traces": rows.iter().map(trace_json).collect::<Vec<_>>(),
        "total": total, "limit": page.limit, "offset": page.offset,
    }))
}

/// `GET /api/v1/traces/names`: every name with its trace and message
/// counts, most recently used first; `search` keeps names containing it.
/// With tenancy on (`tenant` given), the tenant's names only.
pub async fn names(pool: &Pool, tenant: Option<Tenant>, search: Option<&str>, page: &Page) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let pattern = search.map(|s| format!("%{}%", s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")));
    let (owns, shown) = match tenant {
        None => ("true".to_string(), "n.name".to_string()),
        Some(t) => (t.owns_sql("n.name"), t.shown_sql("n.name")),
    };
    let filter = format!(
        "({owns}) AND ($1::text IS NULL OR {shown} ILIKE $1) AND ($2::timestamptz IS NULL OR n.created_at >= $2)
         AND ($3::timestamptz IS NULL OR n.created_at <= $3)"
    );
    let total: i64 = client
        .query_one(&format!("SELECT count(DISTINCT n.name) FROM queen.trace_names n WHERE {filter}"), &[&pattern, &page.from, &page.to])
        .await?
        .get(0);
    let rows = client
        .query(
            &format!(
                "SELECT n.name, count(*)::bigint, count(DISTINCT (t.partition_id, t.transaction_id))::bigint,
                        min(n.created_at), max(n.created_at)
                 FROM queen.trace_names n JOIN queen.traces t ON t.id = n.trace
                 WHERE {filter} GROUP BY n.name ORDER BY max(n.created_at) DESC, n.name LIMIT $4 OFFSET $5"
            ),
            &[&pattern, &page.from, &page.to, &page.limit, &page.offset],
        )
        .await?;
    let names: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"name": crate::tenancy::shown(r.get::<_, &str>(0)), "traceCount": r.get::<_, i64>(1), "messageCount": r.get::<_, i64>(2),
                   "firstSeen": iso_ms(r.get(3)), "lastSeen": iso_ms(r.get(4))})
        })
        .collect();
    Ok(json!({"names": names, "total": total, "limit": page.limit, "offset": page.offset}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_body_parses_with_its_defaults() {
        let e = parse(&json!({"transactionId": "t1", "partitionId": "42", "traceNames": null, "data": {"step": 1}})).unwrap();
        assert_eq!((e.partition_id, e.transaction_id.as_str()), (42, "t1"));
        assert_eq!((e.consumer_group.as_str(), e.event_type.as_str()), (QUEUE_MODE, "info"));
        assert!(e.names.is_empty());
        assert_eq!(e.data, json!({"step": 1}));
        let e = parse(&json!({"transaction_id": "t", "partition_id": 7, "consumer_group": "g", "event_type": "error",
                              "traceName": "order-1", "data": null}))
        .unwrap();
        assert_eq!((e.partition_id, e.consumer_group.as_str(), e.event_type.as_str()), (7, "g", "error"));
        assert_eq!(e.names, vec!["order-1"]);
        assert_eq!(e.data, Value::Null);
        let e = parse(&json!({"transactionId": "t", "partitionId": "1", "traceNames": ["a", "", "b", "a"], "data": 1})).unwrap();
        assert_eq!(e.names, vec!["a", "b"], "empty names dropped, repeats folded");
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        for (body, want) in [
            (json!([]), "body"),
            (json!({"partitionId": "1", "data": 1}), "transactionId"),
            (json!({"transactionId": 5, "partitionId": "1", "data": 1}), "transactionId"),
            (json!({"transactionId": "t", "data": 1}), "partitionId"),
            (json!({"transactionId": "t", "partitionId": "abc", "data": 1}), "partitionId"),
            (json!({"transactionId": "t", "partitionId": "-3", "data": 1}), "partitionId"),
            (json!({"transactionId": "t", "partitionId": "1"}), "data"),
            (json!({"transactionId": "t", "partitionId": "1", "data": 1, "traceNames": [1]}), "traceNames[0]"),
            (json!({"transactionId": "t", "partitionId": "1", "data": 1, "traceNames": {"a": 1}}), "traceNames"),
            (json!({"transactionId": "t", "partitionId": "1", "data": 1, "traceNames": [long]}), "traceNames[0]: longer"),
            (json!({"transactionId": "t", "partitionId": "1", "data": 1, "eventType": 3}), "eventType"),
            (json!({"transactionId": "t", "partitionId": "1", "data": 1, "consumerGroup": ["g"]}), "consumerGroup"),
        ] {
            let e = parse(&body).unwrap_err();
            assert!(e.starts_with(want), "{body}: {e}");
        }
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| format!("n{i}")).collect();
        assert!(parse(&json!({"transactionId": "t", "partitionId": "1", "data": 1, "traceNames": many})).unwrap_err().contains("at most"));
    }
}
