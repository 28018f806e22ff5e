//! The pop answer (API.md §2.2.1), written by hand into one buffer: payloads
//! are spliced verbatim from the stored frames (they were validated JSON when
//! pushed), never parsed and re-serialized.

use std::io::Write;

use crate::log::FrameReader;

use super::claim::ClaimedPartition;
use super::frames::FrameCache;
use crate::json::string as json_str;
use super::params::PopParams;

/// A segment blob that no longer decodes: the answer fails rather than
/// delivering a partial or shifted batch.
#[derive(Debug, thiserror::Error)]
#[error("stored segment of partition {partition_id} at offset {base_offset} is unreadable: {detail}")]
pub struct CorruptSegment {
    pub partition_id: i64,
    pub base_offset: i64,
    pub detail: String,
}

/// An encrypted payload that did not open (a key this broker lacks, or a
/// corrupt envelope): the pop answers 500 naming the partition, rather than
/// delivering garbage, and nothing is committed (a lease lapses; an autoAck
/// claim's cursors are put back, `PopService::undo_auto_ack`).
#[derive(Debug, thiserror::Error)]
#[error("decrypt failed: message at offset {offset} of partition {partition_id}: {error}")]
pub struct DecryptFailed {
    pub partition_id: i64,
    pub offset: i64,
    pub error: crate::crypto::OpenError,
}

/// Keys the answer carries besides the messages (the autopilot echo).
fn own_keys(p: &PopParams) -> Option<String> {
    p.autopilot.then(|| format!("{{\"autopilot\":{{\"partitions\":{},\"batch\":{},\"waitMs\":0}}}}", p.partitions, p.batch))
}

/// The `QPF1` answer: stored segments shipped as they are, the client slices
/// each claim's span out of them. No decompression here at all.
pub fn render_frames(claimed: &[ClaimedPartition], top_queue: &str, lease_id: &str, p: &PopParams) -> Option<Vec<u8>> {
    if claimed.is_empty() {
        return None;
    }
    let claims: Vec<crate::log::binary::FramedClaim<'_>> = claimed
        .iter()
        .map(|c| crate::log::binary::FramedClaim {
            partition_id: c.partition_id as u64,
            partition: &c.partition,
            start: c.first as u64,
            end: c.last as u64,
            delivery_attempt: c.attempt.max(1) as u32,
            records: c
                .segments
                .iter()
                .map(|s| (s.base_offset as u64, s.created_at.timestamp_micros(), s.msg_count as u32, s.blob.as_slice()))
                .collect(),
        })
        .collect();
    let own = own_keys(p);
    Some(crate::log::binary::encode_pop_frames(crate::tenancy::shown(top_queue), lease_id, &p.group, own.as_deref(), &claims))
}

/// A UUID's hyphenated text, without the formatting machinery (one or two
/// per delivered message).
fn uuid_text(out: &mut Vec<u8>, id: &uuid::Uuid) {
    out.extend_from_slice(id.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()).as_bytes());
}

/// A rendered answer, with what a leased pop hands the ack registry.
pub struct Rendered<'a> {
    pub body: Vec<u8>,
    pub batches: Vec<LeasedBatch<'a>>,
}

/// One partition's part of a leased answer: its queue and the delivered
/// transactionIds with their offsets.
pub struct LeasedBatch<'a> {
    pub partition_id: i64,
    pub queue: &'a str,
    pub entries: Vec<(String, i64)>,
}

