//! KV (issue 29 §1, API.md §2.10): namespaced keys holding JSON values,
//! stored in PostgreSQL beside the log (migrations/0010_kv.sql), so every
//! broker on the database sees one truth and a transaction can carry KV
//! operations with its acks and pushes.
//!
//! A call is a list of operations applied in order in one PostgreSQL
//! transaction. Each write's verdict is computed by one statement under
//! the row's lock (`queen.kv_put_v1` and friends), so concurrent writers are
//! ordered: of N concurrent `putIfAbsent`, exactly one applies. A lost
//! verdict is an answer (`applied: false` with a `reason` and the key's
//! current value and version), not an error; with `required: true` it fails
//! the whole call, which then changes nothing.
//!
//! Parsing is separate from running ([`parse`], then [`run`]) so that the
//! transaction route can validate its riders before it opens a transaction.

pub mod ops;
pub mod share;
pub mod supervision;

use deadpool_postgres::Pool;
use serde_json::{json, Map, Value};
use deadpool_postgres::GenericClient;

use crate::json::iso_ms;
use crate::db::DbError;
pub use share::KvWriter;
pub use ops::{parse, refuse_reserved, KvError, KvLimits, Op, LOCKS_NAMESPACE};

/// The answer of a call.
#[derive(Debug)]
pub struct Outcome {
    /// One result per operation, index-aligned.
    pub results: Vec<Value>,
    /// The index of a `required` operation whose verdict was lost: the call
    /// was rolled back.
    pub failed: Option<usize>,
}

/// Runs a parsed call in its own transaction. A call of one operation runs
/// as one autocommit statement: it is atomic by itself, and a lost verdict
/// wrote nothing, so there is nothing to roll back (one round trip instead
/// of three).
pub async fn run_call(pool: &Pool, operations: &[Op], limits: &KvLimits) -> Result<Outcome, DbError> {
    let mut client = pool.get().await?;
    if operations.len() == 1 {
        return run(&client, operations, limits).await;
    }
    let tx = client.transaction().await?;
    let outcome = run(&tx, operations, limits).await?;
    if outcome.failed.is_none() {
        tx.commit().await?;
    }
    Ok(outcome)
}

/// Applies `operations` in order inside the caller's transaction. When a
/// `required` verdict is lost it stops there: the caller must roll back
/// (the results then say which writes were undone).
pub async fn run<C: GenericClient>(client: &C, operations: &[Op], limits: &KvLimits) -> Result<Outcome, DbError> {
    let mut results = Vec::with_capacity(operations.len());
    // The read budget is the call's, shared by its getMany and getPrefix
    // operations (not each one's: 256 of them would have been 1 GiB).
    let mut budget = limits.max_read_bytes;
    for (i, op) in operations.iter().enumerate() {
        let result = apply(client, op, &mut budget).await?;
        let (result, lost) = settle(op, i, result);
        results.push(result);
        if lost {
            return Ok(Outcome { results: rolled_back(results, operations, i), failed: Some(i) });
        }
    }
    Ok(Outcome { results, failed: None })
}

/// An operation's result as its call answers it (its `index`; a lock's
/// token hidden from whoever does not hold it), and whether it lost as a
/// required one, which stops the call.
fn settle(op: &Op, index: usize, mut result: Value) -> (Value, bool) {
    result["index"] = json!(index);
    // A lock guard that does not hold says so, never which token does.
    if op.in_locks() {
        let applied = result.get("applied") == Some(&Value::Bool(true));
        result["version"] = ops::shown_version(op, applied, result["version"].take());
    }
    let lost = op.is_required() && result.get("applied") == Some(&Value::Bool(false));
    (result, lost)
}

/// The outcome of a call of one write from its verdict row (what [`run`]
/// answers for it), for the shared writes that compute many at once.
pub(crate) fn single_write(op: &Op, row: tokio_postgres::Row) -> Outcome {
    let (result, lost) = settle(op, 0, verdict_json(op.key_str(), row));
    if lost {
        return Outcome { results: rolled_back(vec![result], std::slice::from_ref(op), 0), failed: Some(0) };
    }
    Outcome { results: vec![result], failed: None }
}

/// The results of a call stopped at `failed`: writes before it were
/// undone, operations after it never ran. Each keeps its `index`.
fn rolled_back(mut results: Vec<Value>, operations: &[Op], failed: usize) -> Vec<Value> {
    for (i, (r, op)) in results.iter_mut().zip(operations).take(failed).enumerate() {
        if op.is_write() && r.get("applied") == Some(&Value::Bool(true)) {
            *r = json!({"index": i, "applied": false, "reason": "rolled_back", "key": r["key"]});
        }
    }
    for (i, op) in operations.iter().enumerate().skip(failed + 1) {
        results.push(json!({"index": i, "applied": false, "reason": "not_run", "key": op.key()}));
    }
    results
}

