//! The dedup-window purge: transaction-index entries older than their queue's
//! `dedupWindowSeconds` go, so the index stays as large as the windows, not
//! the history.
//!
//! The index has no time column worth indexing (it is the one per-message
//! row), so the purge walks *segments* instead: per partition, from its mark
//! (`queen.dedup_purge_marks`, 0001_schema.sql) through the segments that left
//! the window, decoding each to learn its transactionIds and deleting exactly
//! those entries. A partition's segments are created in offset order, so what
//! is due is a prefix from the mark, and the mark remembers when the first
//! segment not yet purged was made. Finding the work reads partitions and
//! marks, never the segments, so a tick costs what is due plus one row per
//! partition, not the stored history. A tick is one statement when nothing is
//! due, and five however many partitions it serves. Queues with a window of 0
//! keep their entries, which acks resolve through.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;

use super::index_entries::Doomed;
use crate::db::DbError;

/// Segments of one partition looked at per tick (one more tells whether the
/// due prefix goes on); a partition with more due is looked at again at once.
const HEAD: i64 = 32;

/// The due partitions of the next window of the walk (`QUEEN_MAINTENANCE_WINDOW`
/// partitions in id order from where the last tick stopped; finding them read
/// every partition of a windowed queue each tick, 0.5-0.7 s of PostgreSQL
/// every 5 s at 1,000,000 partitions, issue 51): windowed queues,
/// segments past the mark, and the oldest of them out of the window as it
/// is now, or not known. A partition without a mark has none older than
/// itself, so it is not due before its own creation leaves the window:
/// 100,000 new partitions would otherwise be marked a batch per tick, each
/// tick scanning further for the unmarked. Always one row at least: the
/// window's last id and size, with the due partitions (none: NULLs) beside.
const DUE_SQL: &str = "
    WITH w AS MATERIALIZED (
        SELECT p.id, p.queue_id, p.last_offset, p.created_at FROM queen.partitions p
        WHERE p.id > $2 ORDER BY p.id LIMIT $3)
    SELECT e.edge, e.seen, d.id, d.mark, d.last_offset, d.win
    FROM (SELECT max(w.id) AS edge, count(*) AS seen FROM w) e
    LEFT JOIN LATERAL (
        SELECT w.id, COALESCE(m.purged_below, 0) AS mark, w.last_offset, q.dedup_window_seconds AS win
        FROM w
        JOIN queen.queues q ON q.id = w.queue_id
        LEFT JOIN queen.dedup_purge_marks m ON m.partition_id = w.id
        WHERE q.dedup_window_seconds > 0
          AND w.last_offset >= COALESCE(m.purged_below, 0)
          AND (m.partition_id IS NOT NULL AND m.oldest_at IS NULL
               OR COALESCE(m.oldest_at, w.created_at) < now() - make_interval(secs => q.dedup_window_seconds))
        ORDER BY w.id
        LIMIT $1) d ON true";

/// The head of each due partition past its mark, without blobs: offsets,
/// whether each segment left the window, and when it was made, in (partition,
/// offset) order.
const HEAD_SQL: &str = "
    SELECT d.pid, h.base_offset, h.end_offset, h.due, h.created_at
    FROM unnest($1::bigint[], $2::bigint[], $3::integer[]) d (pid, mark, win)
    CROSS JOIN LATERAL (
        SELECT s.base_offset, s.end_offset, s.created_at < now() - make_interval(secs => d.win) AS due, s.created_at
        FROM queen.segments s
        WHERE s.partition_id = d.pid AND s.base_offset >= d.mark
        ORDER BY s.base_offset
        LIMIT $4) h
    ORDER BY d.pid, h.base_offset";

/// The blobs of the ranges being purged, each with its range.
const BLOBS_SQL: &str = "
    SELECT s.partition_id, r.lo, r.hi, s.blob
    FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) r (pid, lo, hi)
    JOIN queen.segments s ON s.partition_id = r.pid AND s.base_offset BETWEEN r.lo AND r.hi
    WHERE s.txn_hashes IS NULL";

