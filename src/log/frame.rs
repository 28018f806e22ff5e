//! The stored frame (API.md §3.2): one message as it sits inside a segment.
//!
//! ```text
//! frame := u32 body_len | body[body_len]
//! body  := u8 flags | u8[16] message_id | [u8[16] trace_id if flags&1]
//!          | str16 transactionId | [str16 producer_sub if flags&2] | payload
//! ```
//!
//! The same layout is shipped to clients in framed pops and accepted from them
//! in pre-compressed binary pushes, so the broker can move frames between the
//! wire and PostgreSQL without re-encoding them. The payload carries no length
//! of its own: it is whatever remains of the body, and an empty payload means
//! JSON `null`.

use uuid::Uuid;

/// Flag bit: a 16-byte trace id follows the message id.
pub const FLAG_TRACE: u8 = 1;
/// Flag bit: a producer subject (the JWT `sub`) follows the transaction id.
pub const FLAG_PRODUCER_SUB: u8 = 2;
/// Flag bit: the payload is an encryption envelope, not plain JSON.
pub const FLAG_ENCRYPTED: u8 = 4;
const KNOWN_FLAGS: u8 = FLAG_TRACE | FLAG_PRODUCER_SUB | FLAG_ENCRYPTED;

/// Largest string a `str16` field can carry.
pub const MAX_STR16: usize = u16::MAX as usize;

/// One message, borrowed from the bytes it was decoded from (or about to be
/// encoded into). Borrowing keeps payloads as raw slices: the broker never
/// parses and re-serializes a payload on the way through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    pub message_id: Uuid,
    pub trace_id: Option<Uuid>,
    pub transaction_id: &'a str,
    pub producer_sub: Option<&'a str>,
    pub encrypted: bool,
    pub payload: &'a [u8],
}

/// The 64-bit identity of a transactionId inside a partition, as the dedup
/// memory, the segments' hash arrays and the broker's in-request checks keep
/// it: SipHash-1-3 keyed with the database's secret (`queen.dedup_key`,
/// migration 0025). Keyed, because the hash decides what is a duplicate: with
/// a public function a producer could craft an id that collides with another
/// producer's and have that message answered "duplicate" and dropped. Every
/// broker of one database reads the same key, so they agree on every value.
#[derive(Clone)]
pub struct TxnHasher(siphasher::sip::SipHasher13);

impl TxnHasher {
    /// The hasher of a database whose key is `key`.
    pub fn new(key: &[u8; 16]) -> TxnHasher {
        TxnHasher(siphasher::sip::SipHasher13::new_with_key(key))
    }

    /// The hash of `transaction_id`'s UTF-8 bytes, as a signed integer (the
    /// `bigint` PostgreSQL stores).
    pub fn hash(&self, transaction_id: &str) -> i64 {
        self.0.hash(transaction_id.as_bytes()) as i64
    }
}

impl std::fmt::Debug for TxnHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TxnHasher(<keyed>)") // the key stays out of logs
    }
}

/// The unkeyed hash of the legacy transaction index (`queen.txn_index`,
/// written only before migration 0019 and read until its entries age out):
/// xxh3-64 of the id's UTF-8 bytes, as those rows were keyed. Nothing new is
/// written with it.
pub fn legacy_index_hash(transaction_id: &str) -> i64 {
    xxhash_rust::xxh3::xxh3_64(transaction_id.as_bytes()) as i64
}

/// A string too long for its frame field: nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} is {len} bytes; a frame holds at most {MAX_STR16}")]
pub struct FrameTooLong {
    pub field: &'static str,
    pub len: usize,
}

/// A frame, or a run of frames, that does not parse. `offset` is the byte
/// position (inside the decompressed frame run) where parsing failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed frame at byte {offset}: expected {expected}")]
pub struct CodecError {
    pub offset: usize,
    pub expected: &'static str,
}

impl<'a> Frame<'a> {
    /// Bytes this frame occupies once encoded, length prefix included.
    pub fn encoded_len(&self) -> usize {
        4 + 1
            + 16
            + if self.trace_id.is_some() { 16 } else { 0 }
            + 2
            + self.transaction_id.len()
            + self.producer_sub.map_or(0, |s| 2 + s.len())
            + self.payload.len()
    }

