//! Operator-facing reads and repairs: dead letters and individual messages.
//! Answers are JSON shapes of API.md §2.8, built here; the HTTP layer only
//! parses parameters and picks the status.

pub mod configure;
pub mod dlq;
pub mod groups;
pub mod messages;
pub mod resources;
pub mod status;

use chrono::{DateTime, Utc};

/// Listing timestamps: milliseconds, UTC, literal `Z` (API.md §6 A-14).
pub fn iso_ms(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// A JSON document stored as text, spliced into an answer without re-parsing
/// into a tree (`null` when absent or not JSON).
pub fn raw_json(text: Option<String>) -> Box<serde_json::value::RawValue> {
    text.and_then(|t| serde_json::value::RawValue::from_string(t).ok())
        .unwrap_or_else(|| serde_json::value::RawValue::from_string("null".into()).expect("null is JSON"))
}
