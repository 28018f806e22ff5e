//! The analytics family (`GET /api/v1/analytics/*`, API.md §1.2 and the
//! routes of upstream 1.6): what an operator or a dashboard reads to see a
//! busy broker. Each route is one read of what the log already keeps:
//!
//! * traffic over time from `queen.metrics_samples` and system figures from
//!   `queen.broker_samples` (both written by every broker's metrics
//!   sampler, so they cover every broker on the database);
//! * lag, workload, retention and liveness from the partitions and cursors
//!   as they are now (`queen.cursor_lag`, the pending rule of
//!   `admin::status`);
//! * DLQ signatures from the dead letters; PostgreSQL's own statistics views.
//!
//! Shapes are drawn for a chart or a table without reshaping: time series
//! are `[{t, value}]` (or one object per bucket with several values), tables
//! are arrays of objects, paged with `limit`/`offset` and a `total`.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde_json::{json, Map, Value};

use crate::json::iso_ms;
use crate::admin::status::{queues_in_scope, throughput, traffic, Scope, PARTITION_PENDING};
use crate::db::DbError;

/// A time bucket of the series: `date_trunc`'s unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Interval {
    Minute,
    Hour,
    Day,
}

impl Interval {
    pub fn parse(v: Option<&str>) -> Result<Interval, String> {
        match v {
            None | Some("minute") | Some("1m") => Ok(Interval::Minute),
            Some("hour") | Some("1h") => Ok(Interval::Hour),
            Some("day") | Some("1d") => Ok(Interval::Day),
            Some(other) => Err(format!("interval: must be minute, hour or day, got {other:?}")),
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Interval::Minute => "minute",
            Interval::Hour => "hour",
            Interval::Day => "day",
        }
    }
}

/// `limit`/`offset` of a table.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    pub limit: i64,
    pub offset: i64,
}

fn window(s: &Scope) -> Value {
    json!({"from": iso_ms(s.from), "to": iso_ms(s.to)})
}

fn opt_time(t: Option<DateTime<Utc>>) -> Value {
    t.map(iso_ms).map(Value::String).unwrap_or(Value::Null)
}

/// Seconds since `t`, rounded; null when there is no `t`.
fn age(t: Option<DateTime<Utc>>) -> Value {
    t.map(|t| json!(((Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0).round() as i64)).unwrap_or(Value::Null)
}

/// `GET /api/v1/analytics/system-metrics`: memory, CPU, request rate,
/// database pool and parked long-polls over time, summed across brokers
/// (each broker's samples averaged within a bucket first), and each
/// broker's latest sample.
pub async fn system_metrics(pool: &Pool, s: &Scope, interval: Interval) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "WITH per_broker AS (
                 SELECT date_trunc($3, sampled_at) AS t, broker,
                        avg(rss_bytes)::float8 AS rss, avg(cpu_percent) AS cpu, avg(requests_per_second) AS rps,
                        avg(pool_size)::float8 AS conns, avg(pool_in_use)::float8 AS in_use,
                        avg(pool_waiting)::float8 AS waiting, avg(parked_long_polls)::float8 AS parked
                 FROM queen.broker_samples WHERE sampled_at >= $1 AND sampled_at <= $2 GROUP BY 1, 2)
             SELECT t, sum(rss), sum(cpu), sum(rps), sum(conns), sum(in_use), sum(waiting), sum(parked), count(*)::float8
             FROM per_broker GROUP BY t ORDER BY t",
            &[&s.from, &s.to, &interval.unit()],
        )
        .await?;
    const SERIES: [&str; 8] =
        ["rssBytes", "cpuPercent", "requestsPerSecond", "dbConnections", "dbConnectionsInUse", "dbWaiting", "parkedLongPolls", "brokers"];
    let mut series = Map::new();
    for (i, name) in SERIES.iter().enumerate() {
        let points: Vec<Value> = rows
            .iter()
            .map(|r| json!({"t": iso_ms(r.get(0)), "value": (r.get::<_, f64>(i + 1) * 100.0).round() / 100.0}))
            .collect();
        series.insert(name.to_string(), Value::Array(points));
    }
    let brokers = latest_broker_samples(&client, s).await?;
    Ok(json!({"interval": interval.unit(), "window": window(s), "series": series, "brokers": brokers}))
}

