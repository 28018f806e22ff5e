//! The binary bodies of API.md §3: `QPB1` pushes (flags 1, 2, 4 and 8),
//! `QTB1` transactions, and the `QPF1` framed pop answer.
//!
//! Parsers are strict and bounded: every length is checked against what is
//! left, every zstd frame is decompressed under a byte limit (the body limit
//! applies to decompressed bytes too), every payload must be one JSON
//! document, and an error names the byte offset and what was expected there.
//! Parsed items own their bytes: a body is consumed once, so one copy is the
//! price of not tying the request to its buffer.

use std::sync::Arc;

use uuid::Uuid;

use super::frame::{CodecError, FrameReader};
use super::segment::{decompress_frames, SegmentError};

const FLAG_ZSTD: u8 = 1;
const FLAG_COUNTS: u8 = 2;
const FLAG_TXN: u8 = 4;
const FLAG_FRAMES: u8 = 8;

/// A body that does not parse: where, and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {body} body at byte {offset}: expected {expected}")]
pub struct BinaryError {
    pub body: &'static str,
    pub offset: usize,
    pub expected: String,
}

/// One pushed item from a binary body.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryItem {
    /// Shared by the items of one group: a clone is a count, not a copy.
    pub queue: Arc<str>,
    pub partition: Arc<str>,
    /// `None`: the broker mints one.
    pub transaction_id: Option<String>,
    /// Set when the client minted it (pre-framed groups).
    pub message_id: Option<Uuid>,
    pub trace_id: Option<Uuid>,
    /// One JSON document, validated.
    pub payload: String,
}

/// A parsed `QPB1` body.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryPush {
    pub counts_only: bool,
    pub items: Vec<BinaryItem>,
    /// Flag-8 groups that can be stored as they came (see [`FramedGroup`]).
    pub groups: Vec<FramedGroup>,
}

/// A flag-8 group whose compressed bytes can become a segment unchanged:
/// exactly one zstd frame, and no frame claims a producer (the broker stamps
/// that itself). `items` is its range in [`BinaryPush::items`].
#[derive(Debug, Clone, PartialEq)]
pub struct FramedGroup {
    pub items: std::ops::Range<usize>,
    pub blob: Vec<u8>,
}

struct Reader<'a> {
    body: &'static str,
    buf: &'a [u8],
    pos: usize,
    /// Added to positions in errors (a decompressed body maps to its header).
    base: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, expected: impl Into<String>) -> BinaryError {
        BinaryError { body: self.body, offset: self.base + self.pos, expected: expected.into() }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], BinaryError> {
        match self.pos.checked_add(n).filter(|e| *e <= self.buf.len()) {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err(format!("{what} ({n} bytes, {} left)", self.buf.len() - self.pos))),
        }
    }

    fn u8(&mut self, what: &str) -> Result<u8, BinaryError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, BinaryError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    fn str16(&mut self, what: &str) -> Result<String, BinaryError> {
        let at = self.pos;
        let len = u16::from_le_bytes(self.take(2, what)?.try_into().expect("2 bytes")) as usize;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| BinaryError { body: self.body, offset: self.base + at, expected: format!("{what} as UTF-8") })
    }

    fn done(&self) -> Result<(), BinaryError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(self.err("the end of the body"))
        }
    }
}

fn json_payload(bytes: &[u8], at: usize, body: &'static str) -> Result<String, BinaryError> {
    let bad = || BinaryError { body, offset: at, expected: "a payload that is one UTF-8 JSON document".into() };
    let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
    serde_json::from_str::<&serde_json::value::RawValue>(text).map_err(|_| bad())?;
    Ok(text.to_string())
}

fn decompress(z: &[u8], limit: usize, r: &Reader<'_>, what: &str) -> Result<Vec<u8>, BinaryError> {
    decompress_frames(z, limit).map_err(|e| match e {
        SegmentError::TooLarge { limit } => r.err(format!("{what} that decompresses within {limit} bytes")),
        SegmentError::Corrupt(_) => r.err(format!("{what} as one zstd frame")),
    })
}

