//! Operator-facing reads and repairs: dead letters and individual messages.
//! Answers are JSON shapes of API.md §2.8, built here; the HTTP layer only
//! parses parameters and picks the status.

pub mod configure;
pub mod dlq;
pub mod groups;
pub mod messages;
pub mod resources;
pub mod status;
pub mod switches;


/// A payload as an operator's read shows it: the JSON text, opened when it
/// is an envelope. An envelope that does not open shows as `null` with the
/// reason beside it (`decryptError`), so one unreadable message does not
/// hide a whole listing.
pub struct ShownPayload {
    pub json: Option<String>,
    pub decrypt_error: Option<String>,
}

impl ShownPayload {
    /// A stored frame's payload.
    pub fn of_frame(ring: Option<&crate::crypto::KeyRing>, f: &crate::log::Frame<'_>) -> ShownPayload {
        Self::from(crate::crypto::frame_payload(ring, f).map(|p| String::from_utf8_lossy(&p).into_owned()))
    }

    /// A dead letter's snapshot: plain JSON text, or an envelope bound to
    /// the message id.
    pub fn of_snapshot(ring: Option<&crate::crypto::KeyRing>, payload: Option<String>, sealed: Option<&[u8]>, message_id: &uuid::Uuid) -> ShownPayload {
        match sealed {
            None => ShownPayload { json: payload, decrypt_error: None },
            Some(env) => Self::from(crate::crypto::open(ring, env, message_id.as_bytes()).map(|p| String::from_utf8_lossy(&p).into_owned())),
        }
    }

    fn from(r: Result<String, crate::crypto::OpenError>) -> ShownPayload {
        match r {
            Ok(json) => ShownPayload { json: Some(json), decrypt_error: None },
            Err(e) => ShownPayload { json: None, decrypt_error: Some(format!("decrypt failed: {e}")) },
        }
    }

    /// Adds `decryptError` to an answer object when the payload did not open.
    pub fn note(&self, obj: &mut serde_json::Value) {
        if let Some(e) = &self.decrypt_error {
            obj["decryptError"] = serde_json::Value::String(e.clone());
        }
    }
}

/// A JSON document stored as text, spliced into an answer without re-parsing
/// into a tree (`null` when absent or not JSON).
pub fn raw_json(text: Option<String>) -> Box<serde_json::value::RawValue> {
    text.and_then(|t| serde_json::value::RawValue::from_string(t).ok())
        .unwrap_or_else(|| serde_json::value::RawValue::from_string("null".into()).expect("null is JSON"))
}