/// Each broker's newest sample in the window, by broker name.
async fn latest_broker_samples(client: &deadpool_postgres::Client, s: &Scope) -> Result<Vec<Value>, DbError> {
    let rows = client
        .query(
            "SELECT DISTINCT ON (broker) broker, sampled_at, rss_bytes, cpu_percent, requests_per_second,
                    pool_size, pool_in_use, pool_waiting, parked_long_polls, uptime_seconds
             FROM queen.broker_samples WHERE sampled_at >= $1 AND sampled_at <= $2
             ORDER BY broker, sampled_at DESC",
            &[&s.from, &s.to],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            json!({"broker": r.get::<_, String>(0), "sampledAt": iso_ms(r.get(1)), "rssBytes": r.get::<_, i64>(2),
                   "cpuPercent": (r.get::<_, f64>(3) * 100.0).round() / 100.0,
                   "requestsPerSecond": (r.get::<_, f64>(4) * 100.0).round() / 100.0,
                   "dbConnections": r.get::<_, i32>(5), "dbConnectionsInUse": r.get::<_, i32>(6), "dbWaiting": r.get::<_, i32>(7),
                   "parkedLongPolls": r.get::<_, i64>(8), "uptimeSeconds": r.get::<_, i64>(9)})
        })
        .collect())
}

/// `GET /api/v1/analytics/worker-metrics`: each broker's pushes, pops and
/// acks in the window (queue filters apply) with its latest system sample,
/// and the same traffic per broker over time.
pub async fn worker_metrics(pool: &Pool, s: &Scope, interval: Interval) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let from_samples = format!(
        "FROM queen.metrics_samples m LEFT JOIN queen.queues q ON q.name = m.queue_name
         WHERE {filter} AND m.sampled_at >= $4 AND m.sampled_at <= $5"
    );
    let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [&s.queue, &s.namespace, &s.task, &s.from, &s.to];
    let totals = client
        .query(
            &format!(
                "SELECT m.broker, sum(m.pushed)::bigint, sum(m.popped)::bigint, sum(m.acked)::bigint, max(m.sampled_at)
                 {from_samples} GROUP BY m.broker ORDER BY m.broker"
            ),
            &args,
        )
        .await?;
    let unit = interval.unit();
    let series = client
        .query(
            &format!(
                "SELECT date_trunc($6, m.sampled_at), m.broker, sum(m.pushed)::bigint, sum(m.popped)::bigint, sum(m.acked)::bigint
                 {from_samples} GROUP BY 1, 2 ORDER BY 1, 2"
            ),
            &[&s.queue, &s.namespace, &s.task, &s.from, &s.to, &unit],
        )
        .await?;
    let system = latest_broker_samples(&client, s).await?;
    let mut workers: Vec<Value> = Vec::new();
    for r in &totals {
        let broker: String = r.get(0);
        let mut w = json!({"broker": broker, "lastTrafficAt": iso_ms(r.get(4)),
                           "traffic": throughput(r.get(1), r.get(2), r.get(3), s)});
        if let Some(sys) = system.iter().find(|x| x["broker"] == broker) {
            w["system"] = sys.clone();
        }
        workers.push(w);
    }
    // Brokers that sampled but moved no traffic in scope still show.
    for sys in &system {
        if !workers.iter().any(|w| w["broker"] == sys["broker"]) {
            workers.push(json!({"broker": sys["broker"], "lastTrafficAt": null, "traffic": throughput(0, 0, 0, s), "system": sys}));
        }
    }
    let series: Vec<Value> = series
        .iter()
        .map(|r| {
            json!({"t": iso_ms(r.get(0)), "broker": r.get::<_, String>(1), "pushed": r.get::<_, i64>(2),
                   "popped": r.get::<_, i64>(3), "acked": r.get::<_, i64>(4)})
        })
        .collect();
    Ok(json!({"interval": unit, "window": window(s), "workers": workers, "series": series}))
}

