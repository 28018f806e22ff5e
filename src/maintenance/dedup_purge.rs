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
use crate::log::{decompress_frames, FrameReader};
use crate::push::coalescer::txn_hash;

const SERVICE: &str = "dedup_purge";

/// One pass over every queue with a window, at most `batch` segments each.
/// `Ok(true)` when some queue filled its batch.
pub async fn tick(pool: &Pool, batch: i64) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let queues = client
        .query(
            "SELECT q.id, q.dedup_window_seconds, COALESCE(m.at, 'epoch'::timestamptz), COALESCE(m.partition_id, 0), COALESCE(m.base_offset, -1)
             FROM queen.queues q
             LEFT JOIN queen.maintenance_cursors m ON m.queue_id = q.id AND m.service = $1
             WHERE q.dedup_window_seconds > 0",
            &[&SERVICE],
        )
        .await?;
    let mut more = false;
    for q in queues {
        let (qid, window): (i64, i32) = (q.get(0), q.get(1));
        let cursor: (DateTime<Utc>, i64, i64) = (q.get(2), q.get(3), q.get(4));
        let segments = client
            .query(
                "SELECT s.created_at, s.partition_id, s.base_offset, s.end_offset, s.blob
                 FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
                 WHERE p.queue_id = $1
                   AND s.created_at < now() - make_interval(secs => $2::integer)
                   AND (s.created_at, s.partition_id, s.base_offset) > ($3, $4, $5)
                 ORDER BY s.created_at, s.partition_id, s.base_offset
                 LIMIT $6",
                &[&qid, &window, &cursor.0, &cursor.1, &cursor.2, &batch],
            )
            .await?;
        let Some(last) = segments.last() else { continue };
        let last: (DateTime<Utc>, i64, i64) = (last.get(0), last.get(1), last.get(2));
        more |= segments.len() as i64 >= batch;
        for s in &segments {
            let (pid, base, end): (i64, i64, i64) = (s.get(1), s.get(2), s.get(3));
            let Ok(frames) = decompress_frames(s.get::<_, &[u8]>(4), 256 << 20) else { continue };
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
