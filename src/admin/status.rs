//! Status and analytics (API.md §1.2 rows 30–33): current figures from the
//! partitions and cursors, traffic over time from `queen.metrics_samples`
//! (per-minute, summed across brokers).
//!
//! "Pending" of a partition is what some group has not committed yet:
//! `last_offset − min(committed)` over its cursors, the whole retained log
//! when no group has read it. A group's pending and time lag come from the
//! `queen.cursor_lag` view.

use chrono::{DateTime, Duration, Utc};
use deadpool_postgres::Pool;
use serde_json::{json, Value};

use crate::json::iso_ms;
use crate::db::DbError;

/// Filters shared by the status routes.
#[derive(Debug, Clone)]
pub struct Scope {
    /// With tenancy on, the tenant whose queues are in scope (`tenancy`);
    /// `queue` is then a stored name. None: every queue (tenancy off, or a
    /// broker-wide route).
    pub tenant: Option<crate::tenancy::Tenant>,
    pub queue: Option<String>,
    pub namespace: Option<String>,
    pub task: Option<String>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

impl Scope {
    /// The default window: the last hour.
    pub fn new(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Scope {
        let to = to.unwrap_or_else(Utc::now);
        Scope { tenant: None, queue: None, namespace: None, task: None, from: from.unwrap_or(to - Duration::hours(1)), to }
    }

    /// The SQL condition on queue `q` (`$1` to `$3` the queue, namespace and
    /// task filters): [`QUEUE_FILTER`], and the tenant's queues only.
    pub fn filter(&self) -> String {
        match self.tenant {
            None => QUEUE_FILTER.to_string(),
            Some(t) => format!("{QUEUE_FILTER} AND {}", t.owns_sql("q.name")),
        }
    }
}

pub(crate) const QUEUE_FILTER: &str = "($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR q.namespace = $2) AND ($3::text IS NULL OR q.task = $3)";

pub(crate) const PARTITION_PENDING: &str = "GREATEST(p.last_offset - GREATEST(COALESCE(
        (SELECT min(c.committed) FROM queen.consumers c WHERE c.partition_id = p.id), -1), p.log_start - 1), 0)";

/// Traffic per queue in the window, from the samples.
pub(crate) async fn traffic(client: &deadpool_postgres::Client, s: &Scope) -> Result<Vec<(String, i64, i64, i64)>, DbError> {
    let filter = s.filter();
    let rows = client
        .query(
            &format!(
                "SELECT m.queue_name, sum(m.pushed)::bigint, sum(m.popped)::bigint, sum(m.acked)::bigint
                 FROM queen.metrics_samples m LEFT JOIN queen.queues q ON q.name = m.queue_name
                 WHERE {filter} AND m.sampled_at >= $4 AND m.sampled_at <= $5
                 GROUP BY m.queue_name"
            ),
            &[&s.queue, &s.namespace, &s.task, &s.from, &s.to],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect())
}

pub(crate) fn throughput(pushed: i64, popped: i64, acked: i64, s: &Scope) -> Value {
    let secs = (s.to - s.from).num_milliseconds().max(1) as f64 / 1000.0;
    json!({"pushed": pushed, "popped": popped, "acked": acked,
           "pushPerSecond": pushed as f64 / secs, "popPerSecond": popped as f64 / secs, "ackPerSecond": acked as f64 / secs})
}