/// `GET /api/v1/analytics/queue-lag`: every (queue, group) with what it
/// has not consumed, in messages and in seconds (the age of its oldest
/// unconsumed message), most lagging first.
pub async fn queue_lag(pool: &Pool, s: &Scope, page: Page) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let grouped = format!(
        "SELECT l.queue_name, l.consumer_group, count(*)::bigint AS partitions,
                count(*) FILTER (WHERE l.offset_lag > 0)::bigint AS behind,
                COALESCE(sum(l.offset_lag), 0)::bigint AS pending,
                min(l.oldest_unconsumed_at) AS oldest,
                count(*) FILTER (WHERE l.lease_active)::bigint AS leases,
                max(l.last_consumed_at) AS last_consumed
         FROM queen.cursor_lag l JOIN queen.queues q ON q.id = l.queue_id
         WHERE {filter} GROUP BY l.queue_name, l.consumer_group"
    );
    let total: i64 = client
        .query_one(&format!("SELECT count(*) FROM ({grouped}) g"), &[&s.queue, &s.namespace, &s.task])
        .await?
        .get(0);
    let rows = client
        .query(
            &format!("{grouped} ORDER BY min(l.oldest_unconsumed_at) NULLS LAST, 5 DESC, 1, 2 LIMIT $4 OFFSET $5"),
            &[&s.queue, &s.namespace, &s.task, &page.limit, &page.offset],
        )
        .await?;
    let groups: Vec<Value> = rows
        .iter()
        .map(|r| {
            let oldest: Option<DateTime<Utc>> = r.get(5);
            json!({"queue": crate::tenancy::shown(r.get::<_, &str>(0)), "consumerGroup": r.get::<_, String>(1),
                   "partitions": r.get::<_, i64>(2), "partitionsBehind": r.get::<_, i64>(3),
                   "pendingMessages": r.get::<_, i64>(4), "oldestPendingAt": opt_time(oldest),
                   "lagSeconds": age(oldest).as_i64().unwrap_or(0), "activeLeases": r.get::<_, i64>(6),
                   "lastConsumedAt": opt_time(r.get(7))})
        })
        .collect();
    Ok(json!({"groups": groups, "total": total, "limit": page.limit, "offset": page.offset}))
}

/// `GET /api/v1/analytics/queue-ops`: pushes, pops, acks and dead letters
/// per queue in the window, busiest first, each with its series.
pub async fn queue_ops(pool: &Pool, s: &Scope, interval: Interval, page: Page) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let unit = interval.unit();
    // Queues with traffic or dead letters in the window.
    let ranked = client
        .query(
            &format!(
                "WITH t AS (
                     SELECT m.queue_name AS name, sum(m.pushed)::bigint AS pu, sum(m.popped)::bigint AS po, sum(m.acked)::bigint AS ac
                     FROM queen.metrics_samples m LEFT JOIN queen.queues q ON q.name = m.queue_name
                     WHERE {filter} AND m.sampled_at >= $4 AND m.sampled_at <= $5 GROUP BY 1),
                 d AS (
                     SELECT q.name, count(*)::bigint AS dl FROM queen.dead_letters x JOIN queen.queues q ON q.id = x.queue_id
                     WHERE {filter} AND x.failed_at >= $4 AND x.failed_at <= $5 GROUP BY 1)
                 SELECT COALESCE(t.name, d.name), COALESCE(t.pu, 0), COALESCE(t.po, 0), COALESCE(t.ac, 0), COALESCE(d.dl, 0),
                        count(*) OVER ()
                 FROM t FULL JOIN d ON d.name = t.name
                 ORDER BY COALESCE(t.pu, 0) + COALESCE(t.po, 0) + COALESCE(t.ac, 0) + COALESCE(d.dl, 0) DESC, 1
                 LIMIT $6 OFFSET $7"
            ),
            &[&s.queue, &s.namespace, &s.task, &s.from, &s.to, &page.limit, &page.offset],
        )
        .await?;
    let total: i64 = ranked.first().map(|r| r.get(5)).unwrap_or(0);
    let names: Vec<String> = ranked.iter().map(|r| r.get(0)).collect();
    let traffic_series = client
        .query(
            "SELECT m.queue_name, date_trunc($4, m.sampled_at), sum(m.pushed)::bigint, sum(m.popped)::bigint, sum(m.acked)::bigint
             FROM queen.metrics_samples m WHERE m.queue_name = ANY($1) AND m.sampled_at >= $2 AND m.sampled_at <= $3
             GROUP BY 1, 2 ORDER BY 1, 2",
            &[&names, &s.from, &s.to, &unit],
        )
        .await?;
    let dead_series = client
        .query(
            "SELECT q.name, date_trunc($4, x.failed_at), count(*)::bigint
             FROM queen.dead_letters x JOIN queen.queues q ON q.id = x.queue_id
             WHERE q.name = ANY($1) AND x.failed_at >= $2 AND x.failed_at <= $3 GROUP BY 1, 2 ORDER BY 1, 2",
            &[&names, &s.from, &s.to, &unit],
        )
        .await?;
    let queues: Vec<Value> = ranked
        .iter()
        .map(|r| {
            let name: String = r.get(0);
            // One point per bucket with anything in it, traffic and dead letters merged.
            let mut points: std::collections::BTreeMap<DateTime<Utc>, [i64; 4]> = Default::default();
            for t in traffic_series.iter().filter(|t| t.get::<_, String>(0) == name) {
                let p = points.entry(t.get(1)).or_default();
                (p[0], p[1], p[2]) = (t.get(2), t.get(3), t.get(4));
            }
            for d in dead_series.iter().filter(|d| d.get::<_, String>(0) == name) {
                points.entry(d.get(1)).or_default()[3] = d.get(2);
            }
            let series: Vec<Value> = points
                .iter()
                .map(|(t, v)| json!({"t": iso_ms(*t), "pushed": v[0], "popped": v[1], "acked": v[2], "deadLettered": v[3]}))
                .collect();
            let mut totals = throughput(r.get(1), r.get(2), r.get(3), s);
            totals["deadLettered"] = json!(r.get::<_, i64>(4));
            json!({"queue": crate::tenancy::shown(&name), "totals": totals, "series": series})
        })
        .collect();
    Ok(json!({"interval": unit, "window": window(s), "queues": queues, "total": total, "limit": page.limit, "offset": page.offset}))
}

