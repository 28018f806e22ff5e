//! The write of one segment, and what its answer means: the SQL the lanes
//! (`coalescer`) and the group commit (`group`) both call, the error both
//! report, and the decoding of a duplicate's original id.
//!
//! It sits below both: the coalescer hands segments to the group committer,
//! and both write through here, so the dependency runs one way
//! (coalescer → group → segment) and neither reaches into the other.

use uuid::Uuid;

use crate::db::DbError;
use crate::log::{compress_frames, decompress_frames, FrameReader, SEGMENT_LIMIT};

/// One segment, for any queue (`0002_push.sql`).
pub(super) const PUSH_SQL: &str = "SELECT * FROM queen.push_segment_v1($1, $2, $3, $4)";
/// The same for a queue known to keep a dedup window: push_segment_v1 only
/// looks the queue up again and hands such a segment to push_segment_dedup_v1 (40 of
/// its 180-200 µs a call at batch 1, docs/PERFORMANCE.md, stop 13).
pub(super) const PUSH_WINDOW_SQL: &str = "SELECT * FROM queen.push_segment_dedup_v1($1, $2, $3, $4)";

/// Why a push could not be committed. Nothing of the failed batch is written.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("the push was abandoned by its writer")]
    Lost,
    /// A client's compressed frames, valid when the request was read, did
    /// not read back the same (a bug, not bad input).
    #[error("the pushed frames could not be read back: {0}")]
    Unreadable(String),
}

impl PushError {
    /// PostgreSQL could not be reached at all (as opposed to refusing the
    /// write): the push may be spooled and replayed later.
    pub fn database_unreachable(&self) -> bool {
        match self {
            // A busy pool spools too: the push would otherwise fail.
            PushError::Db(DbError::Pool(_)) => true,
            PushError::Db(e) => e.unavailable(),
            _ => false,
        }
    }
}

/// What one call to `queen.push_segment_v1` did.
#[derive(Debug)]
pub enum SegmentWrite {
    Written { partition_id: i64, base_offset: i64, window: i32 },
    /// Nothing was written: these frames (index into the call, original
    /// message id) are already in the partition inside the dedup window.
    Duplicates { partition_id: i64, window: i32, dups: Vec<(usize, Uuid)> },
}

/// Compresses `frames` into one segment and appends it to (queue,
/// partition) on `client`: one round trip. The caller owns the transaction:
/// a transaction bundle commits it with its acks.
pub async fn write_segment(
    client: &impl deadpool_postgres::GenericClient,
    queue: &str,
    partition: &str,
    hashes: &[i64],
    frames: &[u8],
    zstd_level: i32,
) -> Result<SegmentWrite, DbError> {
    append_segment(client, queue, partition, hashes, &compress_frames(frames, zstd_level), None).await
}

/// Appends one compressed segment with `queen.push_segment_v1`, or straight
/// with `queen.push_segment_dedup_v1` when `window` (the queue's dedup window as
/// last reported) says the queue keeps one. A stale `window` costs nothing
/// but time: the dedup function serves any queue, and the plain one hands a
/// queue with a window to it.
pub(super) async fn append_segment(
    client: &impl deadpool_postgres::GenericClient,
    queue: &str,
    partition: &str,
    hashes: &[i64],
    blob: &[u8],
    window: Option<i32>,
) -> Result<SegmentWrite, DbError> {
    let sql = if keeps_window(window) { PUSH_WINDOW_SQL } else { PUSH_SQL };
    let stmt = client.prepare_cached(sql).await?;
    let rows = client.query(&stmt, &[&queue, &partition, &hashes, &blob]).await?;
    let first = rows.first().ok_or_else(|| DbError::Unexpected("the segment write returned no row".into()))?;
    let window: i32 = first.get("o_window");
    let partition_id: i64 = first.get("o_partition_id");
    if first.get::<_, Option<i32>>("o_dup_index").is_none() {
        metrics::histogram!(crate::metrics::SEGMENT_MESSAGES).record(hashes.len() as f64);
        return Ok(SegmentWrite::Written { partition_id, base_offset: first.get("o_base_offset"), window });
    }
    let dups = rows.iter().map(|row| (row.get::<_, i32>("o_dup_index") as usize, original_id(row))).collect();
    Ok(SegmentWrite::Duplicates { partition_id, window, dups })
}

/// Whether a queue's last reported dedup window says it keeps an index.
pub(super) fn keeps_window(window: Option<i32>) -> bool {
    window.is_some_and(|w| w > 0)
}

/// The message id of frame `index` of a stored segment.
pub(super) fn message_id_at(blob: &[u8], index: i64) -> Option<Uuid> {
    let frames = decompress_frames(blob, SEGMENT_LIMIT).ok()?;
    let index = usize::try_from(index).ok()?;
    FrameReader::new(&frames).nth(index)?.ok().map(|f| f.message_id)
}

/// The original message id a duplicate row points at (nil when its segment
/// is gone).
pub(super) fn original_id(row: &tokio_postgres::Row) -> Uuid {
    let offset: i64 = row.get("o_dup_offset");
    let seg_base: Option<i64> = row.get("o_seg_base");
    let seg_blob: Option<&[u8]> = row.get("o_seg_blob");
    match (seg_base, seg_blob) {
        (Some(b), Some(blob)) => message_id_at(blob, offset - b).unwrap_or_else(Uuid::nil),
        _ => Uuid::nil(),
    }
}
