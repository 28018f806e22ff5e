//! Deleting the transaction-index entries of stored segments, shared by the
//! dedup purge (segments that left the window) and retention (segments it
//! removes before that).
//!
//! The index is keyed by (partition, hash of the transactionId), with no
//! offset or time index (it is the one per-message row), so the only cheap way
//! to find a segment's entries is to decode the segment and look each one up.
//! The offsets bound the delete to entries that still point into the segment:
//! a later message that reused a transactionId keeps its own entry.

use crate::db::DbError;
use crate::log::{decompress_frames, FrameReader, SEGMENT_LIMIT};
use crate::log::legacy_index_hash;

/// Deletes entries by (partition, hash) inside the offsets given with each.
const DELETE_SQL: &str = "
    DELETE FROM queen.txn_index t
    USING unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[]) d (pid, hash, lo, hi)
    WHERE t.partition_id = d.pid AND t.txn_hash = d.hash AND t.msg_offset BETWEEN d.lo AND d.hi";

/// Most entries one delete statement names.
const CHUNK: usize = 50_000;

/// Entries to delete, gathered segment by segment and sent in chunks.
#[derive(Default)]
pub struct Doomed {
    pid: Vec<i64>,
    hash: Vec<i64>,
    lo: Vec<i64>,
    hi: Vec<i64>,
}

impl Doomed {
    /// Adds the entries of one stored segment (`blob`) of partition `pid`,
    /// bounded to offsets `lo..=hi`, deleting a chunk when one is full. A
    /// segment that does not decode is skipped (its entries stay).
    pub async fn add_segment(
        &mut self,
        client: &impl deadpool_postgres::GenericClient,
        pid: i64,
        lo: i64,
        hi: i64,
        blob: &[u8],
    ) -> Result<(), DbError> {
        let Ok(frames) = decompress_frames(blob, SEGMENT_LIMIT) else { return Ok(()) };
        for f in FrameReader::new(&frames).filter_map(Result::ok) {
            self.pid.push(pid);
            self.hash.push(legacy_index_hash(f.transaction_id));
            self.lo.push(lo);
            self.hi.push(hi);
        }
        if self.pid.len() >= CHUNK {
            self.delete(client).await?;
        }
        Ok(())
    }

    /// Deletes what was gathered.
    pub async fn delete(&mut self, client: &impl deadpool_postgres::GenericClient) -> Result<(), DbError> {
        if !self.pid.is_empty() {
            let stmt = client.prepare_cached(DELETE_SQL).await?;
            client.execute(&stmt, &[&self.pid, &self.hash, &self.lo, &self.hi]).await?;
        }
        *self = Doomed::default();
        Ok(())
    }
}
