//! Kafka record batches (message format v2, "magic 2"): the bytes a Produce
//! request carries and a Fetch answer returns.
//!
//! Written here rather than taken from `kafka-protocol`'s record codec for
//! two reasons the wire contract makes hard: that codec keeps a record's
//! headers in a map, so a header name that repeats loses all but one value,
//! and it decompresses a batch without a bound, so a few kilobytes of zstd
//! could ask for gigabytes. This one keeps headers as a list and stops any
//! batch at [`MAX_RECORDS_BYTES`] of decompressed records. The request and
//! response schemas around the batches stay the crate's.
//!
//! A batch (all integers big-endian):
//!
//! ```text
//! base_offset i64 | batch_length i32 | leader_epoch i32 | magic i8 = 2 | crc u32 (CRC-32C of
//! everything after it) | attributes i16 (bits 0-2 compression, 3 timestamp type, 4
//! transactional, 5 control) | last_offset_delta i32 | base_timestamp i64 | max_timestamp i64 |
//! producer_id i64 | producer_epoch i16 | base_sequence i32 | record_count i32 | records
//! ```
//!
//! and a record: `length varint | attributes i8 | timestamp_delta varlong |
//! offset_delta varint | key (varint length, -1 = null) | value (the same) |
//! header count varint | headers (name: varint length + UTF-8, value:
//! varint length, -1 = null)`. Pure code, unit tested here.

use std::io::Read;

use bytes::{BufMut, Bytes};

use super::records::KafkaRecord;

/// The most decompressed record bytes one batch may hold: a Produce frame
/// is at most `QUEEN_KAFKA_MAX_FRAME`, and a batch that inflates past this
/// is refused rather than read.
pub const MAX_RECORDS_BYTES: usize = 256 << 20;
const HEADER_LEN: usize = 61;

/// What is wrong with a batch (the partition answers CORRUPT_MESSAGE).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("truncated record batch")]
    Truncated,
    #[error("record batch magic {0} (only v2 batches are accepted)")]
    Magic(i8),
    #[error("record batch CRC mismatch")]
    Crc,
    #[error("unknown compression codec {0}")]
    Codec(i16),
    #[error("the records do not decompress: {0}")]
    Decompress(String),
    #[error("the records inflate past {MAX_RECORDS_BYTES} bytes")]
    TooLarge,
    #[error("malformed record: {0}")]
    Record(&'static str),
}

/// One decoded batch: its records and the producer fields the idempotent
/// producer will need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub records: Vec<KafkaRecord>,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub transactional: bool,
    pub control: bool,
}

/// Every batch of a Produce partition's `records`.
pub fn decode_all(mut buf: &[u8]) -> Result<Vec<Batch>, BatchError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        if buf.len() < 12 {
            return Err(BatchError::Truncated);
        }
        let len = i32::from_be_bytes(buf[8..12].try_into().expect("4 bytes"));
        let total = usize::try_from(len).ok().and_then(|l| l.checked_add(12)).ok_or(BatchError::Truncated)?;
        if total > buf.len() || total < HEADER_LEN {
            return Err(BatchError::Truncated);
        }
        out.push(decode(&buf[..total])?);
        buf = &buf[total..];
    }
    Ok(out)
}

fn decode(b: &[u8]) -> Result<Batch, BatchError> {
    let magic = b[16] as i8;
    if magic != 2 {
        return Err(BatchError::Magic(magic));
    }
    let crc = u32::from_be_bytes(b[17..21].try_into().expect("4 bytes"));
    if crc32c::crc32c(&b[21..]) != crc {
        return Err(BatchError::Crc);
    }
    let i16_at = |o: usize| i16::from_be_bytes(b[o..o + 2].try_into().expect("2 bytes"));
    let i32_at = |o: usize| i32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let i64_at = |o: usize| i64::from_be_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let attributes = i16_at(21);
    let base_timestamp = i64_at(27);
    let count = i32_at(57);
    let body = &b[HEADER_LEN..];
    let inflated;
    let records: &[u8] = match attributes & 7 {
        0 => body,
        codec => {
            inflated = decompress(codec, body)?;
            &inflated
        }
    };
    // A record is at least 7 bytes: a count larger than that allows is a lie.
    if count < 0 || count as usize > records.len() / 7 + 1 {
        return Err(BatchError::Record("record count"));
    }
    let mut r = Reader { b: records };
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = r.varint()?;
        let start = r.b.len();
        let _attributes = r.byte()?;
        let ts_delta = r.varlong()?;
        let _offset_delta = r.varint()?;
        let key = r.bytes()?;
        let value = r.bytes()?;
        let n = r.varint()?;
        if n < 0 || n as usize > r.b.len() {
            return Err(BatchError::Record("header count"));
        }
        let mut headers = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let name = r.bytes()?.ok_or(BatchError::Record("null header name"))?;
            let name = String::from_utf8(name.to_vec()).map_err(|_| BatchError::Record("header name is not UTF-8"))?;
            headers.push((name, r.bytes()?));
        }
        if len < 0 || start - r.b.len() != len as usize {
            return Err(BatchError::Record("record length"));
        }
        let timestamp = base_timestamp.checked_add(ts_delta).filter(|t| *t >= 0 && base_timestamp >= 0);
        out.push(KafkaRecord { key, value, headers, timestamp });
    }
    Ok(Batch {
        records: out,
        producer_id: i64_at(43),
        producer_epoch: i16_at(51),
        base_sequence: i32_at(53),
        transactional: attributes & 0x10 != 0,
        control: attributes & 0x20 != 0,
    })
}

