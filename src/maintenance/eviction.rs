//! The `maxWaitTimeSeconds` eviction: a message that waited past its queue's
//! limit without being consumed by a group is dead-lettered for that group
//! (reason `max_wait_time`) and the group's cursor moves past it.
//!
//! Per (partition, group) cursor, in two steps, because only the broker can
//! decode a segment: `queen.eviction_candidates_v1` names the cursors whose
//! next message sits in a segment older than the limit and that no live lease
//! holds; the broker reads that prefix of old segments, decodes the frames
//! past the cursor, and `queen.evict_v1` writes their dead letters and moves
//! the cursor in one statement, under the cursor row's lock, only if the row
//! still stands where step one saw it and no lease went live meanwhile. So a
//! lease is never passed, an ack racing the eviction wins or loses whole, and
//! two brokers evicting at once dead-letter each message once.
//!
//! A partition no consumer has read behaves as one whose queue-mode cursor
//! stands at the start of its log (`queen.eviction_seed_v1` writes that
//! cursor first), so its overdue messages are dead-lettered for the
//! queue-mode consumer too (issue 44 §2).
//!
//! Age is a segment's: every message of a segment shares its `created_at`
//! (docs/DECISIONS.md "maxWaitTimeSeconds"). Encrypted payloads are copied
//! as their envelopes, so eviction needs no key. Work per tick is bounded by
//! `EVICTION_BATCH_SIZE` messages.

use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::db::DbError;
use crate::log::{decompress_frames, FrameReader, SEGMENT_LIMIT};

/// Cursors looked at per tick, at most.
const CANDIDATES: i32 = 256;

/// One tick: evicts up to `batch` messages. `Ok(true)` when the batch was
/// spent (more may be due).
pub async fn tick(pool: &Pool, batch: i64) -> Result<bool, DbError> {
    let client = pool.get().await?;
    // Most logs have no queue with a limit: then a tick is this one probe,
    // not the two searches below (0.8 s and 0.5 s a tick at 1,000,000
    // partitions with no queue limited: issue 51).
    let limited: bool = client.query_one("SELECT EXISTS (SELECT 1 FROM queen.queues WHERE max_wait_time_seconds > 0)", &[]).await?.get(0);
    if !limited {
        return Ok(false);
    }
    // Partitions nobody has read get the queue-mode consumer's cursor first,
    // so that their overdue messages are candidates in this same tick.
    let seeded: i32 = client.query_one("SELECT queen.eviction_seed_v1($1)", &[&CANDIDATES]).await?.get(0);
    if seeded > 0 {
        tracing::debug!(partitions = seeded, "queue-mode cursors seeded for eviction on partitions nobody has read");
    }
    let candidates = client.query("SELECT * FROM queen.eviction_candidates_v1($1)", &[&CANDIDATES]).await?;
    let mut left = batch;
    for c in &candidates {
        if left <= 0 {
            return Ok(true);
        }
        let (pid, group, committed, from): (i64, String, i64, i64) = (c.get(0), c.get(1), c.get(2), c.get(3));
        let cutoff: chrono::DateTime<chrono::Utc> = c.get(4);
        let segments = client
            .query(
                "SELECT base_offset, created_at, blob FROM queen.segments
                 WHERE partition_id = $1 AND base_offset >= $2 AND created_at < $3
                 ORDER BY base_offset LIMIT $4",
                &[&pid, &from, &cutoff, &left.min(i64::from(CANDIDATES))],
            )
            .await?;
        let mut m = Evicted::default();
        'segments: for s in &segments {
            let base: i64 = s.get(0);
            // A segment that does not decode stops this cursor's eviction
            // there (what lies past it cannot be dead-lettered in order),
            // said in the log and counted each pass until it is dealt with.
            let unreadable = |error: String| {
                tracing::warn!(partition_id = pid, group = %group, base_offset = base, error = %error,
                               "eviction cannot read a segment: this cursor's overdue messages from here on stay");
                metrics::counter!("queen_eviction_unreadable_segments_total").increment(1);
            };
            let frames = match decompress_frames(s.get::<_, &[u8]>(2), SEGMENT_LIMIT) {
                Ok(frames) => frames,
                Err(e) => {
                    unreadable(e.to_string());
                    break;
                }
            };
            for (k, f) in FrameReader::new(&frames).enumerate() {
                let f = match f {
                    Ok(f) => f,
                    Err(e) => {
                        unreadable(e.to_string());
                        break 'segments;
                    }
                };
                let offset = base + k as i64;
                if offset <= committed {
                    continue;
                }
                if m.offsets.len() as i64 >= left {
                    break 'segments;
                }
                m.push(offset, &f, s.get(1));
            }
        }
        if m.offsets.is_empty() {
            continue;
        }
        let n: i32 = client
            .query_one(
                "SELECT queen.evict_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                &[&pid, &group, &committed, &m.offsets, &m.ids, &m.txns, &m.traces, &m.subs, &m.payloads, &m.sealed, &m.created],
            )
            .await?
            .get(0);
        if n > 0 {
            tracing::info!(partition_id = pid, group = %group, messages = n, "evicted messages past maxWaitTimeSeconds to the dead-letter queue");
            metrics::counter!("queen_evicted_messages_total").increment(n as u64);
        }
        left -= i64::from(n);
    }
    Ok(left <= 0)
}

/// The dead letters of one cursor, as `queen.evict_v1`'s parallel arrays.
#[derive(Default)]
struct Evicted {
    offsets: Vec<i64>,
    ids: Vec<Uuid>,
    txns: Vec<String>,
    traces: Vec<Option<Uuid>>,
    subs: Vec<Option<String>>,
    payloads: Vec<Option<String>>,
    sealed: Vec<Option<Vec<u8>>>,
    created: Vec<chrono::DateTime<chrono::Utc>>,
}

impl Evicted {
    fn push(&mut self, offset: i64, f: &crate::log::Frame<'_>, created: chrono::DateTime<chrono::Utc>) {
        self.offsets.push(offset);
        self.ids.push(f.message_id);
        self.txns.push(f.transaction_id.to_string());
        self.traces.push(f.trace_id);
        self.subs.push(f.producer_sub.map(str::to_string));
        if f.encrypted {
            self.payloads.push(None);
            self.sealed.push(Some(f.payload.to_vec()));
        } else {
            self.payloads.push(Some(String::from_utf8_lossy(f.payload_json()).into_owned()));
            self.sealed.push(None);
        }
        self.created.push(created);
    }
}
