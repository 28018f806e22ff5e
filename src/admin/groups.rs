//! Consumer groups (API.md §2.7): listing with lag and state, one group per
//! queue and partition, the lagging report, deletion, seek and the
//! subscription cutoff. Lag comes from the `queen.cursor_lag` view.
//!
//! A group's state: `Stable` when it has nothing older than a minute
//! unconsumed; `Lagging` when it does; `Dead` when it is lagging, holds no
//! live lease and has not committed anything for an hour.

use crate::tenancy::{shown, Tenant};
use deadpool_postgres::Pool;
use serde_json::{json, Value};

use crate::json::iso_ms;
use crate::db::DbError;

const LAG_SECONDS: &str = "EXTRACT(EPOCH FROM now() - oldest_unconsumed_at)::float8";

/// `GET /api/v1/consumer-groups`
pub async fn list(pool: &Pool, tenant: Tenant) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            &format!(
                "WITH mine AS (SELECT id FROM queen.queues WHERE tenant_id = $1),
                      subs AS (SELECT s.* FROM queen.subscriptions s WHERE s.queue_id IN (SELECT id FROM mine))
                 SELECT l.consumer_group, array_agg(DISTINCT l.queue_name ORDER BY l.queue_name),
                        count(*) FILTER (WHERE l.lease_active)::bigint, COALESCE(sum(l.offset_lag), 0)::bigint,
                        COALESCE(max({LAG_SECONDS}), 0), max(l.last_consumed_at),
                        (SELECT s.subscription_mode FROM subs s WHERE s.consumer_group = l.consumer_group ORDER BY s.created_at LIMIT 1),
                        (SELECT s.subscription_timestamp FROM subs s WHERE s.consumer_group = l.consumer_group ORDER BY s.created_at LIMIT 1),
                        (SELECT min(s.created_at) FROM subs s WHERE s.consumer_group = l.consumer_group)
                 FROM queen.cursor_lag l WHERE l.queue_id IN (SELECT id FROM mine)
                 GROUP BY l.consumer_group ORDER BY l.consumer_group"
            ),
            &[&tenant.0],
        )
        .await?;
    let groups: Vec<Value> = rows
        .iter()
        .map(|r| {
            let queues: Vec<&str> = r.get::<_, Vec<&str>>(1).into_iter().map(shown).collect();
            let members: i64 = r.get(2);
            let lag: i64 = r.get(3);
            let max_time_lag: f64 = r.get(4);
            let last: Option<chrono::DateTime<chrono::Utc>> = r.get(5);
            let idle = last.is_none_or(|t| (chrono::Utc::now() - t).num_seconds() > 3600);
            let state = if lag == 0 || max_time_lag < 60.0 {
                "Stable"
            } else if members == 0 && idle {
                "Dead"
            } else {
                "Lagging"
            };
            json!({"name": r.get::<_, String>(0), "topics": queues, "queues": queues, "members": members,
                   "totalLag": lag, "maxTimeLag": max_time_lag.round() as i64, "state": state,
                   "subscriptionMode": r.get::<_, Option<String>>(6),
                   "subscriptionTimestamp": r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(7).map(iso_ms),
                   "subscriptionCreatedAt": r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(8).map(iso_ms),
                   "conflation": false})
        })
        .collect();
    Ok(Value::Array(groups))
}

/// `GET /api/v1/consumer-groups/{g}`: an object keyed by queue name.
pub async fn get(pool: &Pool, tenant: Tenant, group: &str) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            &format!(
                "SELECT queue_name, partition_name, worker_id, last_consumed_at, total_consumed, offset_lag,
                        COALESCE({LAG_SECONDS}, 0), COALESCE(lease_active, false), partition_id, committed
                 FROM queen.cursor_lag WHERE consumer_group = $1 AND queue_id IN (SELECT id FROM queen.queues WHERE tenant_id = $2)
                 ORDER BY queue_name, partition_name"
            ),
            &[&group, &tenant.0],
        )
        .await?;
    let mut out = serde_json::Map::new();
    for r in &rows {
        let entry = out
            .entry(shown(r.get(0)).to_string())
            .or_insert_with(|| json!({"conflation": false, "partitions": []}));
        entry["partitions"].as_array_mut().expect("partitions is an array").push(json!({
            "partition": r.get::<_, String>(1), "partitionId": r.get::<_, i64>(8).to_string(),
            "workerId": r.get::<_, Option<String>>(2),
            "lastConsumedAt": r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(3).map(iso_ms),
            "totalConsumed": r.get::<_, i64>(4), "offsetLag": r.get::<_, i64>(5),
            "timeLagSeconds": r.get::<_, f64>(6).round() as i64, "leaseActive": r.get::<_, bool>(7),
            "committedOffset": r.get::<_, i64>(9)}));
    }
    Ok(Value::Object(out))
}

