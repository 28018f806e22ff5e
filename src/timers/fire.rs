//! The fire service: due timers become messages, exactly once.
//!
//! One tick is one PostgreSQL transaction: it locks up to a batch of due
//! timers with `FOR UPDATE SKIP LOCKED` (so brokers firing at the same time
//! take disjoint rows), pushes them through the transaction push path (the
//! same `Coalescer::write_in` a transaction bundle uses: frames, dedup, gap-free
//! offsets, envelopes for an encrypting queue), deletes them, and commits.
//! A crash before the commit leaves every timer of the batch to fire again;
//! after it, none is left. A timer whose `txn` is already in its partition
//! inside the dedup window (a schedule retried after its first copy fired)
//! is dropped, not delivered twice. After the commit the pushed partitions
//! wake their long-polls like any push.
//!
//! One bad timer does not hold back the others (issue 45): when a batch
//! fails, it is written again timer by timer, each under its own savepoint,
//! and a timer that fails (a payload that is not JSON, a write refused) is
//! rolled back to it alone. Its timers stay, with `attempts` counted,
//! `last_error` said and `deliver_at` pushed back ([`retry_delay`]); after
//! [`MAX_ATTEMPTS`] a timer is parked (`deliver_at` 9999-12-31, visible
//! with its error through `GET /api/v1/timers/…`; a reschedule revives it),
//! the timers' dead-letter state: its queue may not exist, so it cannot
//! join the queue's dead letters. A lost connection still fails the whole
//! tick, to run again.

use std::collections::HashMap;

use serde_json::value::RawValue;

use crate::db::DbError;
use crate::push::segment::SegmentWrite;
use crate::push::validate::PushItem;
use crate::push::PushPlan;

/// A (queue, partition id, partition, messages) the tick pushed.
pub type Pushed = (String, i64, String, u64);

/// Failed fires before a timer is parked.
pub const MAX_ATTEMPTS: i32 = 10;

/// How long a timer whose fire failed `attempts` times waits: 1 s, 2 s,
/// 4 s … at most 256 s.
pub fn retry_delay(attempts: i32) -> std::time::Duration {
    std::time::Duration::from_secs(1u64 << attempts.clamp(0, 8))
}

/// How a failed fire counts against its timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// One more attempt.
    Counted,
    /// It can never fire (its payload is not JSON): parked at once.
    Hopeless,
    /// Not the timer's doing (this broker has no key for its queue).
    NotCounted,
}

impl Failure {
    /// The word `record_failures`' statement reads.
    fn sql(self) -> &'static str {
        match self {
            Failure::Counted => "counted",
            Failure::Hopeless => "hopeless",
            Failure::NotCounted => "not counted",
        }
    }
}

/// Why one group's fire failed.
#[derive(Debug, thiserror::Error)]
enum FireError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    NoKey(#[from] crate::crypto::NoKeyToSeal),
}

/// A due timer, as the tick read it.
struct Due {
    queue: String,
    key: String,
    partition: String,
    payload: String,
    txn: String,
    message_id: uuid::Uuid,
    producer: Option<String>,
    /// Its payload was sealed (its due time is `sealed_due_at`).
    sealed: bool,
}

/// Fires up to `batch` due timers; `(fired, more may be due)`.
///
/// The batch is first written whole, as one transaction without
/// savepoints, a segment per partition (the common case). Only when that
/// fails is it written again timer by timer, each under its savepoint, so
/// the failure stays with the timer that caused it.
pub async fn tick(
    pool: &deadpool_postgres::Pool,
    coalescer: &crate::push::Coalescer,
    batch: i64,
) -> Result<(Vec<Pushed>, bool), DbError> {
    match fire_batch(pool, coalescer, batch, false).await? {
        Some(done) => Ok(done),
        None => fire_batch(pool, coalescer, batch, true).await?.ok_or_else(|| DbError::Unexpected("an isolating fire pass gave up".into())),
    }
}