/// `GET /api/v1/analytics/workload`: the work waiting now, per queue and in
/// total: pending messages, messages in flight under a lease, partitions
/// with work, groups, and how long the backlog takes at the window's ack rate.
pub async fn workload(pool: &Pool, s: &Scope, page: Page) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let per_queue = format!(
        "WITH qs AS (SELECT q.id, q.name, q.namespace, q.task FROM queen.queues q WHERE {filter}),
         parts AS (
             SELECT p.queue_id, count(*)::bigint AS partitions, COALESCE(sum(x.pending), 0)::bigint AS pending,
                    count(*) FILTER (WHERE x.pending > 0)::bigint AS busy
             FROM queen.partitions p, LATERAL (SELECT {PARTITION_PENDING} AS pending) x
             WHERE p.queue_id IN (SELECT id FROM qs) GROUP BY p.queue_id),
         cursors AS (
             SELECT p.queue_id, count(DISTINCT c.consumer_group)::bigint AS groups,
                    count(*) FILTER (WHERE c.lease_expires_at > now())::bigint AS leases,
                    COALESCE(sum(c.batch_end - c.committed) FILTER (WHERE c.lease_expires_at > now()), 0)::bigint AS in_flight
             FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id
             WHERE p.queue_id IN (SELECT id FROM qs) GROUP BY p.queue_id)
         SELECT qs.name, qs.namespace, qs.task, COALESCE(parts.partitions, 0), COALESCE(parts.pending, 0), COALESCE(parts.busy, 0),
                COALESCE(cursors.groups, 0), COALESCE(cursors.leases, 0), COALESCE(cursors.in_flight, 0)
         FROM qs LEFT JOIN parts ON parts.queue_id = qs.id LEFT JOIN cursors ON cursors.queue_id = qs.id"
    );
    let rows = client.query(&format!("{per_queue} ORDER BY 5 DESC, 1"), &[&s.queue, &s.namespace, &s.task]).await?;
    let traffic = traffic(&client, s).await?;
    let secs = (s.to - s.from).num_milliseconds().max(1) as f64 / 1000.0;
    let mut totals = [0i64; 6];
    let mut queues: Vec<Value> = Vec::new();
    for r in &rows {
        let name: String = r.get(0);
        let v: [i64; 6] = [r.get(3), r.get(4), r.get(5), r.get(6), r.get(7), r.get(8)];
        for (t, x) in totals.iter_mut().zip(v) {
            *t += x;
        }
        let (pushed, acked) = traffic.iter().find(|t| t.0 == name).map(|t| (t.1, t.3)).unwrap_or((0, 0));
        queues.push(workload_json(json!({"queue": crate::tenancy::shown(&name), "namespace": r.get::<_, String>(1), "task": r.get::<_, String>(2)}), v, pushed, acked, secs));
    }
    let (pushed, acked) = traffic.iter().filter(|t| rows.iter().any(|r| r.get::<_, String>(0) == t.0)).fold((0, 0), |a, t| (a.0 + t.1, a.1 + t.3));
    let total_queues = queues.len() as i64;
    let start = (page.offset as usize).min(queues.len());
    let end = (start + page.limit as usize).min(queues.len());
    let mut all = workload_json(json!({"queues": total_queues}), totals, pushed, acked, secs);
    all.as_object_mut().expect("an object").remove("groups");
    Ok(json!({"window": window(s), "totals": all, "queues": queues[start..end].to_vec(),
              "total": total_queues, "limit": page.limit, "offset": page.offset}))
}