/// `GET /api/v1/status`
pub async fn overview(pool: &Pool, s: &Scope) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let r = client
        .query_one(
            &format!(
                "SELECT count(DISTINCT q.id)::bigint, count(p.id)::bigint,
                        COALESCE(sum(p.last_offset + 1 - p.log_start), 0)::bigint,
                        COALESCE(sum({PARTITION_PENDING}), 0)::bigint
                 FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id WHERE {filter}"
            ),
            &[&s.queue, &s.namespace, &s.task],
        )
        .await?;
    let g = client
        .query_one(
            &format!(
                "SELECT count(DISTINCT l.consumer_group)::bigint, count(*) FILTER (WHERE l.lease_active)::bigint,
                        COALESCE(max(EXTRACT(EPOCH FROM now() - l.oldest_unconsumed_at)), 0)::float8
                 FROM queen.cursor_lag l JOIN queen.queues q ON q.id = l.queue_id WHERE {filter}"
            ),
            &[&s.queue, &s.namespace, &s.task],
        )
        .await?;
    let (dlq, evicted) = dead_letter_counts(&client, s).await?;
    let t = traffic(&client, s).await?;
    let (pu, po, ac) = t.iter().fold((0, 0, 0), |a, r| (a.0 + r.1, a.1 + r.2, a.2 + r.3));
    Ok(json!({
        "window": {"from": iso_ms(s.from), "to": iso_ms(s.to)},
        "queues": r.get::<_, i64>(0), "partitions": r.get::<_, i64>(1),
        "messages": {"total": r.get::<_, i64>(2), "pending": r.get::<_, i64>(3)},
        "consumerGroups": g.get::<_, i64>(0), "leases": {"active": g.get::<_, i64>(1)},
        "maxLagSeconds": g.get::<_, f64>(2).round() as i64,
        "deadLetters": dlq,
        "evicted": evicted,
        "throughput": throughput(pu, po, ac, s),
    }))
}

/// Dead letters in scope, and how many of them the `maxWaitTimeSeconds`
/// eviction wrote (still in the DLQ: a replayed or deleted one no longer
/// counts).
async fn dead_letter_counts(client: &deadpool_postgres::Client, s: &Scope) -> Result<(i64, i64), DbError> {
    let filter = s.filter();
    let d = client
        .query_one(
            &format!(
                "SELECT count(*)::bigint, count(*) FILTER (WHERE d.error_message = 'max_wait_time')::bigint
                 FROM queen.dead_letters d JOIN queen.queues q ON q.id = d.queue_id WHERE {filter}"
            ),
            &[&s.queue, &s.namespace, &s.task],
        )
        .await?;
    Ok((d.get(0), d.get(1)))
}

/// Per-group pending and lag of one queue.
async fn group_lag(client: &deadpool_postgres::Client, queue_id: i64) -> Result<Vec<Value>, DbError> {
    let rows = client
        .query(
            "SELECT consumer_group, COALESCE(sum(offset_lag), 0)::bigint,
                    COALESCE(max(EXTRACT(EPOCH FROM now() - oldest_unconsumed_at)), 0)::float8,
                    count(*) FILTER (WHERE lease_active)::bigint
             FROM queen.cursor_lag WHERE queue_id = $1 GROUP BY consumer_group ORDER BY consumer_group",
            &[&queue_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| json!({"name": r.get::<_, String>(0), "pending": r.get::<_, i64>(1),
                        "lagSeconds": r.get::<_, f64>(2).round() as i64, "activeLeases": r.get::<_, i64>(3)}))
        .collect())
}

/// How many queues the scope's filters match.
pub(crate) async fn queues_in_scope(client: &deadpool_postgres::Client, s: &Scope) -> Result<i64, DbError> {
    let filter = s.filter();
    let q = format!("SELECT count(*) FROM queen.queues q WHERE {filter}");
    Ok(client.query_one(&q, &[&s.queue, &s.namespace, &s.task]).await?.get(0))
}

/// `GET /api/v1/status/queues`
pub async fn queues(pool: &Pool, s: &Scope, limit: i64, offset: i64) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let total = queues_in_scope(&client, s).await?;
    let rows = client
        .query(
            &format!(
                "SELECT q.id, q.name, q.namespace, q.task, count(p.id)::bigint,
                        COALESCE(sum(p.last_offset + 1 - p.log_start), 0)::bigint, COALESCE(sum({PARTITION_PENDING}), 0)::bigint
                 FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id
                 WHERE {filter} GROUP BY q.id ORDER BY q.name LIMIT $4 OFFSET $5"
            ),
            &[&s.queue, &s.namespace, &s.task, &limit, &offset],
        )
        .await?;
    let t = traffic(&client, s).await?;
    let mut out = Vec::new();
    for r in &rows {
        let name: String = r.get(1);
        let (pu, po, ac) = t.iter().find(|x| x.0 == name).map(|x| (x.1, x.2, x.3)).unwrap_or((0, 0, 0));
        out.push(json!({"name": crate::tenancy::shown(&name), "namespace": r.get::<_, String>(2), "task": r.get::<_, String>(3),
                        "partitions": r.get::<_, i64>(4), "messages": r.get::<_, i64>(5), "pending": r.get::<_, i64>(6),
                        "groups": group_lag(&client, r.get(0)).await?, "throughput": throughput(pu, po, ac, s)}));
    }
    Ok(json!({"queues": out, "total": total, "limit": limit, "offset": offset,
              "window": {"from": iso_ms(s.from), "to": iso_ms(s.to)}}))
}

