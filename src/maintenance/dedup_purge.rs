//! The dedup-window purge: transaction-index entries older than their queue's
//! `dedupWindowSeconds` go, so the index stays as large as the windows, not
//! the history.
//!
//! The index has no time column worth indexing (it is the one per-message
//! row), so the purge walks *segments* by age instead: per queue, from where
//! it stopped, through segments that left the window, decoding each to learn
//! its transactionIds and deleting exactly those entries (still pointing into
//! that segment). The cost follows the messages purged, not the table.
//! Queues with a window of 0 keep their entries, which acks resolve through.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;

use crate::db::DbError;
use crate::log::{decompress_frames, FrameReader, SEGMENT_LIMIT};
use crate::push::coalescer::txn_hash;

const SERVICE: &str = "dedup_purge";

/// Queues with a window and at least one segment past their cursor that has
/// left the window: the work of this tick, found in one statement. Asking
/// each queue in turn cost one round trip per queue per tick, which with
/// 10,000 idle queues was most of an idle broker's CPU (docs/PERFORMANCE.md).
const DUE_QUEUES_SQL: &str = "
    SELECT q.id, q.dedup_window_seconds, c.at, c.partition_id, c.base_offset
    FROM queen.queues q
    LEFT JOIN queen.maintenance_cursors m ON m.queue_id = q.id AND m.service = $1
    CROSS JOIN LATERAL (SELECT COALESCE(m.at, 'epoch'::timestamptz) AS at, COALESCE(m.partition_id, 0) AS partition_id,
                               COALESCE(m.base_offset, -1) AS base_offset) c
    WHERE q.dedup_window_seconds > 0
      AND EXISTS (SELECT 1 FROM queen.partitions p JOIN queen.segments s ON s.partition_id = p.id
                  WHERE p.queue_id = q.id
                    AND s.created_at < now() - make_interval(secs => q.dedup_window_seconds)
                    AND (s.created_at, s.partition_id, s.base_offset) > (c.at, c.partition_id, c.base_offset))";

/// One pass over every queue with purge work due, at most `batch` segments
/// each. `Ok(true)` when some queue filled its batch.
pub async fn tick(pool: &Pool, batch: i64) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let due = client.prepare_cached(DUE_QUEUES_SQL).await?;
    let queues = client.query(&due, &[&SERVICE]).await?;
    let mut more = false;
    for q in queues {
        let (qid, window): (i64, i32) = (q.get(0), q.get(1));
        let cursor: (DateTime<Utc>, i64, i64) = (q.get(2), q.get(3), q.get(4));
        let select = client
            .prepare_cached(
                "SELECT s.created_at, s.partition_id, s.base_offset, s.end_offset, s.blob
                 FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
                 WHERE p.queue_id = $1
                   AND s.created_at < now() - make_interval(secs => $2::integer)
                   AND (s.created_at, s.partition_id, s.base_offset) > ($3, $4, $5)
                 ORDER BY s.created_at, s.partition_id, s.base_offset
                 LIMIT $6",
            )
            .await?;
        let segments = client.query(&select, &[&qid, &window, &cursor.0, &cursor.1, &cursor.2, &batch]).await?;
        let Some(last) = segments.last() else { continue };
        let last: (DateTime<Utc>, i64, i64) = (last.get(0), last.get(1), last.get(2));
        more |= segments.len() as i64 >= batch;
        for s in &segments {
            let (pid, base, end): (i64, i64, i64) = (s.get(1), s.get(2), s.get(3));
            let Ok(frames) = decompress_frames(s.get::<_, &[u8]>(4), SEGMENT_LIMIT) else { continue };
            let hashes: Vec<i64> = FrameReader::new(&frames).filter_map(Result::ok).map(|f| txn_hash(f.transaction_id)).collect();
            client
                .execute(
                    "DELETE FROM queen.txn_index WHERE partition_id = $1 AND txn_hash = ANY ($2) AND msg_offset BETWEEN $3 AND $4",
                    &[&pid, &hashes, &base, &end],
                )
                .await?;
        }
        client
            .execute(
                "INSERT INTO queen.maintenance_cursors (queue_id, service, at, partition_id, base_offset)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (queue_id, service) DO UPDATE
                 SET at = EXCLUDED.at, partition_id = EXCLUDED.partition_id, base_offset = EXCLUDED.base_offset",
                &[&qid, &SERVICE, &last.0, &last.1, &last.2],
            )
            .await?;
    }
    Ok(more)
}
