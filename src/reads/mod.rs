//! The read side of the log that takes no lease and moves no cursor: reads
//! by offset, partition discovery, traces (their one write beside their
//! reads) and the analytics family (issue 28). Two readers asking the same question get the same
//! answer, and no consumer group notices them.

pub mod analytics;
pub mod changed;
pub mod fetch;
pub mod traces;

use serde_json::Value;

/// The per-entry error of a name that does not exist (the client's word).
pub const UNKNOWN_TOPIC_OR_PARTITION: &str = "UNKNOWN_TOPIC_OR_PARTITION";

/// The `entries` array of a reads body: from 1 to `max` of them.
fn entries(body: &Value, max: usize) -> Result<&[Value], String> {
    let entries = body.get("entries").and_then(Value::as_array).ok_or("entries: required, an array")?;
    if entries.is_empty() || entries.len() > max {
        return Err(format!("entries: from 1 to {max} entries, got {}", entries.len()));
    }
    Ok(entries)
}

/// Entry `i`'s queue: a non-empty string.
fn entry_queue(e: &Value, i: usize) -> Result<String, String> {
    e.get("queue")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("entries[{i}].queue: required, a non-empty string"))
}
