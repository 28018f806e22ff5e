//! The log's state as Prometheus gauges (issue 28 §3): per queue its
//! partitions, retained and pending messages and dead letters; per (queue,
//! group) the lag in messages and in seconds; and this broker's push spool.
//!
//! A background service computes them every `STATS_INTERVAL_MS` and sets
//! the gauges; a scrape only renders what is there, so it stays cheap
//! however many partitions the queues have (the cost is this service's
//! queries, once per interval, whatever the scrape rate).
//!
//! The service *walks* the partitions, `QUEEN_MAINTENANCE_WINDOW` (50,000)
//! of them a tick in id order, adding up each queue's and each group's figures as it goes, and
//! sets the gauges when a walk ends. A log of up to a window's partitions is one
//! tick's walk, so its gauges are fresh every interval, as they were when
//! every tick read everything; a larger one's are at most one walk old (at
//! 1,000,000 partitions, 20 ticks). Why: reading a million partitions
//! and their cursors in one pass took 2-4 s of PostgreSQL and ran back to
//! back at the default interval, a core's worth beside the pushes and pops
//! (issue 51); a window costs what 50,000 partitions cost, whatever the log's
//! size. At that size a tick took 1.3-1.6 s, so ticks are also paced to at
//! most 5 % of one connection's time ([`SHARE`]): there the gauges are about
//! ten minutes old at worst. Every broker of a
//! database exports the same log gauges: aggregate them with `max`, not
//! `sum`. A queue or group that disappears stops being set, and the
//! exporter drops its series after [`crate::metrics::GAUGE_IDLE`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;

use crate::db::DbError;
use crate::push::spool::Spool;

pub const QUEUE_PARTITIONS: &str = "queen_queue_partitions";
pub const QUEUE_MESSAGES: &str = "queen_queue_messages";
pub const QUEUE_PENDING: &str = "queen_queue_pending_messages";
pub const QUEUE_DEAD_LETTERS: &str = "queen_queue_dead_letters";
pub const GROUP_LAG_MESSAGES: &str = "queen_consumer_lag_messages";
pub const GROUP_LAG_SECONDS: &str = "queen_consumer_lag_seconds";
pub const SPOOL_FILES: &str = "queen_spool_files";
pub const SPOOL_BYTES: &str = "queen_spool_bytes";
pub const SPOOL_PENDING: &str = "queen_spool_pending";
pub const SPOOL_QUARANTINED: &str = "queen_spool_quarantined_files";

/// Most of one connection's time the walk takes (`maintenance::spawn_walk_service`):
/// a tick over 50,000 partitions of a 1,000,000-partition log took 1.3-1.6 s, so
/// there ticks come every 26-32 s instead of every `STATS_INTERVAL_MS`, and
/// a walk (the gauges' age) takes about ten minutes instead of three. A log
/// whose tick takes under half a second keeps the interval.
pub const SHARE: f64 = 0.05;

/// A walk's running sums, between ticks: where it stands, each queue's
/// (partitions, retained messages, pending messages) and each (queue, group)'s
/// (lag in messages, lag in seconds) over the partitions walked so far.
#[derive(Default)]
pub struct Walk {
    after: i64,
    queues: HashMap<i64, [f64; 3]>,
    groups: HashMap<(i64, String), (f64, f64)>,
}

/// Each queue's figures over the partitions of one window: the slowest
/// cursor of every partition in one grouped pass, joined by hash, rather
/// than one lookup per partition.
const QUEUES_SQL: &str = "
    WITH slowest AS (
        SELECT partition_id, min(committed) AS committed FROM queen.consumers
        WHERE partition_id > $1 AND partition_id <= $2 GROUP BY partition_id)
    SELECT p.queue_id, count(*)::float8, COALESCE(sum(p.last_offset + 1 - p.log_start), 0)::float8,
           COALESCE(sum(GREATEST(p.last_offset - GREATEST(COALESCE(s.committed, -1), p.log_start - 1), 0)), 0)::float8
    FROM queen.partitions p
    LEFT JOIN slowest s ON s.partition_id = p.id
    WHERE p.id > $1 AND p.id <= $2
    GROUP BY p.queue_id";