/// One pass of [`tick`]: None when a group failed and `isolate` was off
/// (nothing committed: the caller runs the isolating pass).
async fn fire_batch(
    pool: &deadpool_postgres::Pool,
    coalescer: &crate::push::Coalescer,
    batch: i64,
    isolate: bool,
) -> Result<Option<(Vec<Pushed>, bool)>, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    // A broker without a key leaves sealed timers alone (their deliver_at
    // is the far future): taking them only to put them back would keep
    // pushing their due time past the brokers that can fire them.
    let due_sql = if coalescer.encryption().ring().is_some() {
        "SELECT queue, timer_key, partition, payload, txn, message_id, producer_sub, sealed FROM queen.timers
         WHERE deliver_at <= now() OR sealed_due_at <= now()
         ORDER BY COALESCE(sealed_due_at, deliver_at) LIMIT $1 FOR UPDATE SKIP LOCKED"
    } else {
        "SELECT queue, timer_key, partition, payload, txn, message_id, producer_sub, sealed FROM queen.timers
         WHERE deliver_at <= now()
         ORDER BY deliver_at LIMIT $1 FOR UPDATE SKIP LOCKED"
    };
    let rows = tx.query(due_sql, &[&batch]).await?;
    if rows.is_empty() {
        return Ok(Some((Vec::new(), false)));
    }
    // One group per (producer, queue, partition): the unit that succeeds
    // or fails together (one segment write).
    let mut groups: HashMap<(Option<String>, String, String), Vec<Due>> = HashMap::new();
    // Sealed payloads that do not open: set aside like a failed write.
    let mut unopened: Vec<(Due, String, Failure)> = Vec::new();
    for r in &rows {
        let mut due = Due {
            queue: r.get(0),
            key: r.get(1),
            partition: r.get(2),
            payload: r.get(3),
            txn: r.get(4),
            message_id: r.get(5),
            producer: r.get(6),
            sealed: false,
        };
        if let Some(env) = r.get::<_, Option<&[u8]>>(7) {
            due.sealed = true;
            match super::open_sealed(coalescer.encryption().ring(), env, &due.message_id) {
                Ok(plain) => due.payload = plain,
                Err(e) => {
                    // Without the key a broker with it will fire it; a
                    // corrupt envelope never opens.
                    let how = if matches!(e, crate::crypto::OpenError::NoKey | crate::crypto::OpenError::UnknownKey(_)) { Failure::NotCounted } else { Failure::Hopeless };
                    unopened.push((due, format!("sealed payload: {e}"), how));
                    continue;
                }
            }
        }
        groups.entry((due.producer.clone(), due.queue.clone(), due.partition.clone())).or_default().push(due);
    }
    let (mut fired_queues, mut fired_keys) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    let mut failed: Vec<(&Due, String, Failure)> = unopened.iter().map(|(d, e, how)| (d, e.clone(), *how)).collect();
    let mut pushed = Vec::new();
    for ((producer, _, _), due) in &groups {
        // A payload that is not JSON can never fire: parked at once.
        let (good, bad): (Vec<&Due>, Vec<&Due>) = due.iter().partition(|d| serde_json::from_str::<&RawValue>(&d.payload).is_ok());
        failed.extend(bad.into_iter().map(|d| (d, "payload is not JSON".to_string(), Failure::Hopeless)));
        if good.is_empty() {
            continue;
        }
        // The fast pass writes the group as one segment; the isolating
        // pass writes each timer under its own savepoint, in order, so a bad
        // one fails alone (a group shares its partition, so a failure of
        // the group's write cannot say which timer caused it).
        let units: Vec<&[&Due]> = if isolate { good.chunks(1).collect() } else { vec![&good[..]] };
        for unit in units {
            if isolate {
                tx.batch_execute("SAVEPOINT timer_group").await?;
            }
            match fire_group(&tx, coalescer, producer.as_deref(), unit).await {
                Ok(p) => {
                    if isolate {
                        tx.batch_execute("RELEASE SAVEPOINT timer_group").await?;
                    }
                    pushed.extend(p);
                    fired_queues.extend(unit.iter().map(|d| d.queue.clone()));
                    fired_keys.extend(unit.iter().map(|d| d.key.clone()));
                }
                // The connection or the database is gone: the whole tick again.
                Err(FireError::Db(e)) if e.met_by_all() => return Err(e),
                // The transaction is aborted: dropped (rolled back), written again timer by timer.
                Err(_) if !isolate => return Ok(None),
                Err(e) => {
                    tx.batch_execute("ROLLBACK TO SAVEPOINT timer_group").await?;
                    // Without the key it is not the timer's fault: a broker
                    // with the key fires it. Pushed back, not counted.
                    let how = if matches!(e, FireError::NoKey(_)) { Failure::NotCounted } else { Failure::Counted };
                    failed.extend(unit.iter().map(|d| (*d, e.to_string(), how)));
                }
            }
        }
    }
    if !fired_queues.is_empty() {
        tx.execute(
            "DELETE FROM queen.timers t USING unnest($1::text[], $2::text[]) AS d (queue, timer_key)
             WHERE t.queue = d.queue AND t.timer_key = d.timer_key",
            &[&fired_queues, &fired_keys],
        )
        .await?;
    }
    record_failures(&tx, &failed).await?;
    tx.commit().await?;
    Ok(Some((pushed, rows.len() as i64 >= batch)))
}