fn workload_json(mut head: Value, v: [i64; 6], pushed: i64, acked: i64, secs: f64) -> Value {
    let ack_rate = acked as f64 / secs;
    let fields = json!({"partitions": v[0], "pendingMessages": v[1], "partitionsWithPending": v[2], "groups": v[3],
                        "activeLeases": v[4], "inFlightMessages": v[5],
                        "pushPerSecond": pushed as f64 / secs, "ackPerSecond": ack_rate,
                        "drainSeconds": if ack_rate > 0.0 { json!((v[1] as f64 / ack_rate).round() as i64) } else { Value::Null }});
    let h = head.as_object_mut().expect("an object");
    for (k, x) in fields.as_object().expect("an object") {
        h.insert(k.clone(), x.clone());
    }
    head
}

/// `GET /api/v1/analytics/retention`: per queue, what retention keeps and
/// when it next removes something: the options, the retained messages,
/// segments and stored bytes, the oldest message, dead letters.
pub async fn retention(pool: &Pool, s: &Scope, page: Page) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let total = queues_in_scope(&client, s).await?;
    let rows = client
        .query(
            &format!(
                "SELECT q.name, q.retention_enabled, q.retention_seconds, q.completed_retention_seconds, q.dedup_window_seconds,
                        q.max_wait_time_seconds,
                        (SELECT count(*) FROM queen.partitions p WHERE p.queue_id = q.id)::bigint,
                        (SELECT COALESCE(sum(p.last_offset + 1 - p.log_start), 0) FROM queen.partitions p WHERE p.queue_id = q.id)::bigint,
                        seg.n, seg.bytes, seg.oldest,
                        (SELECT count(*) FROM queen.dead_letters d WHERE d.queue_id = q.id)::bigint
                 FROM queen.queues q
                 LEFT JOIN LATERAL (
                     SELECT count(*)::bigint AS n, COALESCE(sum(pg_column_size(x.blob)), 0)::bigint AS bytes, min(x.created_at) AS oldest
                     FROM queen.segments x JOIN queen.partitions p ON p.id = x.partition_id WHERE p.queue_id = q.id) seg ON true
                 WHERE {filter} ORDER BY q.name LIMIT $4 OFFSET $5"
            ),
            &[&s.queue, &s.namespace, &s.task, &page.limit, &page.offset],
        )
        .await?;
    let queues: Vec<Value> = rows
        .iter()
        .map(|r| {
            let (retention, completed): (i32, i32) = (r.get(2), r.get(3));
            let oldest: Option<DateTime<Utc>> = r.get(10);
            // The oldest segment is removed first; a completed-retention
            // removal also waits for every group, so it is "at the earliest".
            let first_due = [retention, completed].into_iter().filter(|v| *v > 0).min();
            let next = match (oldest, first_due) {
                (Some(o), Some(secs)) => json!(iso_ms(o + chrono::Duration::seconds(secs as i64))),
                _ => Value::Null,
            };
            json!({"queue": crate::tenancy::shown(r.get::<_, &str>(0)),
                   "options": {"retentionEnabled": r.get::<_, bool>(1), "retentionSeconds": retention,
                               "completedRetentionSeconds": completed, "dedupWindowSeconds": r.get::<_, i32>(4),
                               "maxWaitTimeSeconds": r.get::<_, i32>(5)},
                   "partitions": r.get::<_, i64>(6), "messages": r.get::<_, i64>(7), "segments": r.get::<_, i64>(8),
                   "storedBytes": r.get::<_, i64>(9), "oldestMessageAt": opt_time(oldest), "oldestAgeSeconds": age(oldest),
                   "nextRemovalAt": next, "deadLetters": r.get::<_, i64>(11)})
        })
        .collect();
    Ok(json!({"queues": queues, "total": total, "limit": page.limit, "offset": page.offset}))
}