/// A stored JSON value, as text from the database.
fn value_of(text: Option<String>) -> Value {
    text.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null)
}

fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> Value {
    t.map(iso_ms).map(Value::String).unwrap_or(Value::Null)
}

/// A row as a read shows it.
fn row_json(r: &tokio_postgres::Row, keys_only: bool) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), json!(r.get::<_, String>(0)));
    if !keys_only {
        m.insert("value".into(), value_of(r.get(1)));
    }
    m.insert("version".into(), json!(r.get::<_, i64>(2)));
    m.insert("expiresAt".into(), time(r.get(3)));
    m.insert("updatedAt".into(), time(r.get(4)));
    Value::Object(m)
}

const LIVE: &str = "(expires_at IS NULL OR expires_at > now())";

/// Each statement is prepared once per connection: an unprepared one costs
/// a round trip of its own on every call.
pub(crate) async fn stmt<C: GenericClient>(client: &C, sql: &str) -> Result<tokio_postgres::Statement, DbError> {
    Ok(client.prepare_cached(sql).await?)
}

/// A write's verdict row (applied, reason, value, version, expires_at,
/// updated_at) as the call's answer shows it.
pub(crate) fn verdict_json(key: &str, r: tokio_postgres::Row) -> Value {
    let mut m = Map::new();
    m.insert("applied".into(), json!(r.get::<_, Option<bool>>(0).unwrap_or(false)));
    if let Some(reason) = r.get::<_, Option<String>>(1) {
        m.insert("reason".into(), json!(reason));
    }
    m.insert("key".into(), json!(key));
    m.insert("value".into(), value_of(r.get(2)));
    // A key that does not exist (after the operation, or when a refused
    // one found it absent) is at version 0, the `expect` that means
    // "must not exist" (issue 44 §4): never null.
    m.insert("version".into(), json!(r.get::<_, Option<i64>>(3).unwrap_or(0)));
    m.insert("expiresAt".into(), time(r.get(4)));
    m.insert("updatedAt".into(), time(r.get(5)));
    Value::Object(m)
}

/// One operation; reads take what they answer from `budget` (a read
/// answers at least one row, so a call always moves forward).
async fn apply<C: GenericClient>(client: &C, op: &Op, budget: &mut usize) -> Result<Value, DbError> {
    Ok(match op {
        Op::Get { ns, key } => {
            let sql = stmt(client, &format!("SELECT key, value::text, version, expires_at, updated_at FROM queen.kv WHERE ns = $1 AND key = $2 AND {LIVE}")).await?;
            let row = client.query_opt(&sql, &[ns, key]).await?;
            match row {
                Some(r) => {
                    let mut v = row_json(&r, false);
                    v["found"] = json!(true);
                    v
                }
                None => json!({"found": false, "key": key}),
            }
        }
        Op::GetMany { ns, keys } => {
            let sql = stmt(client, &format!("SELECT key, value::text, version, expires_at, updated_at FROM queen.kv WHERE ns = $1 AND key = ANY($2) AND {LIVE}")).await?;
            let rows = client.query(&sql, &[ns, keys]).await?;
            let mut found: std::collections::HashMap<String, &tokio_postgres::Row> = rows.iter().map(|r| (r.get(0), r)).collect();
            let (mut out, mut missing, mut bytes, mut truncated) = (Vec::new(), Vec::new(), 0usize, false);
            for k in keys {
                match found.remove(k) {
                    Some(r) => {
                        let size = r.get::<_, Option<&str>>(1).map_or(0, str::len) + k.len();
                        if bytes + size > *budget && !out.is_empty() {
                            truncated = true;
                            continue;
                        }
                        bytes += size;
                        out.push(row_json(r, false));
                    }
                    None => missing.push(json!(k)),
                }
            }
            *budget = budget.saturating_sub(bytes);
            json!({"rows": out, "missing": missing, "truncated": truncated})
        }
        Op::GetPrefix { ns, prefix, after, limit, keys_only } => {
            let sql = stmt(
                client,
                &format!(
                    "SELECT key, CASE WHEN $5 THEN NULL ELSE value::text END, version, expires_at, updated_at FROM queen.kv
                     WHERE ns = $1 AND starts_with(key, $2) AND ($3::text IS NULL OR key > $3) AND {LIVE}
                     ORDER BY key LIMIT $4"
                ),
            )
            .await?;
            let rows = client.query(&sql, &[ns, prefix, after, &(limit + 1), keys_only]).await?;
            let (mut out, mut bytes, mut truncated) = (Vec::new(), 0usize, rows.len() as i64 > *limit);
            for r in rows.iter().take(*limit as usize) {
                let size = r.get::<_, Option<&str>>(1).map_or(0, str::len) + r.get::<_, &str>(0).len();
                if bytes + size > *budget && !out.is_empty() {
                    truncated = true;
                    break;
                }
                bytes += size;
                out.push(row_json(r, *keys_only));
            }
            *budget = budget.saturating_sub(bytes);
            let next = if truncated { out.last().map(|r| r["key"].clone()).unwrap_or(Value::Null) } else { Value::Null };
            json!({"rows": out, "truncated": truncated, "nextAfter": next})
        }
        Op::Put { ns, key, value, ttl, expect, .. } => {
            let sql = "SELECT applied, reason, value::text, version, expires_at, updated_at FROM queen.kv_put_v1($1, $2, $3::text::jsonb, $4, $5)";
            verdict_json(key, client.query_one(&stmt(client, sql).await?, &[ns, key, value, ttl, expect]).await?)
        }
        Op::Delete { ns, key, expect, .. } => {
            let sql = "SELECT applied, reason, value::text, version, expires_at, updated_at FROM queen.kv_delete_v1($1, $2, $3)";
            verdict_json(key, client.query_one(&stmt(client, sql).await?, &[ns, key, expect]).await?)
        }
        Op::Check { ns, key, expect, .. } => {
            let sql = "SELECT applied, reason, value::text, version, expires_at, updated_at FROM queen.kv_check_v1($1, $2, $3)";
            verdict_json(key, client.query_one(&stmt(client, sql).await?, &[ns, key, expect]).await?)
        }
        Op::Incr { ns, key, delta, min, max, ttl, .. } => {
            let sql = "SELECT applied, reason, value::text, version, expires_at, updated_at
                       FROM queen.kv_incr_v1($1, $2, $3::text::numeric, $4::text::numeric, $5::text::numeric, $6)";
            verdict_json(key, client.query_one(&stmt(client, sql).await?, &[ns, key, delta, min, max, ttl]).await?)
        }
    })
}