/// Writes one group's timers as messages of their partition.
async fn fire_group(
    tx: &deadpool_postgres::Transaction<'_>,
    coalescer: &crate::push::Coalescer,
    producer: Option<&str>,
    due: &[&Due],
) -> Result<Vec<Pushed>, FireError> {
    let items: Vec<PushItem<'_>> = due
        .iter()
        .map(|d| PushItem {
            queue: d.queue.as_str().into(),
            partition: d.partition.as_str().into(),
            transaction_id: Some(d.txn.as_str().into()),
            trace_id: None,
            payload: &d.payload,
            message_id: Some(d.message_id),
        })
        .collect();
    let plan = PushPlan::new(&items, producer, coalescer.encryption(), coalescer.hasher_in(tx).await?)?;
    let mut pushed = Vec::new();
    for g in &plan.groups {
        let mut leaders = g.leaders.clone();
        // Each round drops what the partition already holds; bounded by
        // the group's size.
        while !leaders.is_empty() {
            let mut frames = Vec::new();
            for &idx in &leaders {
                plan.frame(&items, idx).encode_into(&mut frames).map_err(|e| DbError::Unexpected(e.to_string()))?;
            }
            let hashes: Vec<i64> = leaders.iter().map(|&i| plan.hashes[i]).collect();
            match coalescer.write_in(tx, &g.queue, &g.partition, &hashes, &frames).await? {
                SegmentWrite::Written { partition_id, .. } => {
                    pushed.push((g.queue.clone(), partition_id, g.partition.clone(), leaders.len() as u64));
                    break;
                }
                SegmentWrite::Duplicates { dups, .. } => {
                    let gone: Vec<usize> = dups.iter().map(|(i, _)| leaders[*i]).collect();
                    tracing::info!(queue = %g.queue, partition = %g.partition, timers = gone.len(),
                                   "timers whose txn is already in the partition: dropped, not delivered twice");
                    leaders.retain(|l| !gone.contains(l));
                }
            }
        }
    }
    Ok(pushed)
}

/// Counts a failed fire on each timer, says why, and pushes it back
/// ([`retry_delay`]); parks it after [`MAX_ATTEMPTS`] or when it can never
/// fire.
async fn record_failures(tx: &deadpool_postgres::Transaction<'_>, failed: &[(&Due, String, Failure)]) -> Result<(), DbError> {
    for (d, error, how) in failed {
        let attempts: i32 = tx
            .query_one(
                "UPDATE queen.timers SET attempts = CASE $3::text WHEN 'hopeless' THEN $5 WHEN 'counted' THEN attempts + 1 ELSE attempts END,
                        last_error = $4, updated_at = now()
                 WHERE queue = $1 AND timer_key = $2 RETURNING attempts",
                &[&d.queue, &d.key, &how.sql(), error, &MAX_ATTEMPTS],
            )
            .await?
            .get(0);
        let parked = attempts >= MAX_ATTEMPTS;
        let delay_ms = retry_delay(attempts).as_millis() as i64;
        // A sealed timer's due time is `sealed_due_at` (its `deliver_at`
        // stays in the far future, out of an older broker's sight).
        let column = if d.sealed { "sealed_due_at" } else { "deliver_at" };
        tx.execute(
            &format!(
                "UPDATE queen.timers SET {column} = CASE WHEN $3 THEN timestamptz '9999-12-31 00:00:00+00' ELSE now() + $4::bigint * interval '1 millisecond' END
                 WHERE queue = $1 AND timer_key = $2"
            ),
            &[&d.queue, &d.key, &parked, &delay_ms],
        )
        .await?;
        metrics::counter!("queen_timer_fire_failures_total").increment(1);
        if parked {
            tracing::error!(queue = %d.queue, timer_key = %d.key, attempts, error = %error, "a timer could not fire and is parked (GET /api/v1/timers shows it; a reschedule revives it)");
        } else {
            tracing::warn!(queue = %d.queue, timer_key = %d.key, attempts, error = %error, "a timer could not fire; it is retried later");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_timer_waits_longer_each_time_up_to_five_minutes() {
        let secs: Vec<u64> = [0, 1, 2, 3, 8, 9, 30, i32::MAX].iter().map(|&a| retry_delay(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 256, 256, 256, 256]);
    }
}