const MARK_SQL: &str = "
    INSERT INTO queen.dedup_purge_marks (partition_id, purged_below, oldest_at)
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[])
    ON CONFLICT (partition_id) DO UPDATE SET purged_below = EXCLUDED.purged_below, oldest_at = EXCLUDED.oldest_at";

/// What a tick decided for one partition.
#[derive(Debug, PartialEq)]
struct Plan {
    pid: i64,
    /// Offsets whose entries go: first base offset ..= last end offset.
    purge: Option<(i64, i64)>,
    purged_below: i64,
    oldest_at: Option<DateTime<Utc>>,
    /// More of it is due than this tick takes.
    more: bool,
}

/// One head row: (base_offset, end_offset, left the window, created_at).
type HeadRow = (i64, i64, bool, DateTime<Utc>);

/// Plans one partition from its head (offset order, at most `HEAD` rows).
/// `budget` is how many segments the tick may still take.
fn plan(pid: i64, mark: i64, last_offset: i64, head: &[HeadRow], budget: usize) -> Plan {
    let limit = (HEAD as usize - 1).min(budget);
    let taken = head.iter().take(limit).take_while(|r| r.2).count();
    let next = head.get(taken);
    match (taken, next) {
        // Nothing left past the mark (retention took it): everything up to the
        // end the due check saw is done; new writes come after it.
        (0, None) => Plan { pid, purge: None, purged_below: last_offset + 1, oldest_at: None, more: false },
        (0, Some(n)) => Plan { pid, purge: None, purged_below: mark, oldest_at: (!n.2).then_some(n.3), more: n.2 },
        _ => {
            let end = head[taken - 1].1;
            // The next one, when it has left the window too, is looked at again
            // at once (oldest_at unknown).
            let oldest_at = next.filter(|n| !n.2).map(|n| n.3);
            Plan { pid, purge: Some((head[0].0, end)), purged_below: end + 1, oldest_at, more: next.is_some_and(|n| n.2) }
        }
    }
}