/// Pre-framed groups (`QPB1` flag 8, and every `QTB1` group): each group's
/// `z` decompresses to exactly `n` stored frames, flags 0, non-empty
/// transactionIds, JSON payloads.
fn framed_groups(
    r: &mut Reader<'_>,
    limit: usize,
    out: &mut Vec<BinaryItem>,
    mut verbatim: Option<&mut Vec<FramedGroup>>,
) -> Result<(), BinaryError> {
    let groups = r.u32("u32 group count")?;
    let mut budget = limit;
    for _ in 0..groups {
        let queue: Arc<str> = r.str16("str16 queue")?.into();
        let partition: Arc<str> = r.str16("str16 partition")?.into();
        let n = r.u32("u32 message count")? as usize;
        let z_len = r.u32("u32 compressed length")? as usize;
        let z_at = r.base + r.pos;
        let z = r.take(z_len, "compressed frames")?;
        let frames = decompress(z, budget, r, "compressed frames")?;
        budget = budget.saturating_sub(frames.len());
        let first = out.len();
        let mut stampless = true;
        let mut count = 0;
        for f in FrameReader::new(&frames) {
            let f = f.map_err(|CodecError { offset, expected }| BinaryError {
                body: r.body,
                offset: z_at,
                expected: format!("stored frames ({expected} at byte {offset} of the decompressed group)"),
            })?;
            if f.encrypted || f.transaction_id.is_empty() {
                return Err(BinaryError { body: r.body, offset: z_at, expected: "frames with flags 0 and a transactionId".into() });
            }
            stampless &= f.producer_sub.is_none();
            out.push(BinaryItem {
                queue: queue.clone(),
                partition: partition.clone(),
                transaction_id: Some(f.transaction_id.to_string()),
                message_id: Some(f.message_id),
                trace_id: f.trace_id,
                payload: json_payload(f.payload_json(), z_at, r.body)?,
            });
            count += 1;
        }
        if count != n {
            return Err(BinaryError { body: r.body, offset: z_at, expected: format!("{n} frames in the group, found {count}") });
        }
        let one_frame = zstd::zstd_safe::find_frame_compressed_size(z).is_ok_and(|size| size == z.len());
        if let Some(groups) = verbatim.as_deref_mut() {
            if one_frame && stampless && n > 0 {
                groups.push(FramedGroup { items: first..out.len(), blob: z.to_vec() });
            }
        }
    }
    Ok(())
}

/// Parses a `QPB1` push body. `limit` bounds the decompressed size.
pub fn parse_push(body: &[u8], limit: usize) -> Result<BinaryPush, BinaryError> {
    let mut r = Reader { body: "QPB1", buf: body, pos: 0, base: 0 };
    if r.take(4, "magic QPB1")? != b"QPB1" {
        return Err(BinaryError { body: "QPB1", offset: 0, expected: "magic QPB1".into() });
    }
    let flags = r.u8("flags byte")?;
    if flags & !(FLAG_ZSTD | FLAG_COUNTS | FLAG_TXN | FLAG_FRAMES) != 0 || flags & (FLAG_ZSTD | FLAG_FRAMES) == (FLAG_ZSTD | FLAG_FRAMES) {
        return Err(BinaryError { body: "QPB1", offset: 4, expected: "flags from {1, 2, 4, 8} without 1 and 8 together".into() });
    }
    let mut items = Vec::new();
    if flags & FLAG_FRAMES != 0 {
        let mut groups = Vec::new();
        framed_groups(&mut r, limit, &mut items, Some(&mut groups))?;
        r.done()?;
        return Ok(BinaryPush { counts_only: flags & FLAG_COUNTS != 0, items, groups });
    }
    let owned;
    let mut r = if flags & FLAG_ZSTD != 0 {
        let raw_len = r.u32("u32 raw length")? as usize;
        if raw_len > limit {
            return Err(r.err(format!("a raw length within {limit} bytes")));
        }
        let z = &body[r.pos..];
        owned = decompress(z, raw_len, &r, "a zstd body")?;
        if owned.len() != raw_len {
            return Err(r.err(format!("a body of the announced {raw_len} bytes")));
        }
        Reader { body: "QPB1 (decompressed)", buf: &owned, pos: 0, base: 0 }
    } else {
        r
    };
    let groups = r.u32("u32 group count")?;
    for _ in 0..groups {
        let queue: Arc<str> = r.str16("str16 queue")?.into();
        let partition: Arc<str> = r.str16("str16 partition")?.into();
        let n = r.u32("u32 item count")?;
        for _ in 0..n {
            let transaction_id = if flags & FLAG_TXN != 0 { Some(r.str16("str16 transactionId")?).filter(|t| !t.is_empty()) } else { None };
            let len = r.u32("u32 payload length")? as usize;
            let at = r.base + r.pos;
            let payload = json_payload(r.take(len, "payload")?, at, r.body)?;
            items.push(BinaryItem { queue: queue.clone(), partition: partition.clone(), transaction_id, message_id: None, trace_id: None, payload });
        }
    }
    r.done()?;
    Ok(BinaryPush { counts_only: flags & FLAG_COUNTS != 0, items, groups: Vec::new() })
}

