//! `POST /api/v1/fetch` (API.md §2.10): records read by offset, Kafka
//! style, for sinks, replays and tools. No lease, no cursor, nothing to ack.
//!
//! Each entry names (queue, partition, offset) and gets the records from
//! that offset on, up to its byte budget, with the partition's
//! `highWatermark` (the offset the next push will take) and
//! `logStartOffset` (the oldest kept). Records stop below the high
//! watermark read with them, so a client that loops to the first answer's
//! watermark reads exactly what was there. The segments are found by the
//! same backward primary-key step as the pop's head probe and sliced here:
//! PostgreSQL never looks inside a blob.
//!
//! Budgets: an entry's `maxBytes` (at most 8 MiB) and the call's `maxBytes`
//! count payload bytes. The first entry with records always gets at least
//! one, so a record larger than the budget does not stall a reader; an
//! entry that finds the call's budget spent answers no records, and the
//! client asks again. With `maxWaitMs` the call waits, woken by pushes to
//! its queues, until `minBytes` are there or the time is up.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde_json::Value;

use crate::crypto::KeyRing;
use crate::db::DbError;
use crate::json::string as json_str;
use crate::log::{decompress_frames, FrameReader, SEGMENT_LIMIT};

/// Most entries one call may carry.
pub const MAX_ENTRIES: usize = 1024;
/// The most one entry reads, and its default.
pub const MAX_ENTRY_BYTES: usize = 8 << 20;
/// The call's ceiling when the body names none, and the most it may name.
pub const MAX_CALL_BYTES: usize = 64 << 20;
/// The longest wait a call may ask for.
pub const MAX_WAIT: Duration = Duration::from_millis(30_000);
/// Segments read per round trip while an entry's budget lasts.
const SEGMENTS_PER_READ: i64 = 16;

pub const OFFSET_OUT_OF_RANGE: &str = "OFFSET_OUT_OF_RANGE";
pub use super::UNKNOWN_TOPIC_OR_PARTITION;
pub const DECRYPT_FAILED: &str = "DECRYPT_FAILED";

/// One entry of the request, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub queue: String,
    pub partition: String,
    pub offset: i64,
    pub max_bytes: usize,
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub entries: Vec<Entry>,
    pub max_bytes: usize,
    pub max_wait: Duration,
    pub min_bytes: usize,
}

/// Reads a body; the error names the entry and the field.
pub fn parse(body: &Value) -> Result<Request, String> {
    let entries = super::entries(body, MAX_ENTRIES)?;
    let bytes = |v: Option<&Value>, what: String, default: usize, max: usize| -> Result<usize, String> {
        match v {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_u64().filter(|n| *n >= 1).map(|n| (n as usize).min(max)).ok_or_else(|| format!("{what}: a positive integer")),
        }
    };
    let entries = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let field = |k: &str, p: &str| format!("entries[{i}].{k}: {p}");
            let queue = super::entry_queue(e, i)?;
            let partition = match e.get("partition") {
                None | Some(Value::Null) => crate::push::validate::DEFAULT_PARTITION.to_string(),
                Some(Value::String(p)) if !p.is_empty() => p.clone(),
                // Upstream reads a partition named by a number as its text.
                Some(Value::Number(n)) => n.to_string(),
                Some(_) => return Err(field("partition", "a non-empty string (or a number)")),
            };
            let offset = match e.get("offset") {
                None | Some(Value::Null) => 0,
                Some(v) => v.as_i64().filter(|o| *o >= 0).ok_or_else(|| field("offset", "a non-negative integer"))?,
            };
            let max_bytes = bytes(e.get("maxBytes"), format!("entries[{i}].maxBytes"), MAX_ENTRY_BYTES, MAX_ENTRY_BYTES)?;
            Ok(Entry { queue, partition, offset, max_bytes })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let max_wait = match body.get("maxWaitMs") {
        None | Some(Value::Null) => Duration::ZERO,
        Some(v) => Duration::from_millis(v.as_u64().ok_or("maxWaitMs: a non-negative integer (at most 30000)")?).min(MAX_WAIT),
    };
    Ok(Request {
        entries,
        max_bytes: bytes(body.get("maxBytes"), "maxBytes".into(), MAX_CALL_BYTES, MAX_CALL_BYTES)?,
        max_wait,
        min_bytes: bytes(body.get("minBytes"), "minBytes".into(), 1, MAX_CALL_BYTES)?,
    })
}