    /// Appends the encoded frame to `out`, or nothing when a string does not
    /// fit its `str16` field.
    ///
    /// Requests are checked at the edge (a transactionId of at most 1024
    /// bytes, a JWT `sub` of at most 1024), so an error here means a path
    /// that skipped its check: it is answered as an error, never a panic.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), FrameTooLong> {
        if self.transaction_id.len() > MAX_STR16 {
            return Err(FrameTooLong { field: "transactionId", len: self.transaction_id.len() });
        }
        if let Some(s) = self.producer_sub.filter(|s| s.len() > MAX_STR16) {
            return Err(FrameTooLong { field: "producer subject", len: s.len() });
        }
        let body_len = self.encoded_len() - 4;
        out.reserve(self.encoded_len());
        out.extend_from_slice(&(body_len as u32).to_le_bytes());
        let mut flags = 0u8;
        if self.trace_id.is_some() {
            flags |= FLAG_TRACE;
        }
        if self.producer_sub.is_some() {
            flags |= FLAG_PRODUCER_SUB;
        }
        if self.encrypted {
            flags |= FLAG_ENCRYPTED;
        }
        out.push(flags);
        out.extend_from_slice(self.message_id.as_bytes());
        if let Some(t) = self.trace_id {
            out.extend_from_slice(t.as_bytes());
        }
        put_str16(out, self.transaction_id);
        if let Some(s) = self.producer_sub {
            put_str16(out, s);
        }
        out.extend_from_slice(self.payload);
        Ok(())
    }

    /// The payload as JSON text: an empty payload stands for `null`.
    pub fn payload_json(&self) -> &'a [u8] {
        if self.payload.is_empty() {
            b"null"
        } else {
            self.payload
        }
    }
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Iterates the frames of a decompressed run, validating each one.
pub struct FrameReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> FrameReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        FrameReader { buf, pos: 0 }
    }

    /// Decodes every frame, failing on the first malformed one.
    pub fn collect_all(buf: &'a [u8]) -> Result<Vec<Frame<'a>>, CodecError> {
        FrameReader::new(buf).collect()
    }

    fn bytes(&mut self, n: usize, expected: &'static str) -> Result<&'a [u8], CodecError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(CodecError { offset: self.pos, expected }),
        }
    }

    fn next_frame(&mut self) -> Result<Frame<'a>, CodecError> {
        let len_bytes = self.bytes(4, "u32 frame length")?;
        let body_len = u32::from_le_bytes(len_bytes.try_into().expect("4 bytes")) as usize;
        let body_start = self.pos;
        let body = self.bytes(body_len, "frame body of the announced length")?;
        let mut inner = FrameReader { buf: body, pos: 0 };
        let at = |e: CodecError| CodecError { offset: body_start + e.offset, expected: e.expected };
        let flags = inner.bytes(1, "flags byte").map_err(at)?[0];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(CodecError { offset: body_start, expected: "flags with only bits 1, 2 and 4" });
        }
        let message_id = Uuid::from_slice(inner.bytes(16, "16-byte message id").map_err(at)?)
            .expect("16 bytes make a uuid");
        let trace_id = if flags & FLAG_TRACE != 0 {
            Some(Uuid::from_slice(inner.bytes(16, "16-byte trace id").map_err(at)?).expect("16 bytes"))
        } else {
            None
        };
        let transaction_id = inner.str16("str16 transactionId").map_err(at)?;
        let producer_sub = if flags & FLAG_PRODUCER_SUB != 0 {
            Some(inner.str16("str16 producer subject").map_err(at)?)
        } else {
            None
        };
        let payload = &body[inner.pos..];
        Ok(Frame {
            message_id,
            trace_id,
            transaction_id,
            producer_sub,
            encrypted: flags & FLAG_ENCRYPTED != 0,
            payload,
        })
    }

    fn str16(&mut self, expected: &'static str) -> Result<&'a str, CodecError> {
        let start = self.pos;
        let len = u16::from_le_bytes(self.bytes(2, expected)?.try_into().expect("2 bytes")) as usize;
        let bytes = self.bytes(len, expected).map_err(|e| CodecError { offset: start, ..e })?;
        std::str::from_utf8(bytes).map_err(|_| CodecError { offset: start, expected: "UTF-8 string" })
    }
}