/// `GET /api/v1/analytics/dlq-signatures`: dead letters grouped by queue,
/// group and error signature (the error with ids and numbers masked, so one
/// failure mode is one row), largest first. `from`/`to` bound `failed_at`
/// when given; otherwise the whole DLQ.
pub async fn dlq_signatures(
    pool: &Pool,
    s: &Scope,
    bounds: (Option<DateTime<Utc>>, Option<DateTime<Utc>>),
    page: Page,
) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let grouped = format!(
        "SELECT q.name, d.consumer_group, sig.s AS signature, count(*)::bigint AS n, min(d.failed_at), max(d.failed_at),
                (array_agg(d.error_message ORDER BY d.failed_at DESC))[1],
                (array_agg(d.transaction_id ORDER BY d.failed_at DESC))[1],
                (array_agg(d.id ORDER BY d.failed_at DESC))[1]
         FROM queen.dead_letters d JOIN queen.queues q ON q.id = d.queue_id,
              LATERAL (SELECT left(regexp_replace(regexp_replace(COALESCE(d.error_message, ''),
                  '[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{12}}', '<id>', 'g'),
                  '[0-9]+', '<n>', 'g'), 200) AS s) sig
         WHERE {filter} AND ($4::timestamptz IS NULL OR d.failed_at >= $4) AND ($5::timestamptz IS NULL OR d.failed_at <= $5)
         GROUP BY q.name, d.consumer_group, sig.s"
    );
    let rows = client
        .query(
            &format!("SELECT g.*, count(*) OVER (), sum(g.n) OVER ()::bigint FROM ({grouped}) g ORDER BY g.n DESC, 1, 2, 3 LIMIT $6 OFFSET $7"),
            &[&s.queue, &s.namespace, &s.task, &bounds.0, &bounds.1, &page.limit, &page.offset],
        )
        .await?;
    let (total, dead): (i64, i64) = rows.first().map(|r| (r.get(9), r.get(10))).unwrap_or((0, 0));
    let signatures: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"queue": crate::tenancy::shown(r.get::<_, &str>(0)), "consumerGroup": r.get::<_, String>(1), "signature": r.get::<_, String>(2),
                   "count": r.get::<_, i64>(3), "firstAt": iso_ms(r.get(4)), "lastAt": iso_ms(r.get(5)),
                   "sample": {"error": r.get::<_, Option<String>>(6), "transactionId": r.get::<_, String>(7),
                              "dlqId": r.get::<_, i64>(8).to_string()}})
        })
        .collect();
    Ok(json!({"signatures": signatures, "deadLetters": dead, "total": total, "limit": page.limit, "offset": page.offset}))
}