/// One answer: the body, and the payload bytes it carries.
pub struct Answer {
    pub body: Vec<u8>,
    pub bytes: usize,
}

/// A partition as the reads see it: its id, the offset the next push takes,
/// and the oldest kept.
struct Lane {
    id: i64,
    high_watermark: i64,
    log_start: i64,
}

/// Where [`read_into`] puts what it reads, entry by entry: the JSON answer
/// of `POST /api/v1/fetch` ([`JsonAnswer`]) and the Kafka listener's record
/// batches share one reader, so both see the same records, budgets and
/// errors.
pub trait Sink {
    /// An entry's records begin.
    fn begin(&mut self, entry: &Entry);
    /// One record of the current entry, in offset order. `payload` is the
    /// stored JSON (opened when its queue encrypts).
    fn record(&mut self, offset: i64, created_at: DateTime<Utc>, transaction_id: &str, payload: &[u8]);
    /// The current entry ends: the partition's bounds, and why its records
    /// stopped early (`None`: they did not).
    fn end(&mut self, high_watermark: i64, log_start: i64, error: Option<&'static str>);
}

/// The JSON answer of `POST /api/v1/fetch`, written as the records come.
pub struct JsonAnswer {
    out: Vec<u8>,
    entries: usize,
    first: bool,
    /// The last segment time written, as text: a segment's records share it.
    ts: Option<(DateTime<Utc>, String)>,
}

impl Default for JsonAnswer {
    fn default() -> Self {
        let mut out = Vec::with_capacity(1024);
        out.extend_from_slice(b"{\"entries\":[");
        JsonAnswer { out, entries: 0, first: true, ts: None }
    }
}

impl JsonAnswer {
    /// The finished body.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(b"]}");
        self.out
    }
}

impl Sink for JsonAnswer {
    fn begin(&mut self, e: &Entry) {
        if self.entries > 0 {
            self.out.push(b',');
        }
        self.entries += 1;
        self.first = true;
        self.out.extend_from_slice(b"{\"queue\":");
        json_str(&mut self.out, crate::tenancy::shown(&e.queue));
        self.out.extend_from_slice(b",\"partition\":");
        json_str(&mut self.out, &e.partition);
        self.out.extend_from_slice(b",\"records\":[");
    }

    fn record(&mut self, offset: i64, created_at: DateTime<Utc>, transaction_id: &str, payload: &[u8]) {
        let out = &mut self.out;
        if !self.first {
            out.push(b',');
        }
        self.first = false;
        out.extend_from_slice(b"{\"offset\":");
        crate::json::decimal(out, offset);
        out.extend_from_slice(b",\"transactionId\":");
        json_str(out, transaction_id);
        out.extend_from_slice(b",\"payload\":");
        out.extend_from_slice(payload);
        out.extend_from_slice(b",\"ts\":\"");
        if self.ts.as_ref().is_none_or(|(t, _)| *t != created_at) {
            self.ts = Some((created_at, created_at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()));
        }
        out.extend_from_slice(self.ts.as_ref().expect("just set").1.as_bytes());
        out.extend_from_slice(b"\"}");
    }

    fn end(&mut self, high_watermark: i64, log_start: i64, error: Option<&'static str>) {
        let out = &mut self.out;
        out.push(b']');
        out.extend_from_slice(b",\"highWatermark\":");
        crate::json::decimal(out, high_watermark);
        out.extend_from_slice(b",\"logStartOffset\":");
        crate::json::decimal(out, log_start);
        if let Some(e) = error {
            out.extend_from_slice(b",\"error\":");
            json_str(out, e);
        }
        out.push(b'}');
    }
}