/// `GET /api/v1/consumer-groups/lagging?minLagSeconds=` (snake_case, as upstream).
pub async fn lagging(pool: &Pool, tenant: Tenant, min_lag_seconds: i64) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let min = min_lag_seconds as f64;
    let rows = client
        .query(
            &format!(
                "SELECT consumer_group, queue_name, partition_name, partition_id, worker_id, offset_lag,
                        {LAG_SECONDS}, oldest_unconsumed_at, last_consumed_at
                 FROM queen.cursor_lag WHERE offset_lag > 0 AND {LAG_SECONDS} >= $1
                   AND queue_id IN (SELECT id FROM queen.queues WHERE tenant_id = $2)
                 ORDER BY {LAG_SECONDS} DESC"
            ),
            &[&min, &tenant.0],
        )
        .await?;
    Ok(Value::Array(
        rows.iter()
            .map(|r| {
                let secs: f64 = r.get(6);
                json!({"consumer_group": r.get::<_, String>(0), "queue_name": shown(r.get(1)),
                       "partition_name": r.get::<_, String>(2), "partition_id": r.get::<_, i64>(3).to_string(),
                       "worker_id": r.get::<_, Option<String>>(4), "offset_lag": r.get::<_, i64>(5),
                       "time_lag_seconds": secs.round() as i64, "lag_hours": (secs / 36.0).round() / 100.0,
                       "oldest_unconsumed_at": r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(7).map(iso_ms),
                       "last_consumed_at": r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(8).map(iso_ms)})
            })
            .collect(),
    ))
}

/// Deletes a group's cursors (on one queue, or all), and with
/// `delete_metadata` its subscription records: it re-consumes from its
/// subscription point (or from scratch) next time.
pub async fn delete(pool: &Pool, tenant: Tenant, group: &str, queue: Option<&str>, delete_metadata: bool) -> Result<(u64, bool), DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let n = delete_in(&tx, tenant, group, queue, delete_metadata).await?;
    tx.commit().await?;
    Ok((n, delete_metadata))
}

/// [`delete`] inside the caller's transaction (a stream registration that
/// resets deletes its group with its state, all or nothing). Only the
/// tenant's queues: a group's name is the tenant's own.
pub async fn delete_in(
    tx: &impl deadpool_postgres::GenericClient,
    tenant: Tenant,
    group: &str,
    queue: Option<&str>,
    delete_metadata: bool,
) -> Result<u64, DbError> {
    // Per-(queue, group) rows of the group, on one queue or all.
    let scope = "USING queen.queues q WHERE q.id = t.queue_id AND t.consumer_group = $1 AND ($2::text IS NULL OR q.name = $2) AND q.tenant_id = $3";
    // The subscription first: a background chunk of the group's cursors
    // (`pop::cursor_seed`) holds it while it writes, so this waits for that
    // chunk and the cursor delete below sees it; a later chunk finds no
    // subscription and writes nothing.
    if delete_metadata {
        tx.execute(&format!("DELETE FROM queen.subscriptions t {scope}"), &[&group, &queue, &tenant.0]).await?;
    }
    let n = tx
        .execute(
            "DELETE FROM queen.consumers c USING queen.partitions p, queen.queues q
             WHERE p.id = c.partition_id AND q.id = p.queue_id AND c.consumer_group = $1
               AND ($2::text IS NULL OR q.name = $2) AND q.tenant_id = $3",
            &[&group, &queue, &tenant.0],
        )
        .await?;
    tx.execute(&format!("DELETE FROM queen.scan_watermarks t {scope}"), &[&group, &queue, &tenant.0]).await?;
    Ok(n)
}

/// Seeks a group on a queue (or one partition); `None` = no such queue.
pub async fn seek(pool: &Pool, group: &str, queue: &str, to_end: bool, ts: Option<chrono::DateTime<chrono::Utc>>, partition: Option<&str>) -> Result<Option<i32>, DbError> {
    let client = pool.get().await?;
    let r = client.query_one("SELECT queen.seek_v1($1, $2, $3, $4, $5)", &[&queue, &group, &to_end, &ts, &partition]).await?;
    Ok(r.get(0))
}

/// Moves the durable subscription cutoff of every queue the group is
/// subscribed to; returns how many records changed.
pub async fn set_subscription(pool: &Pool, tenant: Tenant, group: &str, ts: chrono::DateTime<chrono::Utc>) -> Result<u64, DbError> {
    let client = pool.get().await?;
    Ok(client
        .execute(
            "UPDATE queen.subscriptions s SET subscription_timestamp = $2, subscription_mode = 'timestamp'
             FROM queen.queues q WHERE s.consumer_group = $1 AND q.id = s.queue_id AND q.tenant_id = $3",
            &[&group, &ts, &tenant.0],
        )
        .await?)
}
