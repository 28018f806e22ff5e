//! Queue resources (API.md §2.7): listing, one queue with its options, depth
//! per group, deletion, and the overview/namespace/task roll-ups.
//!
//! Figures come from the partition rows (`last_offset`, `log_start`) and the
//! cursors, never from counting messages: pending for a group is
//! `last_offset − max(committed, log_start − 1)` per partition.

use crate::tenancy::{shown, Tenant};
use deadpool_postgres::Pool;
use serde_json::{json, Value};

use super::configure::options_json;
use crate::json::iso_ms;
use crate::db::DbError;

/// `GET /api/v1/resources/queues?limit=&offset=&search=`
pub async fn list_queues(pool: &Pool, tenant: Tenant, search: Option<&str>, limit: i64, offset: i64) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let pattern = search.map(|s| format!("%{}%", s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")));
    let total: i64 = client
        .query_one("SELECT count(*) FROM queen.queues q WHERE q.tenant_id = $2 AND ($1::text IS NULL OR q.name ILIKE $1)", &[&pattern, &tenant.0])
        .await?
        .get(0);
    let rows = client
        .query(
            "SELECT q.id, q.name, q.namespace, q.task, q.created_at,
                    count(p.id)::bigint, COALESCE(sum(p.last_offset + 1 - p.log_start), 0)::bigint
             FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id
             WHERE q.tenant_id = $4 AND ($1::text IS NULL OR q.name ILIKE $1)
             GROUP BY q.id ORDER BY q.name LIMIT $2 OFFSET $3",
            &[&pattern, &limit, &offset, &tenant.0],
        )
        .await?;
    let queues: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"id": r.get::<_, i64>(0).to_string(), "name": shown(r.get(1)), "namespace": r.get::<_, String>(2),
                   "task": r.get::<_, String>(3), "createdAt": iso_ms(r.get(4)), "partitions": r.get::<_, i64>(5),
                   "messages": r.get::<_, i64>(6)})
        })
        .collect();
    Ok(json!({"queues": queues, "total": total, "limit": limit, "offset": offset}))
}

/// `GET /api/v1/resources/queues/{q}`; `None` = 404.
pub async fn get_queue(pool: &Pool, queue: &str) -> Result<Option<Value>, DbError> {
    let client = pool.get().await?;
    let Some(q) = client.query_opt("SELECT * FROM queen.queues WHERE name = $1", &[&queue]).await? else {
        return Ok(None);
    };
    let qid: i64 = q.get("id");
    let t = client
        .query_one(
            "SELECT count(*)::bigint, COALESCE(sum(last_offset + 1 - log_start), 0)::bigint, max(last_write_at)
             FROM queen.partitions WHERE queue_id = $1",
            &[&qid],
        )
        .await?;
    let groups: Vec<String> = client
        .query(
            "SELECT DISTINCT c.consumer_group FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id
             WHERE p.queue_id = $1 ORDER BY 1",
            &[&qid],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(Some(json!({
        "id": qid.to_string(),
        "name": shown(q.get("name")),
        "namespace": q.get::<_, String>("namespace"),
        "task": q.get::<_, String>("task"),
        "createdAt": iso_ms(q.get("created_at")),
        "updatedAt": iso_ms(q.get("updated_at")),
        "partitions": t.get::<_, i64>(0),
        "messages": t.get::<_, i64>(1),
        "lastWriteAt": t.get::<_, Option<chrono::DateTime<chrono::Utc>>>(2).map(iso_ms),
        "consumerGroups": groups,
        "options": options_json(&q),
    })))
}

/// `GET /api/v1/resources/queues/{q}/depth?group=`; `None` = 404.
pub async fn depth(pool: &Pool, queue: &str, group: &str) -> Result<Option<Value>, DbError> {
    let client = pool.get().await?;
    if client.query_opt("SELECT 1 FROM queen.queues WHERE name = $1", &[&queue]).await?.is_none() {
        return Ok(None);
    }
    let rows = client
        .query(
            "SELECT p.name, GREATEST(p.last_offset - GREATEST(COALESCE(c.committed, -1), p.log_start - 1), 0)::bigint
             FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
             LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = $2
             WHERE q.name = $1 ORDER BY p.name",
            &[&queue, &group],
        )
        .await?;
    let partitions: Vec<Value> =
        rows.iter().map(|r| json!({"partition": r.get::<_, String>(0), "pending": r.get::<_, i64>(1)})).collect();
    let pending: i64 = rows.iter().map(|r| r.get::<_, i64>(1)).sum();
    let partitions_pending = rows.iter().filter(|r| r.get::<_, i64>(1) > 0).count();
    Ok(Some(json!({"queue": queue, "group": group, "pending": pending, "partitionsPending": partitions_pending,
                   "conflation": false, "effectivePending": pending, "partitions": partitions})))
}

/// `DELETE /api/v1/resources/queues/{q}`: idempotent.
pub async fn delete_queue(pool: &Pool, queue: &str) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let r = client.query_one("SELECT * FROM queen.delete_queue_v1($1)", &[&queue]).await?;
    let existed: bool = r.get(0);
    Ok(if existed {
        json!({"deleted": true, "existed": true, "queue": queue, "partitionsDeleted": r.get::<_, i32>(1),
               "messagesDeleted": r.get::<_, i64>(2)})
    } else {
        json!({"deleted": false, "existed": false, "queue": queue, "message": "Queue not found, nothing was deleted"})
    })
}

