//! `POST /api/v1/configure` (API.md §2.6): the 21 queue options.
//!
//! This module knows each option's wire name, column, type and bounds; the
//! defaults live in one place only, the column defaults of the `queues`
//! table, so "restore the default" is SQL's `DEFAULT`. Merge mode touches only
//! the options given (an explicit `null` restores that option's default);
//! replace mode resets every option not given. The one exception is the
//! lease of a queue a push or pop created: its first configure gives it the
//! configured default unless it names one (seeds/pop-routes.md: 60 s
//! implicit, 300 s "created or updated through /api/v1/configure"). The
//! answer echoes the row as stored.

use deadpool_postgres::Pool;
use serde_json::{json, Map, Value};

use crate::db::DbError;

/// How an option's value is checked.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// An integer refused below `min` and above `max`.
    Int { min: i64, max: i64 },
    /// An integer clamped into the range instead of refused.
    Clamped { min: i64, max: i64 },
    Bool,
    /// `[A-Za-z0-9._-]{0,64}`.
    SinkHold,
    /// A label of at most 255 bytes.
    Label,
}

/// (wire name, column, kind): every option of §2.6.
const OPTIONS: &[(&str, &str, Kind)] = &[
    ("leaseTime", "lease_time", Kind::Int { min: 1, max: i32::MAX as i64 }),
    ("retryLimit", "retry_limit", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("retryDelay", "retry_delay", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("priority", "priority", Kind::Int { min: i32::MIN as i64, max: i32::MAX as i64 }),
    ("maxSize", "max_size", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("ttl", "ttl", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("deadLetterQueue", "dead_letter_queue", Kind::Bool),
    ("dlqAfterMaxRetries", "dlq_after_max_retries", Kind::Bool),
    ("delayedProcessing", "delayed_processing", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("windowBuffer", "window_buffer", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("retentionSeconds", "retention_seconds", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("completedRetentionSeconds", "completed_retention_seconds", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("retentionEnabled", "retention_enabled", Kind::Bool),
    ("encryptionEnabled", "encryption_enabled", Kind::Bool),
    ("maxWaitTimeSeconds", "max_wait_time_seconds", Kind::Int { min: 0, max: i32::MAX as i64 }),
    ("minPopWaitTime", "min_pop_wait_time", Kind::Clamped { min: 0, max: 60_000 }),
    ("dedupWindowSeconds", "dedup_window_seconds", Kind::Clamped { min: 0, max: i32::MAX as i64 }),
    ("retentionSinkHold", "retention_sink_hold", Kind::SinkHold),
    ("retentionSinkHoldMaxSeconds", "retention_sink_hold_max_seconds", Kind::Int { min: 60, max: 31_536_000 }),
    ("namespace", "namespace", Kind::Label),
    ("task", "task", Kind::Label),
];

/// A refused option: `400 {"error", "invalid": option}`.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{error}")]
pub struct Refusal {
    pub error: String,
    pub invalid: Option<String>,
}

impl Refusal {
    fn body(error: impl Into<String>) -> Refusal {
        Refusal { error: error.into(), invalid: None }
    }
    fn option(name: &str, problem: &str) -> Refusal {
        Refusal { error: format!("{name} {problem}"), invalid: Some(name.to_string()) }
    }
}

/// A parsed value, ready to bind (`Default` = the column default).
#[derive(Debug, Clone, PartialEq)]
enum Setting {
    Int(i32),
    Bool(bool),
    Text(String),
    Default,
}

fn parse_value(name: &str, kind: Kind, v: &Value) -> Result<Setting, Refusal> {
    if v.is_null() {
        return Ok(Setting::Default);
    }
    let int = |v: &Value| -> Option<i64> {
        v.as_i64()
            .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64))
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
    };
    match kind {
        Kind::Int { min, max } => match int(v) {
            Some(n) if n >= min && n <= max => Ok(Setting::Int(n as i32)),
            Some(_) => Err(Refusal::option(name, &format!("must be from {min} to {max}"))),
            None => Err(Refusal::option(name, "must be an integer")),
        },
        Kind::Clamped { min, max } => {
            int(v).map(|n| Setting::Int(n.clamp(min, max) as i32)).ok_or_else(|| Refusal::option(name, "must be an integer"))
        }
        Kind::Bool => match v {
            Value::Bool(b) => Ok(Setting::Bool(*b)),
            Value::String(s) => crate::config::parse_bool(s).map(Setting::Bool).ok_or_else(|| Refusal::option(name, "must be a boolean")),
            _ => Err(Refusal::option(name, "must be a boolean")),
        },
        Kind::SinkHold => match v.as_str() {
            Some(s) if s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) => Ok(Setting::Text(s.into())),
            _ => Err(Refusal::option(name, "must match [A-Za-z0-9._-]{0,64}")),
        },
        Kind::Label => match v.as_str() {
            Some(s) if s.len() <= 255 && !s.chars().any(char::is_control) => Ok(Setting::Text(s.into())),
            _ => Err(Refusal::option(name, "must be a string of at most 255 bytes without control characters")),
        },
    }
}

/// A validated configure request.
#[derive(Debug)]
pub struct Request {
    pub queue: String,
    replace: bool,
    settings: Vec<(&'static str, Setting)>,
}

/// Parses the body: `{queue, namespace?, task?, options?, mode?}`, or raw
/// options at the top level when `options` is not an object.
pub fn parse(body: &Value, encryption_available: bool) -> Result<Request, Refusal> {
    let queue = body.get("queue").and_then(Value::as_str).ok_or_else(|| Refusal::body("queue is required"))?;
    if queue.len() > 255 || queue.chars().any(char::is_control) {
        return Err(Refusal::body("queue must be at most 255 bytes without control characters"));
    }
    let replace = match body.get("mode") {
        None | Some(Value::Null) => false,
        Some(Value::String(m)) if m == "merge" => false,
        Some(Value::String(m)) if m == "replace" => true,
        Some(other) => return Err(Refusal::body(format!("mode must be \"merge\" or \"replace\", got {other}"))),
    };
    let mut options: Map<String, Value> = match body.get("options") {
        Some(Value::Object(o)) => o.clone(),
        _ => body
            .as_object()
            .map(|o| o.iter().filter(|(k, _)| !matches!(k.as_str(), "queue" | "options" | "mode")).map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default(),
    };
    for label in ["namespace", "task"] {
        if let Some(Value::String(s)) = body.get(label) {
            if !s.is_empty() && !options.contains_key(label) {
                options.insert(label.to_string(), Value::String(s.clone()));
            }
        }
    }
    let mut settings = Vec::new();
    for (name, column, kind) in OPTIONS {
        // The snake_case spelling (the column's name) is read too; camelCase wins.
        if let Some(v) = options.get(*name).or_else(|| options.get(*column)) {
            let s = parse_value(name, *kind, v)?;
            if *name == "encryptionEnabled" && s == Setting::Bool(true) && !encryption_available {
                return Err(Refusal::option(name, "cannot be enabled: this broker has no QUEEN_ENCRYPTION_KEY"));
            }
            settings.push((*column, s));
        }
    }
    Ok(Request { queue: queue.to_string(), replace, settings })
}

/// Applies a request and answers the full effective configuration.
pub async fn apply(pool: &Pool, req: &Request) -> Result<Value, DbError> {
    let client = pool.get().await?;
    // Columns named in SQL come only from OPTIONS, never from the request.
    let mut columns = vec!["name".to_string()];
    let mut values = vec!["$1".to_string()];
    let mut updates = Vec::new();
    let mut params: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = vec![Box::new(req.queue.clone())];
    let given: Vec<&str> = req.settings.iter().map(|(c, _)| *c).collect();
    for (column, setting) in &req.settings {
        let value = match setting {
            Setting::Default => "DEFAULT".to_string(),
            Setting::Int(n) => {
                params.push(Box::new(*n));
                format!("${}", params.len())
            }
            Setting::Bool(b) => {
                params.push(Box::new(*b));
                format!("${}", params.len())
            }
            Setting::Text(t) => {
                params.push(Box::new(t.clone()));
                format!("${}", params.len())
            }
        };
        columns.push(column.to_string());
        updates.push(format!("{column} = {value}"));
        values.push(value);
    }
    if req.replace {
        for (_, column, _) in OPTIONS {
            if !given.contains(column) {
                updates.push(format!("{column} = DEFAULT"));
            }
        }
    } else if !given.contains(&"lease_time") {
        // A configured queue's lease defaults to the column default (300 s),
        // an implicit queue's is 60 s: the first configure of an implicit
        // queue moves it to the configured default (`queues.configured_at`).
        // EXCLUDED.lease_time is the insert's value: the column default.
        updates.push("lease_time = CASE WHEN q.configured_at IS NULL THEN EXCLUDED.lease_time ELSE q.lease_time END".into());
    }
    columns.push("configured_at".into());
    values.push("now()".into());
    updates.push("configured_at = now()".into());
    updates.push("updated_at = now()".into());
    let sql = format!(
        "INSERT INTO queen.queues AS q ({}) VALUES ({}) ON CONFLICT (name) DO UPDATE SET {} RETURNING *",
        columns.join(", "),
        values.join(", "),
        updates.join(", ")
    );
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        params.iter().map(|p| &**p as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
    let row = client.query_one(&sql, &refs).await?;
    let options = options_json(&row);
    Ok(json!({
        "configured": true,
        "queueId": row.get::<_, i64>("id").to_string(),
        "partitionId": null,
        "queue": row.get::<_, String>("name"),
        "namespace": row.get::<_, String>("namespace"),
        "task": row.get::<_, String>("task"),
        "storage": "segments",
        "options": options,
    }))
}

/// The 21 options of a `queues` row, spelled as `/configure` parses them.
pub fn options_json(row: &tokio_postgres::Row) -> Value {
    let mut o = Map::new();
    for (name, column, kind) in OPTIONS {
        let v = match kind {
            Kind::Int { .. } | Kind::Clamped { .. } => json!(row.get::<_, i32>(*column)),
            Kind::Bool => json!(row.get::<_, bool>(*column)),
            Kind::SinkHold | Kind::Label => json!(row.get::<_, String>(*column)),
        };
        o.insert(name.to_string(), v);
    }
    Value::Object(o)
}

/// Reloads which queues encrypt (`queues.encryption_enabled`) into the
/// broker's encryption state: at boot, every cache refresh, and when another
/// broker announces a change.
pub async fn refresh_encrypted(pool: &deadpool_postgres::Pool, encryption: &crate::crypto::Encryption) -> Result<(), DbError> {
    let since = encryption.generation();
    let rows = pool.get().await?.query("SELECT name FROM queen.queues WHERE encryption_enabled", &[]).await?;
    encryption.reload(since, rows.iter().map(|r| r.get(0)).collect());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn there_are_21_options() {
        assert_eq!(OPTIONS.len(), 21);
    }

    #[test]
    fn refusals_name_the_option() {
        let cases = [
            (json!({"queue": "q", "options": {"leaseTime": "soon"}}), "leaseTime"),
            (json!({"queue": "q", "options": {"leaseTime": 0}}), "leaseTime"),
            (json!({"queue": "q", "options": {"deadLetterQueue": 3}}), "deadLetterQueue"),
            (json!({"queue": "q", "options": {"retentionSinkHold": "a b"}}), "retentionSinkHold"),
            (json!({"queue": "q", "options": {"retentionSinkHoldMaxSeconds": 10}}), "retentionSinkHoldMaxSeconds"),
            (json!({"queue": "q", "options": {"encryptionEnabled": true}}), "encryptionEnabled"),
        ];
        for (body, option) in cases {
            assert_eq!(parse(&body, false).unwrap_err().invalid.as_deref(), Some(option), "{body}");
        }
        assert_eq!(parse(&json!({"options": {}}), false).unwrap_err().error, "queue is required");
        assert!(parse(&json!({"queue": "q", "mode": "upsert"}), false).unwrap_err().error.starts_with("mode must be"));
    }

    #[test]
    fn clamped_options_are_clamped_not_refused() {
        let r = parse(&json!({"queue": "q", "options": {"minPopWaitTime": 999999, "dedupWindowSeconds": -4}}), false).unwrap();
        assert!(r.settings.contains(&("min_pop_wait_time", Setting::Int(60_000))));
        assert!(r.settings.contains(&("dedup_window_seconds", Setting::Int(0))));
    }

    #[test]
    fn top_level_labels_fold_in_unless_the_options_carry_them() {
        let r = parse(&json!({"queue": "q", "namespace": "billing", "task": "", "options": {"task": "t"}}), false).unwrap();
        assert!(r.settings.contains(&("namespace", Setting::Text("billing".into()))));
        assert!(r.settings.contains(&("task", Setting::Text("t".into()))));
        let raw = parse(&json!({"queue": "q", "leaseTime": 30}), false).unwrap();
        assert_eq!(raw.settings, [("lease_time", Setting::Int(30))], "raw callers put options at the top level");
    }
}