/// Decompresses a batch's records, at most [`MAX_RECORDS_BYTES`].
fn decompress(codec: i16, body: &[u8]) -> Result<Vec<u8>, BatchError> {
    let err = |e: std::io::Error| BatchError::Decompress(e.to_string());
    let mut out = Vec::new();
    let limit = MAX_RECORDS_BYTES as u64 + 1;
    match codec {
        1 => flate2::read::GzDecoder::new(body).take(limit).read_to_end(&mut out).map_err(err)?,
        2 => return snappy(body),
        3 => lz4::Decoder::new(body).map_err(err)?.take(limit).read_to_end(&mut out).map_err(err)?,
        4 => zstd::stream::read::Decoder::new(body).map_err(err)?.take(limit).read_to_end(&mut out).map_err(err)?,
        other => return Err(BatchError::Codec(other)),
    };
    if out.len() > MAX_RECORDS_BYTES {
        return Err(BatchError::TooLarge);
    }
    Ok(out)
}

/// Kafka's snappy: the Java client's framing (a magic header, then blocks
/// each prefixed by its length), or one raw snappy block from clients that
/// do not frame (librdkafka frames, as the Java client does).
fn snappy(body: &[u8]) -> Result<Vec<u8>, BatchError> {
    const MAGIC: &[u8] = b"\x82SNAPPY\x00";
    let raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), BatchError> {
        let n = snap::raw::decompress_len(block).map_err(|e| BatchError::Decompress(e.to_string()))?;
        if out.len() + n > MAX_RECORDS_BYTES {
            return Err(BatchError::TooLarge);
        }
        let at = out.len();
        out.resize(at + n, 0);
        snap::raw::Decoder::new().decompress(block, &mut out[at..]).map_err(|e| BatchError::Decompress(e.to_string()))?;
        Ok(())
    };
    let mut out = Vec::new();
    if !body.starts_with(MAGIC) {
        raw(body, &mut out)?;
        return Ok(out);
    }
    // The magic, then a version and a compatible version (two i32s).
    let mut rest = body.get(16..).ok_or(BatchError::Truncated)?;
    while !rest.is_empty() {
        let len = rest.get(..4).ok_or(BatchError::Truncated)?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let block = rest.get(4..4 + len).ok_or(BatchError::Truncated)?;
        raw(block, &mut out)?;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, BatchError> {
        let (&first, rest) = self.b.split_first().ok_or(BatchError::Record("truncated"))?;
        self.b = rest;
        Ok(first)
    }

    /// A zigzag varlong.
    fn varlong(&mut self) -> Result<i64, BatchError> {
        let mut v: u64 = 0;
        for shift in (0..70).step_by(7) {
            let byte = self.byte()?;
            v |= u64::from(byte & 0x7f).checked_shl(shift).ok_or(BatchError::Record("varint too long"))?;
            if byte & 0x80 == 0 {
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        Err(BatchError::Record("varint too long"))
    }

    fn varint(&mut self) -> Result<i32, BatchError> {
        i32::try_from(self.varlong()?).map_err(|_| BatchError::Record("varint out of range"))
    }

    /// Length-prefixed bytes; -1 is null.
    fn bytes(&mut self) -> Result<Option<Bytes>, BatchError> {
        match self.varint()? {
            -1 => Ok(None),
            n if n < 0 => Err(BatchError::Record("negative length")),
            n => {
                let n = n as usize;
                if n > self.b.len() {
                    return Err(BatchError::Record("truncated"));
                }
                let (v, rest) = self.b.split_at(n);
                self.b = rest;
                Ok(Some(Bytes::copy_from_slice(v)))
            }
        }
    }
}

fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_varlong(out, -1),
        Some(b) => {
            put_varlong(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

/// Appends one uncompressed v2 batch of `records` (offset, record,
/// timestamp) to `out`. Offsets must ascend; gaps are allowed (the deltas
/// carry them). A record without a timestamp takes `fallback_ts`'s.
pub fn encode(out: &mut Vec<u8>, records: &[(i64, KafkaRecord, i64)]) {
    let Some(((base, _, _), (last, _, _))) = records.first().zip(records.last()) else { return };
    let base_ts = records.iter().map(|(_, r, ts)| r.timestamp.unwrap_or(*ts)).min().unwrap_or(0);
    let max_ts = records.iter().map(|(_, r, ts)| r.timestamp.unwrap_or(*ts)).max().unwrap_or(0);
    let mut body = Vec::with_capacity(64 * records.len());
    let mut rec = Vec::with_capacity(256);
    for (offset, r, ts) in records {
        rec.clear();
        rec.push(0); // attributes
        put_varlong(&mut rec, r.timestamp.unwrap_or(*ts) - base_ts);
        put_varlong(&mut rec, offset - base);
        put_bytes(&mut rec, r.key.as_deref());
        put_bytes(&mut rec, r.value.as_deref());
        put_varlong(&mut rec, r.headers.len() as i64);
        for (name, value) in &r.headers {
            put_bytes(&mut rec, Some(name.as_bytes()));
            put_bytes(&mut rec, value.as_deref());
        }
        put_varlong(&mut body, rec.len() as i64);
        body.extend_from_slice(&rec);
    }
    // Everything the CRC covers, from the attributes on.
    let mut tail = Vec::with_capacity(40 + body.len());
    tail.put_i16(0); // attributes: no compression, CreateTime, not transactional
    tail.put_i32((last - base) as i32);
    tail.put_i64(base_ts);
    tail.put_i64(max_ts);
    tail.put_i64(-1); // producer id
    tail.put_i16(-1); // producer epoch
    tail.put_i32(-1); // base sequence
    tail.put_i32(records.len() as i32);
    tail.extend_from_slice(&body);
    out.put_i64(*base);
    out.put_i32((4 + 1 + 4 + tail.len()) as i32); // from the leader epoch to the end
    out.put_i32(0); // partition leader epoch
    out.put_i8(2);
    out.put_u32(crc32c::crc32c(&tail));
    out.extend_from_slice(&tail);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&'static [u8]>, value: Option<&'static [u8]>, headers: &[(&str, Option<&'static [u8]>)], ts: Option<i64>) -> KafkaRecord {
        KafkaRecord {
            key: key.map(Bytes::from_static),
            value: value.map(Bytes::from_static),
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.map(Bytes::from_static))).collect(),
            timestamp: ts,
        }
    }

    #[test]
    fn a_batch_round_trips_with_repeated_headers_null_and_empty_and_offset_gaps() {
        let records = vec![
            (10, record(Some(b"k"), Some(b"v"), &[("h", Some(b"1")), ("h", None), ("h", Some(b""))], Some(1_000)), 0),
            (11, record(None, None, &[], None), 5_000),
            (15, record(Some(b""), Some(b"\x00\xff"), &[], Some(999)), 0),
        ];
        let mut out = Vec::new();
        encode(&mut out, &records);
        let batches = decode_all(&out).unwrap();
        assert_eq!(batches.len(), 1);
        let mut want: Vec<KafkaRecord> = records.iter().map(|(_, r, _)| r.clone()).collect();
        want[1].timestamp = Some(5_000); // the fallback became the record's time
        assert_eq!(batches[0].records, want);
        assert_eq!((batches[0].producer_id, batches[0].base_sequence), (-1, -1));
    }

    #[test]
    fn a_flipped_bit_a_truncation_and_a_lying_count_are_refused_never_a_panic() {
        let mut out = Vec::new();
        encode(&mut out, &[(0, record(Some(b"k"), Some(b"value"), &[], Some(1)), 0)]);
        let mut bad = out.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(decode_all(&bad), Err(BatchError::Crc));
        for cut in 0..out.len() {
            assert!(decode_all(&out[..cut]).is_err() || cut == 0, "a batch cut at {cut} decoded");
        }
        let mut magic = out.clone();
        magic[16] = 1;
        assert_eq!(decode_all(&magic), Err(BatchError::Magic(1)));
        // Every byte of a valid batch changed in turn: errors, not panics.
        for i in 0..out.len() {
            for v in [0u8, 0x7f, 0x80, 0xff] {
                let mut m = out.clone();
                m[i] = v;
                let _ = decode_all(&m);
            }
        }
    }

    #[test]
    fn each_codec_decompresses_within_the_bound() {
        use std::io::Write;
        let plain = b"some records, repeated; some records, repeated".repeat(100);
        let gz = {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&plain).unwrap();
            e.finish().unwrap()
        };
        assert_eq!(decompress(1, &gz).unwrap(), plain);
        let raw_snappy = snap::raw::Encoder::new().compress_vec(&plain).unwrap();
        assert_eq!(decompress(2, &raw_snappy).unwrap(), plain);
        let mut framed = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
        framed.extend_from_slice(&(raw_snappy.len() as u32).to_be_bytes());
        framed.extend_from_slice(&raw_snappy);
        assert_eq!(decompress(2, &framed).unwrap(), plain);
        let lz = {
            let mut e = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
            e.write_all(&plain).unwrap();
            e.finish().0
        };
        assert_eq!(decompress(3, &lz).unwrap(), plain);
        assert_eq!(decompress(4, &zstd::encode_all(&plain[..], 3).unwrap()).unwrap(), plain);
        assert_eq!(decompress(5, b""), Err(BatchError::Codec(5)));
        // A bomb: 300 MiB of zeros in a few hundred kilobytes.
        let bomb = zstd::encode_all(std::io::repeat(0).take(300 << 20), 1).unwrap();
        assert_eq!(decompress(4, &bomb), Err(BatchError::TooLarge));
    }
}