/// `GET /api/v1/resources/kv/namespaces`: every namespace of `tenant`
/// with its live keys and their stored bytes.
pub async fn namespaces(pool: &Pool, tenant: crate::tenancy::Tenant) -> Result<Value, DbError> {
    let client = pool.get().await?;
    // The tenant's prefix (none for the default tenant, whose names are
    // the ones no other tenant's prefix opens).
    let prefix = tenant.stored("");
    let rows = client
        .query(
            &format!(
                "SELECT ns, count(*)::bigint, COALESCE(sum(pg_column_size(value)), 0)::bigint, max(updated_at)
                 FROM queen.kv WHERE {LIVE} AND starts_with(ns, $1) AND ($1 <> '' OR NOT starts_with(ns, chr(1)))
                 GROUP BY ns ORDER BY ns"
            ),
            &[&prefix],
        )
        .await?;
    let namespaces: Vec<Value> = rows
        .iter()
        .map(|r| json!({"ns": crate::tenancy::shown(r.get::<_, &str>(0)), "keys": r.get::<_, i64>(1), "bytes": r.get::<_, i64>(2), "lastUpdatedAt": time(r.get(3))}))
        .collect();
    Ok(json!({"namespaces": namespaces}))
}

/// `POST /api/v1/resources/kv/list`: a namespace's keys (no values), by
/// key order, a page at a time.
pub async fn list(pool: &Pool, ns: &str, prefix: &str, after: Option<&str>, limit: i64) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            &format!(
                "SELECT key, pg_column_size(value)::bigint, version, expires_at, updated_at FROM queen.kv
                 WHERE ns = $1 AND starts_with(key, $2) AND ($3::text IS NULL OR key > $3) AND {LIVE}
                 ORDER BY key LIMIT $4"
            ),
            &[&ns, &prefix, &after, &(limit + 1)],
        )
        .await?;
    let truncated = rows.len() as i64 > limit;
    // A permit's version is its holder's token: the locks' keys are listed
    // without it (the operator still sees which locks are held, and until when).
    let tokens_hidden = crate::tenancy::shown(ns) == ops::LOCKS_NAMESPACE;
    let keys: Vec<Value> = rows
        .iter()
        .take(limit as usize)
        .map(|r| {
            let version = if tokens_hidden { Value::Null } else { json!(r.get::<_, i64>(2)) };
            json!({"key": r.get::<_, String>(0), "bytes": r.get::<_, i64>(1), "version": version,
                   "expiresAt": time(r.get(3)), "updatedAt": time(r.get(4))})
        })
        .collect();
    let next = if truncated { keys.last().map(|k| k["key"].clone()).unwrap_or(Value::Null) } else { Value::Null };
    Ok(json!({"ns": crate::tenancy::shown(ns), "keys": keys, "truncated": truncated, "nextAfter": next}))
}