impl<'a> Iterator for FrameReader<'a> {
    type Item = Result<Frame<'a>, CodecError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let r = self.next_frame();
        if r.is_err() {
            // A malformed frame poisons the rest of the run: stop after reporting it.
            self.pos = self.buf.len();
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample<'a>(txn: &'a str, payload: &'a [u8]) -> Frame<'a> {
        Frame {
            message_id: Uuid::now_v7(),
            trace_id: None,
            transaction_id: txn,
            producer_sub: None,
            encrypted: false,
            payload,
        }
    }

    #[test]
    fn a_frame_encodes_to_the_documented_layout() {
        let id = Uuid::from_bytes([7; 16]);
        let f = Frame { message_id: id, ..sample("t1", br#"{"a":1}"#) };
        let mut out = Vec::new();
        f.encode_into(&mut out).expect("test frame fits");
        let mut expected = vec![];
        expected.extend_from_slice(&(1u32 + 16 + 2 + 2 + 7).to_le_bytes());
        expected.push(0);
        expected.extend_from_slice(&[7; 16]);
        expected.extend_from_slice(&[2, 0, b't', b'1']);
        expected.extend_from_slice(br#"{"a":1}"#);
        assert_eq!(out, expected);
        assert_eq!(out.len(), f.encoded_len());
    }

    #[test]
    fn an_empty_payload_reads_as_null() {
        let f = sample("t", b"");
        assert_eq!(f.payload_json(), b"null");
    }

    #[test]
    fn a_truncated_frame_names_the_offset_and_what_was_expected() {
        let mut out = Vec::new();
        sample("abc", b"[1,2,3]").encode_into(&mut out).expect("test frame fits");
        let cut = &out[..out.len() - 2];
        let err = FrameReader::collect_all(cut).unwrap_err();
        assert_eq!(err.offset, 4);
        assert_eq!(err.expected, "frame body of the announced length");
    }

    #[test]
    fn an_over_long_string_is_an_error_and_writes_nothing() {
        let long = "x".repeat(MAX_STR16 + 1);
        let mut out = vec![9u8];
        let err = sample(&long, b"1").encode_into(&mut out).unwrap_err();
        assert_eq!(err, FrameTooLong { field: "transactionId", len: MAX_STR16 + 1 });
        let stamped = Frame { producer_sub: Some(&long), ..sample("t", b"1") };
        let err = stamped.encode_into(&mut out).unwrap_err();
        assert_eq!(err.field, "producer subject");
        assert_eq!(out, vec![9u8], "a refused frame leaves the buffer as it was");
        // The longest string that fits still encodes and decodes.
        let edge = "y".repeat(MAX_STR16);
        sample(&edge, b"2").encode_into(&mut out).expect("the limit itself fits");
        let decoded = FrameReader::collect_all(&out[1..]).unwrap();
        assert_eq!(decoded[0].transaction_id, edge);
    }

    #[test]
    fn a_lying_transaction_id_length_is_refused() {
        let mut out = Vec::new();
        sample("abc", b"").encode_into(&mut out).expect("test frame fits");
        // The str16 length sits after 4 (len) + 1 (flags) + 16 (id).
        out[21] = 200;
        let err = FrameReader::collect_all(&out).unwrap_err();
        assert_eq!(err.expected, "str16 transactionId");
        assert_eq!(err.offset, 21);
    }

    #[test]
    fn unknown_flag_bits_are_refused() {
        let mut out = Vec::new();
        sample("abc", b"1").encode_into(&mut out).expect("test frame fits");
        out[4] = 0x80;
        assert!(FrameReader::collect_all(&out).is_err());
    }

    fn arb_uuid() -> impl Strategy<Value = Uuid> {
        any::<[u8; 16]>().prop_map(Uuid::from_bytes)
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(
            frames in proptest::collection::vec(
                (arb_uuid(), proptest::option::of(arb_uuid()), ".{0,40}",
                 proptest::option::of(".{0,20}"), any::<bool>(),
                 proptest::collection::vec(any::<u8>(), 0..200)),
                0..20)
        ) {
            let mut out = Vec::new();
            let originals: Vec<Frame<'_>> = frames.iter().map(|(id, trace, txn, sub, enc, payload)| Frame {
                message_id: *id,
                trace_id: *trace,
                transaction_id: txn.as_str(),
                producer_sub: sub.as_deref(),
                encrypted: *enc,
                payload: payload.as_slice(),
            }).collect();
            for f in &originals {
                f.encode_into(&mut out).expect("test frame fits");
            }
            let decoded = FrameReader::collect_all(&out).unwrap();
            prop_assert_eq!(decoded, originals);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            for f in FrameReader::new(&bytes) {
                if f.is_err() { break; }
            }
        }
    }
}