/// `GET /api/v1/analytics/partition-liveness`: per queue, how many
/// partitions were written in the last minute, hour and day and how many are
/// idle; with `queue=`, that queue's partitions too, most recently written
/// first.
pub async fn partition_liveness(pool: &Pool, s: &Scope, page: Page) -> Result<Value, DbError> {
    let filter = s.filter();
    let client = pool.get().await?;
    let rows = client
        .query(
            &format!(
                "SELECT q.name, count(p.id)::bigint,
                        count(*) FILTER (WHERE p.last_write_at > now() - interval '1 minute')::bigint,
                        count(*) FILTER (WHERE p.last_write_at > now() - interval '1 hour')::bigint,
                        count(*) FILTER (WHERE p.last_write_at > now() - interval '1 day')::bigint,
                        count(p.id) FILTER (WHERE p.last_write_at IS NULL OR p.last_write_at <= now() - interval '1 day')::bigint,
                        max(p.last_write_at), min(p.last_write_at), count(*) OVER ()
                 FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id
                 WHERE {filter} GROUP BY q.id ORDER BY q.name LIMIT $4 OFFSET $5"
            ),
            &[&s.queue, &s.namespace, &s.task, &page.limit, &page.offset],
        )
        .await?;
    let total: i64 = rows.first().map(|r| r.get(8)).unwrap_or(0);
    let queues: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"queue": crate::tenancy::shown(r.get::<_, &str>(0)), "partitions": r.get::<_, i64>(1),
                   "writtenLastMinute": r.get::<_, i64>(2), "writtenLastHour": r.get::<_, i64>(3),
                   "writtenLastDay": r.get::<_, i64>(4), "idleOverADay": r.get::<_, i64>(5),
                   "newestWriteAt": opt_time(r.get(6)), "oldestWriteAt": opt_time(r.get(7))})
        })
        .collect();
    let mut answer = json!({"queues": queues, "total": total, "limit": page.limit, "offset": page.offset});
    if let Some(queue) = &s.queue {
        let parts = client
            .query(
                &format!(
                    "SELECT p.id, p.name, p.last_write_at, p.last_offset + 1 - p.log_start, {PARTITION_PENDING}::bigint,
                            (SELECT count(*) FROM queen.consumers c WHERE c.partition_id = p.id AND c.lease_expires_at > now())::bigint,
                            count(*) OVER ()
                     FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1
                     ORDER BY p.last_write_at DESC NULLS LAST, p.id LIMIT $2 OFFSET $3"
                ),
                &[queue, &page.limit, &page.offset],
            )
            .await?;
        answer["partitions"] = Value::Array(
            parts
                .iter()
                .map(|p| {
                    let last: Option<DateTime<Utc>> = p.get(2);
                    json!({"id": p.get::<_, i64>(0).to_string(), "name": p.get::<_, String>(1), "lastWriteAt": opt_time(last),
                           "idleSeconds": age(last), "messages": p.get::<_, i64>(3), "pendingMessages": p.get::<_, i64>(4),
                           "activeLeases": p.get::<_, i64>(5)})
                })
                .collect(),
        );
        answer["partitionsTotal"] = json!(parts.first().map(|r| r.get::<_, i64>(6)).unwrap_or(0));
    }
    Ok(answer)
}

/// `GET /api/v1/analytics/postgres-stats`: the database as PostgreSQL sees
/// it: version, size, connections by state, transaction and cache counters,
/// the oldest open transaction, and every table of the `queen` schema with
/// its rows, dead rows, size, scans and last vacuum.
pub async fn postgres_stats(pool: &Pool) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let db = client
        .query_one(
            "SELECT current_database(), current_setting('server_version'), pg_database_size(current_database()),
                    d.xact_commit, d.xact_rollback, d.blks_read, d.blks_hit, d.deadlocks, d.temp_bytes, d.tup_inserted,
                    d.tup_updated, d.tup_deleted, d.stats_reset, pg_is_in_recovery()
             FROM pg_stat_database d WHERE d.datname = current_database()",
            &[],
        )
        .await?;
    let conns = client
        .query_one(
            "SELECT count(*)::bigint, count(*) FILTER (WHERE state = 'active')::bigint, count(*) FILTER (WHERE state = 'idle')::bigint,
                    count(*) FILTER (WHERE state LIKE 'idle in transaction%')::bigint,
                    count(*) FILTER (WHERE wait_event_type = 'Lock')::bigint,
                    EXTRACT(EPOCH FROM max(now() - xact_start))::float8,
                    current_setting('max_connections')::bigint
             FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'",
            &[],
        )
        .await?;
    let tables = client
        .query(
            "SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid), pg_relation_size(relid),
                    seq_scan, COALESCE(idx_scan, 0), last_autovacuum, last_autoanalyze, n_tup_ins, n_tup_upd, n_tup_del
             FROM pg_stat_user_tables WHERE schemaname = 'queen' ORDER BY pg_total_relation_size(relid) DESC, relname",
            &[],
        )
        .await?;
    let (read, hit): (i64, i64) = (db.get(5), db.get(6));
    Ok(json!({
        "database": {
            "name": db.get::<_, String>(0), "version": db.get::<_, String>(1), "sizeBytes": db.get::<_, i64>(2),
            "inRecovery": db.get::<_, bool>(13),
            "transactions": {"committed": db.get::<_, i64>(3), "rolledBack": db.get::<_, i64>(4)},
            "cache": {"blocksRead": read, "blocksHit": hit,
                      "hitRatio": if read + hit > 0 { json!((hit as f64 / (read + hit) as f64 * 10000.0).round() / 10000.0) } else { Value::Null }},
            "rows": {"inserted": db.get::<_, i64>(9), "updated": db.get::<_, i64>(10), "deleted": db.get::<_, i64>(11)},
            "deadlocks": db.get::<_, i64>(7), "tempBytes": db.get::<_, i64>(8), "statsResetAt": opt_time(db.get(12)),
        },
        "connections": {
            "total": conns.get::<_, i64>(0), "active": conns.get::<_, i64>(1), "idle": conns.get::<_, i64>(2),
            "idleInTransaction": conns.get::<_, i64>(3), "waitingOnLocks": conns.get::<_, i64>(4),
            "max": conns.get::<_, i64>(6),
            "oldestTransactionSeconds": conns.get::<_, Option<f64>>(5).map(|s| (s * 10.0).round() / 10.0),
        },
        "tables": tables.iter().map(|t| json!({
            "name": t.get::<_, String>(0), "liveRows": t.get::<_, i64>(1), "deadRows": t.get::<_, i64>(2),
            "totalBytes": t.get::<_, i64>(3), "tableBytes": t.get::<_, i64>(4), "seqScans": t.get::<_, i64>(5),
            "indexScans": t.get::<_, i64>(6), "lastAutovacuumAt": opt_time(t.get(7)), "lastAutoanalyzeAt": opt_time(t.get(8)),
            "inserted": t.get::<_, i64>(9), "updated": t.get::<_, i64>(10), "deleted": t.get::<_, i64>(11),
        })).collect::<Vec<_>>(),
    }))
}