/// `GET /api/v1/status/queues/{q}`; `None` = 404.
pub async fn queue(pool: &Pool, name: &str, s: &Scope) -> Result<Option<Value>, DbError> {
    let client = pool.get().await?;
    let Some(q) = client.query_opt("SELECT * FROM queen.queues WHERE name = $1", &[&name]).await? else {
        return Ok(None);
    };
    let qid: i64 = q.get("id");
    let parts = client
        .query(
            &format!(
                "SELECT p.id, p.name, p.last_offset, p.log_start, p.last_write_at, {PARTITION_PENDING}::bigint
                 FROM queen.partitions p WHERE p.queue_id = $1 ORDER BY p.name"
            ),
            &[&qid],
        )
        .await?;
    let partitions: Vec<Value> = parts
        .iter()
        .map(|p| json!({"id": p.get::<_, i64>(0).to_string(), "name": p.get::<_, String>(1), "lastOffset": p.get::<_, i64>(2),
                        "logStart": p.get::<_, i64>(3), "messages": p.get::<_, i64>(2) + 1 - p.get::<_, i64>(3),
                        "pending": p.get::<_, i64>(5),
                        "lastWriteAt": p.get::<_, Option<DateTime<Utc>>>(4).map(iso_ms)}))
        .collect();
    let scoped = Scope { queue: Some(name.to_string()), ..s.clone() };
    let t = traffic(&client, &scoped).await?;
    let (pu, po, ac) = t.first().map(|x| (x.1, x.2, x.3)).unwrap_or((0, 0, 0));
    let total: i64 = parts.iter().map(|p| p.get::<_, i64>(2) + 1 - p.get::<_, i64>(3)).sum();
    let pending: i64 = parts.iter().map(|p| p.get::<_, i64>(5)).sum();
    let (dlq, evicted) = dead_letter_counts(&client, &scoped).await?;
    Ok(Some(json!({
        "queue": {"name": crate::tenancy::shown(name), "namespace": q.get::<_, String>("namespace"), "task": q.get::<_, String>("task"),
                  "options": super::configure::options_json(&q)},
        "messages": {"total": total, "pending": pending},
        "partitions": partitions,
        "groups": group_lag(&client, qid).await?,
        "deadLetters": dlq,
        "evicted": evicted,
        "throughput": throughput(pu, po, ac, s),
        "window": {"from": iso_ms(s.from), "to": iso_ms(s.to)},
    })))
}

/// `GET /api/v1/status/analytics?interval=minute|hour|day`
pub async fn analytics(pool: &Pool, s: &Scope, interval: &str) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let rows = client
        .query(
            &format!(
                "SELECT date_trunc($6, m.sampled_at), sum(m.pushed)::bigint, sum(m.popped)::bigint, sum(m.acked)::bigint
                 FROM queen.metrics_samples m LEFT JOIN queen.queues q ON q.name = m.queue_name
                 WHERE {filter} AND m.sampled_at >= $4 AND m.sampled_at <= $5
                 GROUP BY 1 ORDER BY 1"
            ),
            &[&s.queue, &s.namespace, &s.task, &s.from, &s.to, &interval],
        )
        .await?;
    let series: Vec<Value> = rows
        .iter()
        .map(|r| json!({"bucket": iso_ms(r.get(0)), "pushed": r.get::<_, i64>(1), "popped": r.get::<_, i64>(2), "acked": r.get::<_, i64>(3)}))
        .collect();
    let (pu, po, ac) = rows.iter().fold((0, 0, 0), |a, r| (a.0 + r.get::<_, i64>(1), a.1 + r.get::<_, i64>(2), a.2 + r.get::<_, i64>(3)));
    Ok(json!({"interval": interval, "window": {"from": iso_ms(s.from), "to": iso_ms(s.to)},
              "series": series, "totals": throughput(pu, po, ac, s)}))
}