/// One pass over the next `window` partitions of the walk (`walk`: the last
/// partition id looked at; 0 starts over): at most `batch` due partitions and `batch`
/// segments in all. `Ok(true)` when more work is due at once.
pub async fn tick(pool: &Pool, batch: i64, walk: &AtomicI64, window: i64) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let due = client.prepare_cached(DUE_SQL).await?;
    let rows = client.query(&due, &[&batch, &walk.load(Ordering::Relaxed), &window]).await?;
    let (edge, seen): (Option<i64>, i64) = rows.first().map_or((None, 0), |r| (r.get(0), r.get(1)));
    // Where the next tick starts, unless this one leaves work behind: the
    // window's end, or the first partition again when it was the last.
    walk.store(if seen < window { 0 } else { edge.unwrap_or(0) }, Ordering::Relaxed);
    let partitions: Vec<&tokio_postgres::Row> = rows.iter().filter(|r| r.get::<_, Option<i64>>(2).is_some()).collect();
    if partitions.is_empty() {
        return Ok(false);
    }
    let (pids, marks, windows): (Vec<i64>, Vec<i64>, Vec<i32>) =
        (partitions.iter().map(|r| r.get(2)).collect(), partitions.iter().map(|r| r.get(3)).collect(), partitions.iter().map(|r| r.get(5)).collect());
    let head = client.prepare_cached(HEAD_SQL).await?;
    let mut heads: HashMap<i64, Vec<HeadRow>> = HashMap::new();
    for r in client.query(&head, &[&pids, &marks, &windows, &HEAD]).await? {
        heads.entry(r.get(0)).or_default().push((r.get(1), r.get(2), r.get(3), r.get(4)));
    }
    let mut budget = batch.max(1) as usize;
    let mut plans: Vec<Plan> = Vec::new();
    for d in &partitions {
        let (pid, mark, last): (i64, i64, i64) = (d.get(2), d.get(3), d.get(4));
        let head = heads.get(&pid).map_or(&[][..], Vec::as_slice);
        let p = plan(pid, mark, last, head, budget);
        if let Some((lo, hi)) = p.purge {
            budget = budget.saturating_sub(head.iter().filter(|r| r.0 >= lo && r.1 <= hi).count());
        }
        plans.push(p);
    }
    let more = partitions.len() as i64 >= batch || plans.iter().any(|p| p.more);
    // Work left in this window: the next tick starts before the first
    // partition with more due, or past the last one this tick served.
    if let Some(p) = plans.iter().find(|p| p.more) {
        walk.store(p.pid - 1, Ordering::Relaxed);
    } else if partitions.len() as i64 >= batch {
        walk.store(pids[pids.len() - 1], Ordering::Relaxed);
    }

    let ranges: Vec<(i64, i64, i64)> = plans.iter().filter_map(|p| p.purge.map(|(lo, hi)| (p.pid, lo, hi))).collect();
    if !ranges.is_empty() {
        let (pids, los, his): (Vec<i64>, Vec<i64>, Vec<i64>) =
            (ranges.iter().map(|r| r.0).collect(), ranges.iter().map(|r| r.1).collect(), ranges.iter().map(|r| r.2).collect());
        let blobs = client.prepare_cached(BLOBS_SQL).await?;
        let mut doomed = Doomed::default();
        for s in client.query(&blobs, &[&pids, &los, &his]).await? {
            doomed.add_segment(&client, s.get(0), s.get(1), s.get(2), s.get(3)).await?;
        }
        doomed.delete(&client).await?;
    }
    let pids: Vec<i64> = plans.iter().map(|p| p.pid).collect();
    let below: Vec<i64> = plans.iter().map(|p| p.purged_below).collect();
    let oldest: Vec<Option<DateTime<Utc>>> = plans.iter().map(|p| p.oldest_at).collect();
    let mark = client.prepare_cached(MARK_SQL).await?;
    client.execute(&mark, &[&pids, &below, &oldest]).await?;
    Ok(more)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).unwrap()
    }

    #[test]
    fn the_due_prefix_is_purged_and_the_first_young_segment_dates_the_mark() {
        let head = [(0, 9, true, at(1)), (10, 19, true, at(2)), (20, 29, false, at(3)), (30, 39, true, at(4))];
        let p = plan(7, 0, 39, &head, 100);
        assert_eq!(p, Plan { pid: 7, purge: Some((0, 19)), purged_below: 20, oldest_at: Some(at(3)), more: false });
    }

    #[test]
    fn nothing_due_keeps_the_mark_and_dates_it() {
        let p = plan(7, 20, 29, &[(20, 29, false, at(3))], 100);
        assert_eq!(p, Plan { pid: 7, purge: None, purged_below: 20, oldest_at: Some(at(3)), more: false });
    }

    #[test]
    fn nothing_past_the_mark_moves_it_past_the_last_offset() {
        let p = plan(7, 20, 45, &[], 100);
        assert_eq!(p, Plan { pid: 7, purge: None, purged_below: 46, oldest_at: None, more: false });
    }

    #[test]
    fn a_due_prefix_longer_than_the_budget_asks_for_another_pass_at_once() {
        let head: Vec<HeadRow> = (0..HEAD).map(|k| (k * 10, k * 10 + 9, true, at(k))).collect();
        let p = plan(7, 0, 10_000, &head, 100);
        assert_eq!((p.purge, p.purged_below, p.oldest_at, p.more), (Some((0, (HEAD - 2) * 10 + 9)), (HEAD - 1) * 10, None, true));
        let p = plan(7, 0, 10_000, &head, 2);
        assert_eq!((p.purge, p.purged_below, p.oldest_at, p.more), (Some((0, 19)), 20, None, true));
        let p = plan(7, 0, 10_000, &head, 0);
        assert_eq!((p.purge, p.purged_below, p.oldest_at, p.more), (None, 0, None, true));
    }
}
