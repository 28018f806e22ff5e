//! The streams runtime's server half (issue 30, API.md §2.10): the clients'
//! stream processors run their operators themselves; the broker registers
//! queries, serves their state and commits each processing cycle.
//!
//! A cycle is the processor's unit of exactly-once: in one PostgreSQL
//! transaction it acks the source batch (fenced by the batch's lease, the
//! rule of every transaction), pushes the sink's items through the
//! transaction push path (`ack::transaction::push_in`), and applies the
//! state ops. A refused ack (the lease expired or was taken over), a
//! duplicate push or a database failure commits nothing, and the answer
//! says so (`success: false`), so a processor whose lease was lost can
//! never commit a second copy of a window.

pub mod parse;

use deadpool_postgres::Pool;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::ack::transaction::{push_in, TxnError};
use crate::ack::{AckItem, AckService, AckStatus, Fence, Released};
use crate::db::DbError;
use crate::kv::stmt;
use crate::push::validate::PushItem;

/// A registration's answer, or the stored hash it conflicts with.
pub enum Registered {
    Ok { id: Uuid, fresh: bool, reset: bool },
    Conflict { stored_hash: String },
}

/// `POST /streams/v1/queries`.
///
/// A registration that resets discards the query's state and its default
/// group's cursors on the source in the same transaction: a crash between
/// them cannot leave fresh state over old cursors. `name`, `source` and
/// `sink` are `tenant`'s stored names (`tenancy`).
#[allow(clippy::too_many_arguments)]
pub async fn register(
    pool: &Pool,
    tenant: crate::tenancy::Tenant,
    name: &str,
    source: &str,
    sink: Option<&str>,
    hash: &str,
    reset: bool,
) -> Result<Registered, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let r = tx
        .query_one("SELECT * FROM queen.stream_register_v1($1, $2, $3, $4, $5, $6)", &[&name, &source, &sink, &hash, &reset, &Uuid::now_v7()])
        .await?;
    let registered = match r.get::<_, Option<String>>(3) {
        Some(stored_hash) => Registered::Conflict { stored_hash },
        None => Registered::Ok { id: r.get(0), fresh: r.get(1), reset: r.get(2) },
    };
    if let Registered::Ok { reset: true, .. } = registered {
        crate::admin::groups::delete_in(&tx, tenant, &default_group(name), Some(source), true).await?;
    }
    tx.commit().await?;
    Ok(registered)
}

/// The consumer group a stream reads with unless told otherwise (of the
/// query's name as its tenant knows it: the client derives the same).
pub fn default_group(name: &str) -> String {
    format!("streams.{}", crate::tenancy::shown(name))
}

/// Whether query `id` is `tenant`'s (an unknown one is no one's).
pub async fn owned(pool: &Pool, tenant: crate::tenancy::Tenant, id: Uuid) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let row = client.query_opt("SELECT name FROM queen.stream_queries WHERE id = $1", &[&id]).await?;
    Ok(row.is_some_and(|r| tenant.owns(r.get::<_, &str>(0))))
}

/// The answer to a cycle on a query that is not registered (or is another
/// tenant's, which answers alike).
pub fn not_registered(query: Uuid) -> Value {
    json!({"success": false, "error": format!("query_id {query} is not registered")})
}

/// Most rows one `state/get` answers.
pub const STATE_GET_MAX_ROWS: i64 = 10_000;
/// Most bytes of keys and values one `state/get` answers.
pub const STATE_GET_MAX_BYTES: usize = 16 << 20;