/// Renders the 200 body; `None` when nothing was delivered. Encrypted
/// payloads are opened with `ring`. A segment delivered only in part stays
/// decompressed in `cache` for the pop that takes its next message; the pop
/// that takes its last one drops it.
pub fn render<'a>(
    claimed: &'a [ClaimedPartition],
    top_queue: &str,
    lease_id: &str,
    p: &PopParams,
    ring: Option<&crate::crypto::KeyRing>,
    cache: &FrameCache,
) -> Result<Option<Rendered<'a>>, super::PopError> {
    let Some(first) = claimed.first() else { return Ok(None) };
    let mut batches = Vec::new();
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(b"{\"success\":true,\"queue\":");
    json_str(&mut out, crate::tenancy::shown(top_queue));
    out.extend_from_slice(b",\"partition\":");
    json_str(&mut out, &first.partition);
    write!(out, ",\"partitionId\":\"{}\",\"leaseId\":", first.partition_id).expect("vec write");
    json_str(&mut out, lease_id);
    out.extend_from_slice(b",\"consumerGroup\":");
    json_str(&mut out, &p.group);
    out.extend_from_slice(b",\"messages\":[");
    let mut any = false;
    for c in claimed {
        let mut pid_and_rest = Vec::new();
        write!(pid_and_rest, ",\"partitionId\":\"{}\",\"partition\":", c.partition_id).expect("vec write");
        json_str(&mut pid_and_rest, &c.partition);
        pid_and_rest.extend_from_slice(b",\"leaseId\":");
        json_str(&mut pid_and_rest, lease_id);
        pid_and_rest.extend_from_slice(b",\"consumerGroup\":");
        json_str(&mut pid_and_rest, &p.group);
        pid_and_rest.push(b'}');
        let mut batch = Vec::new();
        for seg in &c.segments {
            let corrupt = |detail: String| CorruptSegment { partition_id: c.partition_id, base_offset: seg.base_offset, detail };
            let rest = seg.start_idx + seg.take < seg.msg_count;
            let decoded = match &seg.decoded {
                Some(d) => d.clone(),
                None => cache.frames(c.partition_id, seg.base_offset, seg.msg_count, &seg.blob, rest).map_err(corrupt)?,
            };
            if !rest && seg.start_idx > 0 {
                // The segment's last message: its reader moves on. (A whole
                // segment in one pop was never cached for this reader.)
                cache.done(c.partition_id, seg.base_offset);
            }
            let created = format!(",\"createdAt\":\"{}\"", seg.created_at.format("%Y-%m-%dT%H:%M:%S%.6fZ"));
            let mut taken = 0;
            for frame in FrameReader::new(decoded.from(seg.start_idx)).take(seg.take) {
                let f = frame.map_err(|e| corrupt(e.to_string()))?;
                if any {
                    out.push(b',');
                }
                any = true;
                out.extend_from_slice(b"{\"id\":\"");
                uuid_text(&mut out, &f.message_id);
                out.extend_from_slice(b"\",\"transactionId\":");
                json_str(&mut out, f.transaction_id);
                match f.trace_id {
                    Some(t) => {
                        out.extend_from_slice(b",\"traceId\":\"");
                        uuid_text(&mut out, &t);
                        out.push(b'"');
                    }
                    None => out.extend_from_slice(b",\"traceId\":null"),
                }
                out.extend_from_slice(b",\"data\":");
                let offset = seg.base_offset + (seg.start_idx + taken) as i64;
                crate::crypto::write_frame_payload(ring, &f, &mut out)
                    .map_err(|error| DecryptFailed { partition_id: c.partition_id, offset, error })?;
                out.extend_from_slice(b",\"producerSub\":");
                match f.producer_sub {
                    Some(s) => json_str(&mut out, s),
                    None => out.extend_from_slice(b"null"),
                }
                out.extend_from_slice(created.as_bytes());
                out.extend_from_slice(&pid_and_rest);
                if !lease_id.is_empty() {
                    batch.push((f.transaction_id.to_string(), offset));
                }
                taken += 1;
            }
            if taken != seg.take {
                return Err(corrupt(format!("holds fewer frames than the {} to deliver", seg.take)).into());
            }
        }
        if !batch.is_empty() {
            batches.push(LeasedBatch { partition_id: c.partition_id, queue: &c.queue, entries: batch });
        }
    }
    write!(out, "],\"partitionsClaimed\":{}", claimed.len()).expect("vec write");
    if let Some(own) = own_keys(p) {
        // Splice the object's members after the last one written.
        out.push(b',');
        out.extend_from_slice(&own.as_bytes()[1..own.len() - 1]);
    }
    out.push(b'}');
    Ok(Some(Rendered { body: out, batches }))
}
