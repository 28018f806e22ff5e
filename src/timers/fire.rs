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

use std::collections::HashMap;

use serde_json::value::RawValue;

use crate::db::DbError;
use crate::push::segment::SegmentWrite;
use crate::push::validate::PushItem;
use crate::push::PushPlan;

/// A (queue, partition id, partition, messages) the tick pushed.
pub type Pushed = (String, i64, String, u64);

/// Fires up to `batch` due timers; `(fired, more may be due)`.
pub async fn tick(
    pool: &deadpool_postgres::Pool,
    coalescer: &crate::push::Coalescer,
    batch: i64,
) -> Result<(Vec<Pushed>, bool), DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let rows = tx
        .query(
            "SELECT queue, timer_key, partition, payload, txn, message_id, producer_sub FROM queen.timers
             WHERE deliver_at <= now() ORDER BY deliver_at LIMIT $1 FOR UPDATE SKIP LOCKED",
            &[&batch],
        )
        .await?;
    if rows.is_empty() {
        return Ok((Vec::new(), false));
    }
    struct Due {
        queue: String,
        partition: String,
        payload: Box<RawValue>,
        txn: String,
        message_id: uuid::Uuid,
    }
    // Timers of one producer are pushed together: the producer is stamped
    // per call (almost always one group).
    let mut by_producer: HashMap<Option<String>, Vec<Due>> = HashMap::new();
    let (mut queues, mut keys) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    for r in &rows {
        queues.push(r.get::<_, String>(0));
        keys.push(r.get::<_, String>(1));
        let payload = RawValue::from_string(r.get::<_, String>(3)).unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"));
        by_producer.entry(r.get(6)).or_default().push(Due {
            queue: r.get(0),
            partition: r.get(2),
            payload,
            txn: r.get(4),
            message_id: r.get(5),
        });
    }
    let mut pushed = Vec::new();
    for (producer, due) in &by_producer {
        let items: Vec<PushItem<'_>> = due
            .iter()
            .map(|d| PushItem {
                queue: d.queue.as_str().into(),
                partition: d.partition.as_str().into(),
                transaction_id: Some(d.txn.as_str().into()),
                trace_id: None,
                payload: d.payload.get(),
                message_id: Some(d.message_id),
            })
            .collect();
        let plan = PushPlan::new(&items, producer.as_deref(), coalescer.encryption()).map_err(|e| DbError::Unexpected(e.to_string()))?;
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
                match coalescer.write_in(&tx, &g.queue, &g.partition, &hashes, &frames).await? {
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
    }
    tx.execute(
        "DELETE FROM queen.timers t USING unnest($1::text[], $2::text[]) AS d (queue, timer_key)
         WHERE t.queue = d.queue AND t.timer_key = d.timer_key",
        &[&queues, &keys],
    )
    .await?;
    tx.commit().await?;
    Ok((pushed, rows.len() as i64 >= batch))
}