/// `GET /api/v1/resources/overview`: of every queue, or with tenancy on
/// (`tenant` given) of the tenant's.
pub async fn overview(pool: &Pool, tenant: Option<Tenant>) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let sql = match tenant {
        None => "SELECT (SELECT count(*) FROM queen.queues)::bigint,
                    (SELECT count(*) FROM queen.partitions)::bigint,
                    (SELECT COALESCE(sum(last_offset + 1 - log_start), 0) FROM queen.partitions)::bigint,
                    (SELECT count(DISTINCT consumer_group) FROM queen.consumers)::bigint,
                    (SELECT count(*) FROM queen.dead_letters)::bigint,
                    (SELECT count(DISTINCT namespace) FROM queen.queues WHERE namespace <> '')::bigint,
                    (SELECT count(DISTINCT task) FROM queen.queues WHERE task <> '')::bigint,
                    (SELECT count(*) FROM queen.consumers WHERE lease_expires_at > now())::bigint"
            .to_string(),
        Some(t) => {
            let owns = t.owns_sql("q.name");
            let parts = format!("queen.partitions p JOIN queen.queues q ON q.id = p.queue_id AND {owns}");
            let cursors = format!("queen.consumers c JOIN {parts} ON p.id = c.partition_id");
            format!(
                "SELECT (SELECT count(*) FROM queen.queues q WHERE {owns})::bigint,
                        (SELECT count(*) FROM {parts})::bigint,
                        (SELECT COALESCE(sum(p.last_offset + 1 - p.log_start), 0) FROM {parts})::bigint,
                        (SELECT count(DISTINCT c.consumer_group) FROM {cursors})::bigint,
                        (SELECT count(*) FROM queen.dead_letters d JOIN queen.queues q ON q.id = d.queue_id AND {owns})::bigint,
                        (SELECT count(DISTINCT namespace) FROM queen.queues q WHERE namespace <> '' AND {owns})::bigint,
                        (SELECT count(DISTINCT task) FROM queen.queues q WHERE task <> '' AND {owns})::bigint,
                        (SELECT count(*) FROM {cursors} WHERE c.lease_expires_at > now())::bigint"
            )
        }
    };
    let r = client.query_one(&sql, &[]).await?;
    Ok(json!({"queues": r.get::<_, i64>(0), "partitions": r.get::<_, i64>(1), "messages": {"total": r.get::<_, i64>(2)},
              "consumerGroups": r.get::<_, i64>(3), "deadLetters": r.get::<_, i64>(4), "namespaces": r.get::<_, i64>(5),
              "tasks": r.get::<_, i64>(6), "activeLeases": r.get::<_, i64>(7)}))
}

/// `GET /api/v1/resources/namespaces` or `…/tasks`: queues rolled up by
/// label (with tenancy on, `tenant` given, the tenant's queues).
pub async fn by_label(pool: &Pool, tasks: bool, tenant: Option<Tenant>) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let column = if tasks { "task" } else { "namespace" };
    let owns = tenant.map_or_else(|| "true".to_string(), |t| t.owns_sql("q.name"));
    let rows = client
        .query(
            &format!(
                "SELECT q.{column}, count(DISTINCT q.id)::bigint, count(p.id)::bigint,
                        COALESCE(sum(p.last_offset + 1 - p.log_start), 0)::bigint, array_agg(DISTINCT q.name)
                 FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id
                 WHERE q.{column} <> '' AND {owns} GROUP BY q.{column} ORDER BY q.{column}"
            ),
            &[],
        )
        .await?;
    let items: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({(column): r.get::<_, String>(0), "queues": r.get::<_, i64>(1), "partitions": r.get::<_, i64>(2),
                   "messages": r.get::<_, i64>(3), "queueNames": r.get::<_, Vec<&str>>(4).into_iter().map(shown).collect::<Vec<_>>()})
        })
        .collect();
    Ok(json!({ (if tasks { "tasks" } else { "namespaces" }): items }))
}
