//! `POST /api/v1/partitions/changed` (API.md §2.10): the partitions of a
//! queue written at or after `since`, in the order they were created, a
//! page at a time, with the `safeTime` up to which every write is counted.
//!
//! Pages follow the partition id (creation order) through an opaque `after`
//! cursor, filtering on `last_write_at`: that column changes on every push,
//! so it carries no index (an indexed column would cost every push its HOT
//! update), and a page walks the queue's partitions in id order instead.
//!
//! `safeTime` must never run ahead of a write the answer cannot see. A push
//! stamps `last_write_at` before it commits, so a transaction in flight when
//! the page is read may commit later with a stamp older than the page's
//! clock. The broker therefore reads the clock and the oldest running
//! transaction's start first, and the partitions after, in a later
//! snapshot: every write missing from the page belongs to a transaction
//! that was running at the first read (its stamp is at least its start,
//! hence at least `safeTime`) or started after it (later still).

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde_json::{json, Value};

use crate::db::DbError;

/// Most entries one call may carry.
pub const MAX_ENTRIES: usize = 64;
/// Partitions per page: the default and the ceiling.
pub const MAX_LIMIT: i64 = 1000;

pub use super::UNKNOWN_TOPIC_OR_PARTITION;
pub const BAD_CURSOR: &str = "BAD_CURSOR";

/// One entry of the request, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub queue: String,
    pub limit: i64,
    pub since: Option<DateTime<Utc>>,
    /// The raw cursor; a malformed one answers `BAD_CURSOR` for its entry.
    pub after: Option<String>,
}

/// Reads a request body; the error names the entry and the field.
pub fn parse(body: &Value) -> Result<Vec<Entry>, String> {
    let entries = super::entries(body, MAX_ENTRIES)?;
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let field = |k: &str, p: &str| format!("entries[{i}].{k}: {p}");
            let queue = super::entry_queue(e, i)?;
            let limit = match e.get("limit") {
                None | Some(Value::Null) => MAX_LIMIT,
                Some(v) => v.as_i64().filter(|l| (1..=MAX_LIMIT).contains(l)).ok_or_else(|| field("limit", "an integer from 1 to 1000"))?,
            };
            let since = match e.get("since") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(
                    DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc)).map_err(|_| field("since", "an ISO 8601 timestamp with its zone"))?,
                ),
                Some(_) => return Err(field("since", "an ISO 8601 timestamp with its zone")),
            };
            let after = match e.get("after") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => return Err(field("after", "the opaque string a previous page answered as next")),
            };
            Ok(Entry { queue, limit, since, after })
        })
        .collect()
}

/// The cursor after a partition id, and back.
fn cursor(id: i64) -> String {
    format!("p{id}")
}

fn from_cursor(c: &str) -> Option<i64> {
    c.strip_prefix('p')?.parse().ok().filter(|id: &i64| *id >= 0)
}

/// Answers the entries, index-aligned, with the call's `safeTime`.
pub async fn answer(pool: &Pool, entries: &[Entry]) -> Result<Value, DbError> {
    let client = pool.get().await?;
    // First the clock and the oldest running transaction (see the module
    // comment), then the pages in later snapshots.
    let safe: DateTime<Utc> = client
        .query_one(
            "SELECT LEAST(clock_timestamp(), COALESCE((SELECT min(xact_start) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
                       AND backend_type = 'client backend'), 'infinity'))",
            &[],
        )
        .await?
        .get(0);
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let after = match e.after.as_deref().map(from_cursor) {
            Some(None) => {
                out.push(json!({"partitions": [], "next": null, "error": BAD_CURSOR}));
                continue;
            }
            Some(Some(id)) => id,
            None => 0,
        };
        let Some(qid) = client.query_opt("SELECT id FROM queen.queues WHERE name = $1", &[&e.queue]).await?.map(|r| r.get::<_, i64>(0)) else {
            out.push(json!({"partitions": [], "next": null, "error": UNKNOWN_TOPIC_OR_PARTITION}));
            continue;
        };
        let rows = client
            .query(
                "SELECT id, name, last_offset, log_start, last_write_at FROM queen.partitions
                 WHERE queue_id = $1 AND id > $2 AND ($3::timestamptz IS NULL OR last_write_at >= $3)
                 ORDER BY id LIMIT $4",
                &[&qid, &after, &e.since, &e.limit],
            )
            .await?;
        let next = (rows.len() as i64 == e.limit).then(|| cursor(rows.last().expect("a full page").get(0)));
        let partitions: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({"name": r.get::<_, String>(1), "id": r.get::<_, i64>(0).to_string(), "lastOffset": r.get::<_, i64>(2),
                       "logStart": r.get::<_, i64>(3), "lastWriteAt": r.get::<_, Option<DateTime<Utc>>>(4).map(iso)})
            })
            .collect();
        out.push(json!({"partitions": partitions, "next": next}));
    }
    Ok(json!({"entries": out, "safeTime": iso(safe)}))
}

/// Every time this route answers, in one spelling (microseconds, `Z`), so
/// that the client may compare them as strings.
fn iso(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_read_and_every_bad_field_is_named() {
        let ok = parse(&json!({"entries": [{"queue": "q"}, {"queue": "r", "limit": 5, "since": "2026-01-01T00:00:00Z", "after": "p9"}]})).unwrap();
        assert_eq!(ok[0], Entry { queue: "q".into(), limit: 1000, since: None, after: None });
        assert_eq!(ok[1].limit, 5);
        assert_eq!(ok[1].after.as_deref(), Some("p9"));
        for (body, err) in [
            (json!({}), "entries: required, an array"),
            (json!({"entries": []}), "entries: from 1 to 64 entries, got 0"),
            (json!({"entries": [{"queue": ""}]}), "entries[0].queue: required, a non-empty string"),
            (json!({"entries": [{"queue": "q", "limit": 0}]}), "entries[0].limit: an integer from 1 to 1000"),
            (json!({"entries": [{"queue": "q", "limit": 1001}]}), "entries[0].limit: an integer from 1 to 1000"),
            (json!({"entries": [{"queue": "q"}, {"queue": "q", "since": "yesterday"}]}), "entries[1].since: an ISO 8601 timestamp with its zone"),
        ] {
            assert_eq!(parse(&body).unwrap_err(), err, "{body}");
        }
        let many: Vec<Value> = (0..65).map(|_| json!({"queue": "q"})).collect();
        assert!(parse(&json!({ "entries": many })).is_err());
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_not_one() {
        assert_eq!(from_cursor(&cursor(42)), Some(42));
        assert_eq!(from_cursor("42"), None);
        assert_eq!(from_cursor("p-1"), None);
        assert_eq!(from_cursor("pabc"), None);
    }
}