/// `POST /streams/v1/state/get`: rows of (query, partition), all or the
/// named keys, with a key prefix, and only window rows due at or before a
/// time (epoch ms).
///
/// Bounded: more than [`STATE_GET_MAX_ROWS`] rows or
/// [`STATE_GET_MAX_BYTES`] bytes is `Ok(Err(reason))`, a 413, never a
/// truncated answer (the clients read the rows as the whole state, so a
/// silent cut would lose state).
pub async fn state(pool: &Pool, q: &parse::StateGet) -> Result<Result<Value, String>, DbError> {
    let client = pool.get().await?;
    let read = stmt(
        &client,
        "SELECT key, value::text, updated_at FROM queen.stream_state
         WHERE query_id = $1 AND partition_id = $2
           AND (cardinality($3::text[]) = 0 OR key = ANY($3))
           AND ($4::text IS NULL OR starts_with(key, $4))
           AND ($5::bigint IS NULL OR ripe_at <= $5)
         ORDER BY key
         LIMIT $6",
    )
    .await?;
    let rows = client.query(&read, &[&q.query, &q.partition_id, &q.keys, &q.prefix, &q.ripe_at_or_before, &(STATE_GET_MAX_ROWS + 1)]).await?;
    if rows.len() as i64 > STATE_GET_MAX_ROWS {
        return Ok(Err(format!("more than {STATE_GET_MAX_ROWS} state rows match; name the keys, or narrow key_prefix or ripe_at_or_before")));
    }
    let mut bytes = 0usize;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let (key, value): (String, &str) = (r.get(0), r.get(1));
        bytes += key.len() + value.len();
        if bytes > STATE_GET_MAX_BYTES {
            return Ok(Err(format!("the matching state rows hold more than {STATE_GET_MAX_BYTES} bytes; name fewer keys, or narrow key_prefix or ripe_at_or_before")));
        }
        // A stored value is JSON the broker wrote; one that does not parse is a bad row, said so.
        let value = serde_json::from_str::<Value>(value).map_err(|e| DbError::Unexpected(format!("stream state row {key:?}: {e}")))?;
        out.push(json!({"key": key, "value": value, "updated_at": crate::json::iso_ms(r.get(2))}));
    }
    Ok(Ok(json!({"success": true, "rows": out})))
}

/// One state op of a cycle.
#[derive(Debug, Clone, PartialEq)]
pub enum StateOp {
    Upsert { key: String, value: String, ripe_at: Option<i64> },
    Delete { key: String },
}

impl StateOp {
    fn key(&self) -> &str {
        match self {
            StateOp::Upsert { key, .. } | StateOp::Delete { key } => key,
        }
    }
}

/// The ack of a cycle: the batch's last message, under the batch's lease.
#[derive(Debug, Clone, PartialEq)]
pub struct CycleAck {
    pub transaction_id: String,
    pub lease_id: Option<String>,
    pub status: Option<String>,
}

/// A validated cycle.
pub struct Cycle<'a> {
    pub query: Uuid,
    pub partition_id: i64,
    /// The partition is another tenant's (`tenancy`): the ack is sent on
    /// no partition, and answers as one of an unknown partition does.
    pub foreign: bool,
    pub group: String,
    pub state_ops: Vec<StateOp>,
    pub push_items: Vec<PushItem<'a>>,
    pub ack: Option<CycleAck>,
    pub release_lease: bool,
}

/// What a cycle did.
pub struct CycleDone {
    pub answer: Value,
    pub pushed: Vec<(String, i64, String, u64)>,
    pub released: Vec<Released>,
}

