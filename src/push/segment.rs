//! The write of one segment, and what its answer means: the SQL the lanes
//! (`coalescer`) and the group commit (`group`) both call, the error both
//! report, and the decoding of a duplicate's original id.
//!
//! It sits below both: the coalescer hands segments to the group committer,
//! and both write through here, so the dependency runs one way
//! (coalescer → group → segment) and neither reaches into the other.
//!
//! Two functions write segments: `queen.push_segment_without_window_v1` for
//! a lone segment of a queue known to keep no dedup window, and
//! `queen.push_segments_of_queues_v1` for any other (a window, a queue not
//! yet known, or several segments of any queues together), which checks
//! what the broker's dedup memory does not cover and answers what it needs
//! (`push::dedup`).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::dedup::{Answer, Known, Segment};
use crate::db::DbError;
use crate::log::{decompress_frames, FrameReader, SEGMENT_LIMIT};

/// One segment of a queue without a dedup window (`0022_push_function_names.sql`).
pub(super) const PUSH_SQL: &str = "SELECT * FROM queen.push_segment_without_window_v1($1, $2, $3, $4)";
/// Segments of any queues, one per partition, checked against each queue's
/// dedup window (`0034_push_across_queues.sql`).
pub(super) const PUSH_WITH_MEMORY_SQL: &str = "SELECT * FROM queen.push_segments_of_queues_v1($1, $2, $3, $4, $5, $6, $7, $8)";
/// Segments whose partitions the dedup memory covers, in one statement; a
/// segment whose partition is no longer what the memory says is passed over
/// (`0045_push_known_segments.sql`).
const PUSH_KNOWN_SQL: &str = "SELECT * FROM queen.push_known_segments_v1($1, $2, $3, $4, $5, $6, $7)";
/// The segment at or below each offset, for a duplicate's original id, and
/// whether it is inside its queue's window now, by PostgreSQL's clock and
/// the window as it is now.
const ORIGINALS_SQL: &str = "
    SELECT s.base_offset, s.end_offset, s.blob,
           s.created_at > clock_timestamp() - make_interval(secs => q.dedup_window_seconds) AS inside
    FROM unnest($2::bigint[]) WITH ORDINALITY AS o (off, n)
    LEFT JOIN LATERAL (
        SELECT base_offset, end_offset, created_at, blob FROM queen.segments
        WHERE partition_id = $1 AND base_offset <= o.off ORDER BY base_offset DESC LIMIT 1) s ON true
    LEFT JOIN queen.partitions p ON p.id = $1
    LEFT JOIN queen.queues q ON q.id = p.queue_id
    ORDER BY o.n";

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
    /// A string that skipped its check at the edge (a bug, not bad input).
    #[error("a message could not be framed: {0}")]
    Frame(#[from] crate::log::FrameTooLong),
    /// The queue encrypts and this broker has no key (503, nothing written).
    #[error(transparent)]
    NoKey(crate::crypto::NoKeyToSeal),
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

/// What one call to `queen.push_segment_without_window_v1` did.
#[derive(Debug)]
pub enum SegmentWrite {
    Written { partition_id: i64, base_offset: i64, window: i32 },
    /// Nothing was written: these frames (index into the call, original
    /// message id) are already in the partition inside the dedup window.
    Duplicates { partition_id: i64, window: i32, dups: Vec<(usize, Uuid)> },
}

/// Appends one compressed segment of a queue without a dedup window with
/// `queen.push_segment_without_window_v1` (which hands a queue that has one to the dedup
/// path, so a stale hint costs time, not exactness).
pub(super) async fn append_segment(
    client: &impl deadpool_postgres::GenericClient,
    queue: &str,
    partition: &str,
    hashes: &[i64],
    blob: &[u8],
) -> Result<SegmentWrite, DbError> {
    let stmt = client.prepare_cached(PUSH_SQL).await?;
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

/// One segment of a `queen.push_segments_of_queues_v1` call.
pub(super) struct MemorySegment<'a> {
    pub queue: &'a str,
    pub partition: &'a str,
    pub hashes: &'a [i64],
    pub blob: &'a [u8],
    /// What the broker's dedup memory covers of the partition.
    pub known: Option<Known>,
}

/// What `queen.push_segments_of_queues_v1` did with one segment, and what it tells
/// the dedup memory.
#[derive(Debug)]
pub struct Appended {
    pub write: SegmentWrite,
    pub answer: Answer,
    /// created_at of the segment written (µs since the epoch).
    pub at_us: Option<i64>,
}

/// Appends segments of any queues, one per (queue, partition), with
/// `queen.push_segments_of_queues_v1`: one round trip. Each segment's outcome, in order.
pub(super) async fn append_with_memory(
    client: &impl deadpool_postgres::GenericClient,
    segments: &[MemorySegment<'_>],
) -> Result<Vec<Appended>, DbError> {
    let queues: Vec<&str> = segments.iter().map(|s| s.queue).collect();
    let partitions: Vec<&str> = segments.iter().map(|s| s.partition).collect();
    let counts: Vec<i32> = segments.iter().map(|s| s.hashes.len() as i32).collect();
    let blobs: Vec<&[u8]> = segments.iter().map(|s| s.blob).collect();
    let hashes: Vec<i64> = segments.iter().flat_map(|s| s.hashes.iter().copied()).collect();
    let known_pid: Vec<Option<i64>> = segments.iter().map(|s| s.known.map(|k| k.pid)).collect();
    let known: Vec<Option<i64>> = segments.iter().map(|s| s.known.map(|k| k.last)).collect();
    let known_window: Vec<Option<i32>> = segments.iter().map(|s| s.known.map(|k| k.window)).collect();
    let stmt = client.prepare_cached(PUSH_WITH_MEMORY_SQL).await?;
    let rows =
        client.query(&stmt, &[&queues, &partitions, &counts, &blobs, &hashes, &known_pid, &known, &known_window]).await?;
    // Per segment: what the memory learns, (base offset, created_at) if
    // written, and the duplicates.
    type Outcome = (Answer, Option<(i64, i64)>, Vec<(usize, Uuid)>);
    let mut out: Vec<Outcome> = segments.iter().map(|_| (Answer::default(), None, Vec::new())).collect();
    for row in &rows {
        let s = usize::try_from(row.get::<_, i32>("o_seg") - 1)
            .ok()
            .filter(|s| *s < segments.len())
            .ok_or_else(|| DbError::Unexpected("push_segments_of_queues_v1 named a segment it was not given".into()))?;
        let (answer, written, dups) = &mut out[s];
        answer.pid = row.get("o_partition_id");
        answer.window = row.get("o_window");
        answer.prev = row.get("o_prev");
        answer.log_start = row.get("o_log_start");
        if let Some(base) = row.get::<_, Option<i64>>("o_seen_base") {
            let at: DateTime<Utc> = row.get("o_seen_at");
            let hashes: Vec<i64> = row.get("o_seen_hashes");
            answer.seen.push(Segment { base, at_us: at.timestamp_micros(), hashes });
        } else if let Some(index) = row.get::<_, Option<i32>>("o_dup_index") {
            dups.push((index as usize, original_id(row)));
        } else {
            let at: DateTime<Utc> = row.get("o_created_at");
            *written = Some((row.get("o_base_offset"), at.timestamp_micros()));
        }
    }
    out.into_iter()
        .zip(segments)
        .map(|((answer, written, dups), seg)| {
            let (partition_id, window) = (answer.pid, answer.window);
            let (write, at_us) = match written {
                Some((base_offset, at)) => {
                    metrics::histogram!(crate::metrics::SEGMENT_MESSAGES).record(seg.hashes.len() as f64);
                    (SegmentWrite::Written { partition_id, base_offset, window }, Some(at))
                }
                None if !dups.is_empty() => (SegmentWrite::Duplicates { partition_id, window, dups }, None),
                None => return Err(DbError::Unexpected("push_segments_of_queues_v1 left a segment unanswered".into())),
            };
            Ok(Appended { write, answer, at_us })
        })
        .collect()
}

/// Appends segments the dedup memory covers (each `known` is Some) with
/// `queen.push_known_segments_v1`: one round trip and one statement. Each
/// segment's outcome in order, None for one the function passed over
/// (nothing of it was written; it needs `append_with_memory`).
pub(super) async fn append_known(
    client: &impl deadpool_postgres::GenericClient,
    segments: &[MemorySegment<'_>],
) -> Result<Vec<Option<Appended>>, DbError> {
    let mut known = Vec::with_capacity(segments.len());
    for s in segments {
        known.push(s.known.ok_or_else(|| DbError::Unexpected("a segment without memory was sent as known".into()))?);
    }
    let pids: Vec<i64> = known.iter().map(|k| k.pid).collect();
    let lasts: Vec<i64> = known.iter().map(|k| k.last).collect();
    let windows: Vec<i32> = known.iter().map(|k| k.window).collect();
    let counts: Vec<i32> = segments.iter().map(|s| s.hashes.len() as i32).collect();
    let blobs: Vec<&[u8]> = segments.iter().map(|s| s.blob).collect();
    let firsts: Vec<i32> = counts.iter().scan(1, |next, &n| Some(std::mem::replace(next, *next + n))).collect();
    let hashes: Vec<i64> = segments.iter().flat_map(|s| s.hashes.iter().copied()).collect();
    let stmt = client.prepare_cached(PUSH_KNOWN_SQL).await?;
    let rows = client.query(&stmt, &[&pids, &lasts, &windows, &counts, &blobs, &firsts, &hashes]).await?;
    let mut out: Vec<Option<Appended>> = segments.iter().map(|_| None).collect();
    for row in &rows {
        let s = usize::try_from(row.get::<_, i32>("o_seg") - 1)
            .ok()
            .filter(|s| *s < segments.len())
            .ok_or_else(|| DbError::Unexpected("push_known_segments_v1 named a segment it was not given".into()))?;
        let (partition_id, window, base_offset): (i64, i32, i64) = (row.get("o_partition_id"), row.get("o_window"), row.get("o_base_offset"));
        let at: DateTime<Utc> = row.get("o_created_at");
        metrics::histogram!(crate::metrics::SEGMENT_MESSAGES).record(segments[s].hashes.len() as f64);
        let answer = Answer { pid: partition_id, window, prev: base_offset - 1, log_start: row.get("o_log_start"), seen: Vec::new() };
        out[s] = Some(Appended { write: SegmentWrite::Written { partition_id, base_offset, window }, answer, at_us: Some(at.timestamp_micros()) });
    }
    Ok(out)
}

/// The original message ids of the dedup memory's candidates, (offset,
/// hash) in partition `pid`, in order: None where the message is no
/// duplicate after all, because the message at that offset no longer
/// carries that id (retention removed it, the partition is gone, or a
/// failover lost it and the offset was written again) or because it has
/// left its queue's window by PostgreSQL's clock (the window may also have
/// been shortened since the memory learned it).
pub(super) async fn originals(
    client: &impl deadpool_postgres::GenericClient,
    pid: i64,
    candidates: &[(i64, i64)],
    hasher: &crate::log::TxnHasher,
) -> Result<Vec<Option<Uuid>>, DbError> {
    let offsets: Vec<i64> = candidates.iter().map(|c| c.0).collect();
    let stmt = client.prepare_cached(ORIGINALS_SQL).await?;
    let rows = client.query(&stmt, &[&pid, &offsets]).await?;
    Ok(rows
        .iter()
        .zip(candidates)
        .map(|(row, &(off, hash))| {
            let (base, end): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
            let (blob, inside): (Option<&[u8]>, Option<bool>) = (row.get(2), row.get(3));
            match (base, end, blob, inside) {
                (Some(base), Some(end), Some(blob), Some(true)) if off <= end => {
                    let frames = decompress_frames(blob, SEGMENT_LIMIT).ok()?;
                    let frame = FrameReader::new(&frames).nth(usize::try_from(off - base).ok()?)?.ok()?;
                    (hasher.hash(frame.transaction_id) == hash).then_some(frame.message_id)
                }
                _ => None,
            }
        })
        .collect())
}

/// Whether a queue's last reported dedup window says it keeps none: its
/// segments then go through `queen.push_segment_without_window_v1`, every
/// other through `queen.push_segments_of_queues_v1`.
pub(super) fn keeps_no_window(window: Option<i32>) -> bool {
    window == Some(0)
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
