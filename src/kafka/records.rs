//! Kafka records as Queen payloads, and back (docs/KAFKA.md, "The record
//! envelope").
//!
//! Every Queen payload is JSON, and a Kafka record is bytes: a key, a value,
//! ordered headers whose names may repeat, a timestamp. A record produced
//! through Kafka is stored as one JSON object marked `"$kafka": 1`, with the
//! bytes in base64 and null kept apart from empty, so a round trip is byte
//! exact. A payload without the mark (a message pushed over HTTP) reads as a
//! record with a null key, no headers and the payload's JSON text as its
//! value.
//!
//! Pure code: no I/O, unit tested here.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;

/// One record as the Kafka side sees it. Headers keep their order and
/// repeats (the crate's own `Record` keeps headers in a map, which would
/// drop a repeated name).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KafkaRecord {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
    /// CreateTime in ms; None when the producer set none (-1).
    pub timestamp: Option<i64>,
}

/// Why a record cannot be stored.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("a header name holds a NUL character")]
    NulInHeaderName,
}

/// The stored JSON of a record.
pub fn envelope(r: &KafkaRecord) -> Result<String, EnvelopeError> {
    let b64 = |b: &Option<Bytes>| -> serde_json::Value {
        match b {
            None => serde_json::Value::Null,
            Some(b) => serde_json::Value::String(STANDARD.encode(b)),
        }
    };
    let mut headers = Vec::with_capacity(r.headers.len());
    for (name, value) in &r.headers {
        if name.contains('\0') {
            return Err(EnvelopeError::NulInHeaderName);
        }
        headers.push(serde_json::json!([name, b64(value)]));
    }
    let mut object = serde_json::Map::with_capacity(5);
    object.insert("$kafka".into(), 1.into());
    object.insert("key".into(), b64(&r.key));
    object.insert("value".into(), b64(&r.value));
    object.insert("headers".into(), serde_json::Value::Array(headers));
    object.insert("timestamp".into(), r.timestamp.map_or(serde_json::Value::Null, Into::into));
    Ok(serde_json::Value::Object(object).to_string())
}

#[derive(Deserialize)]
struct Stored {
    #[serde(rename = "$kafka")]
    mark: i64,
    key: Option<String>,
    value: Option<String>,
    #[serde(default)]
    headers: Vec<(String, Option<String>)>,
    timestamp: Option<i64>,
}

/// The record a stored payload reads as. `payload` is the message's JSON.
pub fn from_payload(payload: &[u8]) -> KafkaRecord {
    // Cheap test first: an HTTP payload rarely starts with the mark's member.
    if payload.first() == Some(&b'{') && memchr_kafka(payload) {
        if let Ok(s) = serde_json::from_slice::<Stored>(payload) {
            if s.mark == 1 {
                let unb64 = |v: Option<String>| -> Result<Option<Bytes>, base64::DecodeError> {
                    v.map(|t| STANDARD.decode(t).map(Bytes::from)).transpose()
                };
                let decoded = (|| {
                    let headers = s
                        .headers
                        .into_iter()
                        .map(|(n, v)| Ok((n, unb64(v)?)))
                        .collect::<Result<Vec<_>, base64::DecodeError>>()?;
                    Ok::<_, base64::DecodeError>(KafkaRecord { key: unb64(s.key)?, value: unb64(s.value)?, headers, timestamp: s.timestamp })
                })();
                if let Ok(r) = decoded {
                    return r;
                }
            }
        }
    }
    KafkaRecord { key: None, value: Some(Bytes::copy_from_slice(payload)), headers: Vec::new(), timestamp: None }
}

/// Whether the bytes hold the envelope's mark at all.
fn memchr_kafka(payload: &[u8]) -> bool {
    payload.windows(8).any(|w| w == b"\"$kafka\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_the_envelope_byte_for_byte_with_null_apart_from_empty() {
        let records = [
            KafkaRecord {
                key: Some(Bytes::from_static(b"k\x00\xff")),
                value: Some(Bytes::from_static(b"")),
                headers: vec![
                    ("trace".into(), Some(Bytes::from_static(b"\x01\x02"))),
                    ("trace".into(), None),
                    ("ünï".into(), Some(Bytes::new())),
                ],
                timestamp: Some(1_764_936_000_123),
            },
            KafkaRecord { key: None, value: None, headers: vec![], timestamp: None },
            KafkaRecord { key: Some(Bytes::new()), value: Some(Bytes::from_static(b"{\"a\":1}")), headers: vec![], timestamp: Some(0) },
        ];
        for r in records {
            let stored = envelope(&r).unwrap();
            serde_json::from_str::<serde_json::Value>(&stored).expect("the envelope is JSON");
            assert_eq!(from_payload(stored.as_bytes()), r, "{stored}");
        }
    }

    #[test]
    fn a_payload_pushed_over_http_reads_as_its_json_text_with_a_null_key() {
        for payload in [&b"{\"total\":4200}"[..], b"[1,2]", b"\"text\"", b"{\"$kafka\":2,\"key\":null}", b"{\"$kafka\":1,\"value\":\"%%%\"}"] {
            let r = from_payload(payload);
            assert_eq!((r.key, r.value.as_deref(), r.headers.len(), r.timestamp), (None, Some(payload), 0, None));
        }
    }

    #[test]
    fn a_header_name_with_a_nul_is_refused() {
        let r = KafkaRecord { headers: vec![("a\0b".into(), None)], ..Default::default() };
        assert_eq!(envelope(&r), Err(EnvelopeError::NulInHeaderName));
    }
}