/// Runs a cycle in one transaction; `Ok` carries the answer, committed
/// (`success: true`) or rolled back (`success: false`).
pub async fn cycle(pool: &Pool, acks: &AckService, coalescer: &crate::push::Coalescer, c: &Cycle<'_>) -> Result<CycleDone, TxnError> {
    let refused = |error: String| CycleDone { answer: json!({"success": false, "error": error}), pushed: vec![], released: vec![] };
    let unknown = || CycleDone { answer: not_registered(c.query), pushed: vec![], released: vec![] };
    let mut client = pool.get().await.map_err(DbError::from)?;
    let tx = client.transaction().await?;
    // The state ops and the query check are one statement, sent on the
    // connection together with the ack's (pipelined: one round trip for
    // both). Were the ack refused or the query unknown, the rollback
    // below undoes the state ops with the rest.
    let state = apply_state(&tx, c);
    let ack = async {
        match &c.ack {
            Some(a) => {
                let item = AckItem {
                    transaction_id: a.transaction_id.clone(),
                    partition_id: if c.foreign { crate::tenancy::NO_PARTITION.to_string() } else { c.partition_id.to_string() },
                    status: AckStatus::normalize(a.status.as_deref()),
                    error: None,
                    lease_id: a.lease_id.clone(),
                    group: c.group.clone(),
                };
                acks.ack_on(&tx, std::slice::from_ref(&item), Fence::Always).await.map(Some)
            }
            None => Ok(None),
        }
    };
    let (known, acked) = tokio::join!(state, ack);
    if !known? {
        tx.rollback().await?;
        return Ok(unknown());
    }
    // 1. The ack, fenced by its lease: a lost lease refuses the whole cycle.
    let mut released = Vec::new();
    let mut ack_result = Value::Null;
    if let (Some(a), Some((outcomes, rel))) = (&c.ack, acked?) {
        let o = &outcomes[0];
        if !o.success {
            tx.rollback().await?;
            return Ok(refused(format!(
                "cycle refused: the ack of {:?} on partition {} was refused ({}); nothing was applied",
                a.transaction_id,
                c.partition_id,
                o.error.as_deref().unwrap_or("refused")
            )));
        }
        released.extend(rel);
        let mut lease_released = o.lease_released;
        // A lease the ack did not release (a partial batch) is given back on request.
        if c.release_lease && !lease_released {
            if let Some(lease) = &a.lease_id {
                lease_released = tx
                    .execute(
                        "UPDATE queen.consumers SET worker_id = NULL, lease_expires_at = NULL, batch_end = NULL
                         WHERE partition_id = $1 AND consumer_group = $2 AND worker_id = $3",
                        &[&c.partition_id, &c.group, lease],
                    )
                    .await?
                    > 0;
            }
        }
        ack_result = json!({"success": true, "transactionId": a.transaction_id, "leaseReleased": lease_released});
    }
    // 2. The sink's pushes.
    let mut pushed = Vec::new();
    let mut push_results = Vec::new();
    if !c.push_items.is_empty() {
        match push_in(&tx, coalescer, &c.push_items, None).await? {
            Ok(w) => {
                pushed = w.pushed;
                push_results = w.results;
            }
            Err(duplicate) => {
                tx.rollback().await?;
                return Ok(refused(format!("cycle refused: {duplicate}; nothing was applied")));
            }
        }
    }
    tx.commit().await?;
    Ok(CycleDone {
        answer: json!({"success": true, "query_id": c.query, "partition_id": c.partition_id.to_string(),
                       "state_ops_applied": c.state_ops.len(), "push_results": push_results, "ack_result": ack_result}),
        pushed,
        released,
    })
}

/// A cycle's state ops in one statement that also checks the query is
/// registered (false: it is not, and nothing was written). The last op on a
/// key decides it, as the ops are ordered, so deleted and upserted keys are
/// disjoint.
async fn apply_state(tx: &deadpool_postgres::Transaction<'_>, c: &Cycle<'_>) -> Result<bool, DbError> {
    let mut last: Vec<&StateOp> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for op in &c.state_ops {
        match seen.get(op.key()) {
            Some(&i) => last[i] = op,
            None => {
                seen.insert(op.key(), last.len());
                last.push(op);
            }
        }
    }
    let (mut up_keys, mut up_values, mut up_ripe, mut del_keys) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for op in last {
        match op {
            StateOp::Upsert { key, value, ripe_at } => {
                up_keys.push(key.as_str());
                up_values.push(value.as_str());
                up_ripe.push(*ripe_at);
            }
            StateOp::Delete { key } => del_keys.push(key.as_str()),
        }
    }
    let apply = stmt(
        tx,
        "WITH q AS (SELECT id FROM queen.stream_queries WHERE id = $1),
         del AS (DELETE FROM queen.stream_state s USING q
                 WHERE s.query_id = q.id AND s.partition_id = $2 AND s.key = ANY($3::text[])),
         up AS (INSERT INTO queen.stream_state (query_id, partition_id, key, value, ripe_at)
                SELECT q.id, $2, k, v::jsonb, r FROM q, unnest($4::text[], $5::text[], $6::bigint[]) AS t (k, v, r)
                ON CONFLICT (query_id, partition_id, key) DO UPDATE
                    SET value = EXCLUDED.value, ripe_at = EXCLUDED.ripe_at, updated_at = now())
         SELECT count(*) FROM q",
    )
    .await?;
    let row = tx.query_one(&apply, &[&c.query, &c.partition_id, &del_keys, &up_keys, &up_values, &up_ripe]).await?;
    Ok(row.get::<_, i64>(0) > 0)
}