/// A parsed `QTB1` transaction: the JSON head (its non-push operations) and
/// the pushed items in wire order.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryTransaction {
    pub counts_only: bool,
    pub head: String,
    pub items: Vec<BinaryItem>,
}

pub fn parse_transaction(body: &[u8], limit: usize) -> Result<BinaryTransaction, BinaryError> {
    let mut r = Reader { body: "QTB1", buf: body, pos: 0, base: 0 };
    if r.take(4, "magic QTB1")? != b"QTB1" {
        return Err(BinaryError { body: "QTB1", offset: 0, expected: "magic QTB1".into() });
    }
    let flags = r.u8("flags byte")?;
    if flags & !FLAG_COUNTS != 0 {
        return Err(BinaryError { body: "QTB1", offset: 4, expected: "flags 0 or 2".into() });
    }
    let head_len = r.u32("u32 head length")? as usize;
    let at = r.pos;
    let head = r.take(head_len, "JSON head")?;
    let head = if head.is_empty() {
        "{}".to_string()
    } else {
        let text = std::str::from_utf8(head).map_err(|_| BinaryError { body: "QTB1", offset: at, expected: "a UTF-8 JSON head".into() })?;
        serde_json::from_str::<&serde_json::value::RawValue>(text)
            .map_err(|_| BinaryError { body: "QTB1", offset: at, expected: "a JSON object head".into() })?;
        text.to_string()
    };
    let mut items = Vec::new();
    framed_groups(&mut r, limit, &mut items, None)?;
    r.done()?;
    Ok(BinaryTransaction { counts_only: flags & FLAG_COUNTS != 0, head, items })
}