/// `GET /api/v1/analytics/queue-parked-replicas`: the long-polls parked on
/// each broker ("replica") by its latest sample in the last five minutes,
/// with this broker's count as it is now. Counts are per broker: a broker
/// does not record which queue a parked pop waits on.
pub async fn parked_replicas(pool: &Pool, this_broker: &str, parked_now: i64) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT DISTINCT ON (broker) broker, sampled_at, parked_long_polls FROM queen.broker_samples
             WHERE sampled_at > now() - interval '5 minutes' ORDER BY broker, sampled_at DESC",
            &[],
        )
        .await?;
    let mut brokers: Vec<Value> = rows
        .iter()
        .filter(|r| r.get::<_, String>(0) != this_broker)
        .map(|r| json!({"broker": r.get::<_, String>(0), "parkedLongPolls": r.get::<_, i64>(2), "sampledAt": iso_ms(r.get(1)), "self": false}))
        .collect();
    brokers.push(json!({"broker": this_broker, "parkedLongPolls": parked_now, "sampledAt": iso_ms(Utc::now()), "self": true}));
    brokers.sort_by(|a, b| a["broker"].as_str().cmp(&b["broker"].as_str()));
    let total: i64 = brokers.iter().filter_map(|b| b["parkedLongPolls"].as_i64()).sum();
    Ok(json!({"brokers": brokers, "parkedLongPolls": total}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_accept_words_and_short_forms() {
        assert_eq!(Interval::parse(None).unwrap(), Interval::Minute);
        assert_eq!(Interval::parse(Some("1h")).unwrap().unit(), "hour");
        assert_eq!(Interval::parse(Some("day")).unwrap().unit(), "day");
        assert_eq!(Interval::parse(Some("week")).unwrap_err(), "interval: must be minute, hour or day, got \"week\"");
    }

    #[test]
    fn workload_rows_carry_a_drain_time_only_with_an_ack_rate() {
        let v = workload_json(json!({"queue": "q"}), [2, 100, 1, 1, 1, 10], 60, 60, 60.0);
        assert_eq!((v["pendingMessages"].clone(), v["drainSeconds"].clone()), (json!(100), json!(100)));
        let idle = workload_json(json!({"queue": "q"}), [2, 100, 1, 1, 1, 10], 0, 0, 60.0);
        assert_eq!(idle["drainSeconds"], Value::Null);
    }
}