/// Each (queue, group)'s lag over the cursors of one window's partitions
/// (the view's partition_id is the cursor's own key since 0031, so the
/// range reads the cursors' primary key).
const GROUPS_SQL: &str = "
    SELECT queue_id, consumer_group, COALESCE(sum(offset_lag), 0)::float8,
           COALESCE(max(EXTRACT(EPOCH FROM now() - oldest_unconsumed_at)), 0)::float8
    FROM queen.cursor_lag WHERE partition_id > $1 AND partition_id <= $2
    GROUP BY queue_id, consumer_group";

/// One tick: the spool's gauges, the next window of the walk, and, when the
/// walk reaches the last partition, every log gauge.
pub async fn tick(pool: &Pool, spool: Option<&Arc<Spool>>, walk: &Mutex<Walk>, window: i64) -> Result<bool, DbError> {
    if let Some(spool) = spool {
        let s = spool.stats();
        metrics::gauge!(SPOOL_FILES).set(s.files as f64);
        metrics::gauge!(SPOOL_BYTES).set(s.bytes as f64);
        metrics::gauge!(SPOOL_PENDING).set(if s.pending { 1.0 } else { 0.0 });
        metrics::gauge!(SPOOL_QUARANTINED).set(s.quarantined as f64);
    }
    let client = pool.get().await?;
    let after = walk.lock().expect("gauge walk").after;
    let span = client
        .query_one("SELECT max(id), count(*) FROM (SELECT id FROM queen.partitions WHERE id > $1 ORDER BY id LIMIT $2) w", &[&after, &window])
        .await?;
    let (edge, seen): (Option<i64>, i64) = (span.get(0), span.get(1));
    if let Some(hi) = edge {
        let queues = client.query(QUEUES_SQL, &[&after, &hi]).await?;
        let groups = client.query(GROUPS_SQL, &[&after, &hi]).await?;
        let mut w = walk.lock().expect("gauge walk");
        for r in &queues {
            let sums = w.queues.entry(r.get(0)).or_default();
            for (k, sum) in sums.iter_mut().enumerate() {
                *sum += r.get::<_, f64>(k + 1);
            }
        }
        for r in &groups {
            let lag = w.groups.entry((r.get(0), r.get(1))).or_default();
            lag.0 += r.get::<_, f64>(2);
            lag.1 = lag.1.max(r.get::<_, f64>(3));
        }
        w.after = hi;
    }
    if seen == window {
        return Ok(false);
    }
    // The walk is done: every queue's gauges (a queue without partitions
    // has zeros), then the next walk starts from the first partition.
    let names = client
        .query("SELECT q.id, q.name, (SELECT count(*) FROM queen.dead_letters d WHERE d.queue_id = q.id)::float8 FROM queen.queues q", &[])
        .await?;
    let done = std::mem::take(&mut *walk.lock().expect("gauge walk"));
    let mut named: HashMap<i64, String> = HashMap::with_capacity(names.len());
    for r in &names {
        let (id, queue): (i64, String) = (r.get(0), r.get(1));
        let [partitions, messages, pending] = done.queues.get(&id).copied().unwrap_or_default();
        let labels = crate::tenancy::queue_labels(&queue);
        metrics::gauge!(QUEUE_PARTITIONS, labels.clone()).set(partitions);
        metrics::gauge!(QUEUE_MESSAGES, labels.clone()).set(messages);
        metrics::gauge!(QUEUE_PENDING, labels.clone()).set(pending);
        metrics::gauge!(QUEUE_DEAD_LETTERS, labels.clone()).set(r.get::<_, f64>(2));
        named.insert(id, queue);
    }
    for ((id, group), (messages, seconds)) in done.groups {
        // A queue deleted during the walk is not named: its series go.
        let Some(queue) = named.get(&id) else { continue };
        let mut labels = crate::tenancy::queue_labels(queue);
        labels.push(metrics::Label::new("group", group));
        metrics::gauge!(GROUP_LAG_MESSAGES, labels.clone()).set(messages);
        metrics::gauge!(GROUP_LAG_SECONDS, labels.clone()).set(seconds);
    }
    Ok(false)
}