/// One claimed partition of a framed pop answer.
pub struct FramedClaim<'a> {
    pub partition_id: u64,
    pub partition: &'a str,
    pub start: u64,
    pub end: u64,
    pub delivery_attempt: u32,
    /// (base_offset, created_at in µs, frame count, zstd blob as stored).
    pub records: Vec<(u64, i64, u32, &'a [u8])>,
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    let bytes = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Writes a `QPF1` answer. Stored segments travel as they are (codec 1); the
/// client slices each by `start..=end`. `own_json`, when given, rides as
/// version 1.
pub fn encode_pop_frames(queue: &str, lease_id: &str, group: &str, own_json: Option<&str>, claims: &[FramedClaim<'_>]) -> Vec<u8> {
    let size: usize = claims.iter().flat_map(|c| c.records.iter()).map(|r| r.3.len() + 32).sum();
    let mut out = Vec::with_capacity(64 + size);
    out.extend_from_slice(b"QPF1");
    match own_json {
        Some(j) => {
            out.push(1);
            out.extend_from_slice(&(j.len() as u32).to_le_bytes());
            out.extend_from_slice(j.as_bytes());
        }
        None => out.push(0),
    }
    put_str16(&mut out, queue);
    put_str16(&mut out, lease_id);
    put_str16(&mut out, group);
    out.extend_from_slice(&(claims.len() as u32).to_le_bytes());
    for c in claims {
        out.extend_from_slice(&c.partition_id.to_le_bytes());
        put_str16(&mut out, c.partition);
        out.extend_from_slice(&c.start.to_le_bytes());
        out.extend_from_slice(&c.end.to_le_bytes());
        out.extend_from_slice(&c.delivery_attempt.to_le_bytes());
        out.extend_from_slice(&(c.records.len() as u32).to_le_bytes());
        for (base, created_us, count, blob) in &c.records {
            out.extend_from_slice(&base.to_le_bytes());
            out.extend_from_slice(&created_us.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
            out.push(1);
            out.extend_from_slice(&(blob.len() as u32).to_le_bytes());
            out.extend_from_slice(blob);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{compress_frames, Frame};

    /// The worked example of API.md §3.1.
    fn worked_example() -> Vec<u8> {
        let mut b = b"QPB1".to_vec();
        b.push(4);
        b.extend_from_slice(&2u32.to_le_bytes());
        for (q, p, items) in [("orders", "p1", vec![("t1", "{\"a\":1}"), ("", "[1,2]")]), ("orders", "Default", vec![("t3", "null")])] {
            put_str16(&mut b, q);
            put_str16(&mut b, p);
            b.extend_from_slice(&(items.len() as u32).to_le_bytes());
            for (t, payload) in items {
                put_str16(&mut b, t);
                b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
                b.extend_from_slice(payload.as_bytes());
            }
        }
        b
    }

    #[test]
    fn the_worked_example_parses() {
        let p = parse_push(&worked_example(), 1 << 20).unwrap();
        assert!(!p.counts_only);
        let got: Vec<(&str, &str, Option<&str>, &str)> =
            p.items.iter().map(|i| (&*i.queue, &*i.partition, i.transaction_id.as_deref(), i.payload.as_str())).collect();
        assert_eq!(got, [("orders", "p1", Some("t1"), "{\"a\":1}"), ("orders", "p1", None, "[1,2]"), ("orders", "Default", Some("t3"), "null")]);
    }

    #[test]
    fn truncated_and_lying_bodies_name_the_offset() {
        let body = worked_example();
        for cut in [3, 5, 9, 20, body.len() - 1] {
            let e = parse_push(&body[..cut], 1 << 20).unwrap_err();
            assert!(e.offset <= cut, "{e}");
        }
        let mut lying = body.clone();
        lying[5] = 3; // three groups announced, two present
        assert!(parse_push(&lying, 1 << 20).unwrap_err().expected.contains("str16 queue"));
        let mut bad_json = body.clone();
        let n = bad_json.len();
        bad_json[n - 1] = b'x'; // "nulx"
        assert!(parse_push(&bad_json, 1 << 20).unwrap_err().expected.contains("JSON"));
        let mut flags = body;
        flags[4] = 1 | 8;
        assert_eq!(parse_push(&flags, 1 << 20).unwrap_err().offset, 4);
    }

    #[test]
    fn a_zstd_body_parses_and_its_bound_holds() {
        let plain = worked_example();
        let mut z = b"QPB1".to_vec();
        z.push(4 | 1);
        z.extend_from_slice(&((plain.len() - 5) as u32).to_le_bytes());
        z.extend_from_slice(&compress_frames(&plain[5..], 3));
        assert_eq!(parse_push(&z, 1 << 20).unwrap().items.len(), 3);
        assert!(parse_push(&z, 10).is_err(), "the decompressed size counts against the limit");
    }

    fn framed_body(magic: &[u8], flags: u8, n_claimed: u32) -> Vec<u8> {
        let mut frames = Vec::new();
        for (t, p) in [("a", "1"), ("b", "{\"x\":2}")] {
            Frame { message_id: Uuid::now_v7(), trace_id: None, transaction_id: t, producer_sub: None, encrypted: false, payload: p.as_bytes() }
                .encode_into(&mut frames).expect("test frame fits");
        }
        let z = compress_frames(&frames, 3);
        let mut b = magic.to_vec();
        b.push(flags);
        if magic == b"QTB1" {
            let head = br#"{"operations":[],"requiredLeases":[]}"#;
            b.extend_from_slice(&(head.len() as u32).to_le_bytes());
            b.extend_from_slice(head);
        }
        b.extend_from_slice(&1u32.to_le_bytes());
        put_str16(&mut b, "q");
        put_str16(&mut b, "p");
        b.extend_from_slice(&n_claimed.to_le_bytes());
        b.extend_from_slice(&(z.len() as u32).to_le_bytes());
        b.extend_from_slice(&z);
        b
    }

    #[test]
    fn a_single_frame_group_without_producer_is_offered_verbatim() {
        let body = framed_body(b"QPB1", 8, 2);
        let p = parse_push(&body, 1 << 20).unwrap();
        assert_eq!(p.groups.len(), 1);
        assert_eq!(p.groups[0].items, 0..2);
        let z_len = u32::from_le_bytes(body[19..23].try_into().unwrap()) as usize;
        assert_eq!(p.groups[0].blob, body[23..23 + z_len].to_vec(), "the blob is the client's bytes");

        // Two concatenated zstd frames decode fine but are not one segment blob.
        let mut frames = Vec::new();
        Frame { message_id: Uuid::now_v7(), trace_id: None, transaction_id: "a", producer_sub: None, encrypted: false, payload: b"1" }
            .encode_into(&mut frames).expect("test frame fits");
        let mut z = compress_frames(&frames[..10], 3);
        z.extend(compress_frames(&frames[10..], 3));
        let p = parse_push(&one_group_push(1, &z), 1 << 20).unwrap();
        assert_eq!(p.items.len(), 1);
        assert!(p.groups.is_empty());

        // A frame naming a producer is restamped by the broker, so repacked.
        let mut stamped = Vec::new();
        Frame { message_id: Uuid::now_v7(), trace_id: None, transaction_id: "a", producer_sub: Some("me"), encrypted: false, payload: b"1" }
            .encode_into(&mut stamped).expect("test frame fits");
        let z = compress_frames(&stamped, 3);
        assert!(parse_push(&one_group_push(1, &z), 1 << 20).unwrap().groups.is_empty());
    }

    /// A `QPB1` flag-8 body of one group ("q", "p") of `n` frames in `z`.
    fn one_group_push(n: u32, z: &[u8]) -> Vec<u8> {
        let mut b = b"QPB1".to_vec();
        b.push(8);
        b.extend_from_slice(&1u32.to_le_bytes());
        put_str16(&mut b, "q");
        put_str16(&mut b, "p");
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&(z.len() as u32).to_le_bytes());
        b.extend_from_slice(z);
        b
    }

    #[test]
    fn pre_framed_groups_keep_the_client_ids_and_check_the_count() {
        let p = parse_push(&framed_body(b"QPB1", 8, 2), 1 << 20).unwrap();
        assert_eq!(p.items.len(), 2);
        assert!(p.items.iter().all(|i| i.message_id.is_some()));
        assert_eq!(p.items[1].payload, "{\"x\":2}");
        assert!(parse_push(&framed_body(b"QPB1", 8, 3), 1 << 20).unwrap_err().expected.contains("3 frames"));
        let t = parse_transaction(&framed_body(b"QTB1", 0, 2), 1 << 20).unwrap();
        assert_eq!(t.items.len(), 2);
        assert!(t.head.contains("operations"));
    }

    #[test]
    fn a_framed_pop_answer_has_the_documented_layout() {
        let blob = [9u8, 9, 9];
        let claims = [FramedClaim { partition_id: 42, partition: "p1", start: 10, end: 11, delivery_attempt: 2, records: vec![(10, 1_700_000_000_123_456, 2, &blob[..])] }];
        let out = encode_pop_frames("orders", "L1", "g", None, &claims);
        let mut want = b"QPF1\0".to_vec();
        for s in ["orders", "L1", "g"] {
            put_str16(&mut want, s);
        }
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&42u64.to_le_bytes());
        put_str16(&mut want, "p1");
        want.extend_from_slice(&10u64.to_le_bytes());
        want.extend_from_slice(&11u64.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&10u64.to_le_bytes());
        want.extend_from_slice(&1_700_000_000_123_456i64.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.push(1);
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&blob);
        assert_eq!(out, want);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let mut qpb = b"QPB1".to_vec();
            qpb.extend_from_slice(&bytes);
            let _ = parse_push(&qpb, 1 << 16);
            let mut qtb = b"QTB1".to_vec();
            qtb.extend_from_slice(&bytes);
            let _ = parse_transaction(&qtb, 1 << 16);
        }
    }
}