/// Reads every entry once into a JSON answer.
pub async fn read(pool: &Pool, ring: Option<&KeyRing>, req: &Request) -> Result<Answer, DbError> {
    let mut sink = JsonAnswer::default();
    let bytes = read_into(pool, ring, req, &mut sink).await?;
    Ok(Answer { body: sink.finish(), bytes })
}

/// Reads every entry once into `sink`; answers the payload bytes read. A
/// partition that does not exist ends with UNKNOWN_TOPIC_OR_PARTITION and
/// bounds (0, 0).
pub async fn read_into(pool: &Pool, ring: Option<&KeyRing>, req: &Request, sink: &mut impl Sink) -> Result<usize, DbError> {
    let client = pool.get().await?;
    let queues: Vec<&str> = req.entries.iter().map(|e| e.queue.as_str()).collect();
    let partitions: Vec<&str> = req.entries.iter().map(|e| e.partition.as_str()).collect();
    let lanes: HashMap<(String, String), Lane> = client
        .query(
            "SELECT q.name, p.name, p.id, p.last_offset + 1, p.log_start
             FROM (SELECT DISTINCT * FROM unnest($1::text[], $2::text[])) AS e (queue, partition)
             JOIN queen.queues q ON q.name = e.queue
             JOIN queen.partitions p ON p.queue_id = q.id AND p.name = e.partition",
            &[&queues, &partitions],
        )
        .await?
        .iter()
        .map(|r| ((r.get(0), r.get(1)), Lane { id: r.get(2), high_watermark: r.get(3), log_start: r.get(4) }))
        .collect();
    let stmt = client
        .prepare_cached(
            "SELECT base_offset, created_at, blob FROM queen.segments
             WHERE partition_id = $1 AND base_offset >= COALESCE(
                 (SELECT max(s.base_offset) FROM queen.segments s WHERE s.partition_id = $1 AND s.base_offset <= $2), $2)
               AND base_offset < $3
             ORDER BY base_offset LIMIT $4",
        )
        .await?;
    let mut call_bytes = 0usize;
    for e in &req.entries {
        sink.begin(e);
        let Some(lane) = lanes.get(&(e.queue.clone(), e.partition.clone())) else {
            sink.end(0, 0, Some(UNKNOWN_TOPIC_OR_PARTITION));
            continue;
        };
        if e.offset < lane.log_start || e.offset > lane.high_watermark {
            sink.end(lane.high_watermark, lane.log_start, Some(OFFSET_OUT_OF_RANGE));
            continue;
        }
        let (mut next, mut entry_bytes, mut first, mut error) = (e.offset, 0usize, true, None);
        'segments: while next < lane.high_watermark && entry_bytes < e.max_bytes && call_bytes < req.max_bytes {
            let rows = client.query(&stmt, &[&lane.id, &next, &lane.high_watermark, &SEGMENTS_PER_READ]).await?;
            if rows.is_empty() {
                break; // a retention gap at the end: nothing more to read
            }
            for row in &rows {
                let base: i64 = row.get(0);
                let created: DateTime<Utc> = row.get(1);
                let Ok(frames) = decompress_frames(row.get::<_, &[u8]>(2), SEGMENT_LIMIT) else { break 'segments };
                for (k, frame) in FrameReader::new(&frames).enumerate() {
                    let offset = base + k as i64;
                    let Ok(f) = frame else { break 'segments };
                    if offset < next {
                        continue;
                    }
                    if offset >= lane.high_watermark {
                        break 'segments;
                    }
                    let payload = match crate::crypto::frame_payload(ring, &f) {
                        Ok(p) => p,
                        Err(_) => {
                            error = Some(DECRYPT_FAILED);
                            break 'segments;
                        }
                    };
                    let fits = entry_bytes + payload.len() <= e.max_bytes && call_bytes + payload.len() <= req.max_bytes;
                    // The call's first record is read however large, so no reader stalls.
                    let must_take = first && call_bytes == 0;
                    if !(fits || must_take) {
                        break 'segments;
                    }
                    first = false;
                    sink.record(offset, created, f.transaction_id, &payload);
                    entry_bytes += payload.len();
                    call_bytes += payload.len();
                    next = offset + 1;
                }
            }
        }
        sink.end(lane.high_watermark, lane.log_start, error);
    }
    Ok(call_bytes)
}

/// Reads, and with `maxWaitMs` waits for pushes to the entries' queues
/// until `minBytes` are there or the time is up.
pub async fn fetch(
    pool: &Pool,
    ring: Option<&KeyRing>,
    gates: &crate::pop::wake::WakeGates,
    cfg: &crate::config::PopConfig,
    req: &Request,
) -> Result<Answer, DbError> {
    let (sink, bytes) = fetch_into(pool, ring, gates, cfg, req, JsonAnswer::default).await?;
    Ok(Answer { body: sink.finish(), bytes })
}

/// [`read_into`] a fresh sink from `make`, again after each wake, until
/// `minBytes` are there or `maxWaitMs` is up. Woken by the queues' gates;
/// the pop's backoff re-check is the floor, so a missed wake costs one
/// interval. Answers the last sink and its payload bytes.
pub async fn fetch_into<S: Sink>(
    pool: &Pool,
    ring: Option<&KeyRing>,
    gates: &crate::pop::wake::WakeGates,
    cfg: &crate::config::PopConfig,
    req: &Request,
    mut make: impl FnMut() -> S,
) -> Result<(S, usize), DbError> {
    let deadline = tokio::time::Instant::now() + req.max_wait;
    let mut queues: Vec<&str> = req.entries.iter().map(|e| e.queue.as_str()).collect();
    queues.sort_unstable();
    queues.dedup();
    // One queue: its gate; several: the gate every push opens.
    let gate = match queues.as_slice() {
        [one] => gates.queue(one),
        _ => gates.discovery(),
    };
    let mut attempt = 0;
    loop {
        let woken = gate.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let mut sink = make();
        let bytes = read_into(pool, ring, req, &mut sink).await?;
        let now = tokio::time::Instant::now();
        if bytes >= req.min_bytes || now >= deadline {
            return Ok((sink, bytes));
        }
        let pause = crate::pop::wake::backoff_interval(attempt, cfg).min(deadline - now);
        tokio::select! {
            _ = &mut woken => attempt = 0,
            _ = tokio::time::sleep(pause) => attempt += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_is_read_with_its_defaults_and_every_bad_field_is_named() {
        let r = parse(&json!({"entries": [{"queue": "q"}, {"queue": "q", "partition": 7, "offset": 3, "maxBytes": 1 << 30}]})).unwrap();
        assert_eq!(r.entries[0], Entry { queue: "q".into(), partition: "Default".into(), offset: 0, max_bytes: MAX_ENTRY_BYTES });
        assert_eq!((r.entries[1].partition.as_str(), r.entries[1].offset, r.entries[1].max_bytes), ("7", 3, MAX_ENTRY_BYTES));
        assert_eq!((r.max_bytes, r.max_wait, r.min_bytes), (MAX_CALL_BYTES, Duration::ZERO, 1));
        let r = parse(&json!({"entries": [{"queue": "q"}], "maxWaitMs": 90_000, "minBytes": 10})).unwrap();
        assert_eq!((r.max_wait, r.min_bytes), (MAX_WAIT, 10));
        for (body, err) in [
            (json!({}), "entries: required, an array"),
            (json!({"entries": []}), "entries: from 1 to 1024 entries, got 0"),
            (json!({"entries": [{"partition": "p"}]}), "entries[0].queue: required, a non-empty string"),
            (json!({"entries": [{"queue": "q", "offset": -1}]}), "entries[0].offset: a non-negative integer"),
            (json!({"entries": [{"queue": "q", "partition": ""}]}), "entries[0].partition: a non-empty string (or a number)"),
            (json!({"entries": [{"queue": "q", "maxBytes": 0}]}), "entries[0].maxBytes: a positive integer"),
            (json!({"entries": [{"queue": "q"}], "maxWaitMs": "soon"}), "maxWaitMs: a non-negative integer (at most 30000)"),
        ] {
            assert_eq!(parse(&body).unwrap_err(), err, "{body}");
        }
    }
}
