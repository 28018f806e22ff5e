//! Live consumers, as the clients' consumer supervision publishes them
//! (issue 29 §5): every 10 s a supervised consume loop writes two KV rows
//! in namespace `queen-supervisor` with a 60 s TTL, `<group>/<instance>/head`
//! and `<group>/<instance>/chunk/NNNN` (its status document, base64 JSON,
//! split in chunks the head counts). `GET /api/v1/consumers` reassembles
//! them; a consumer that stopped publishing disappears with its rows' TTL.

use base64::Engine as _;
use deadpool_postgres::Pool;
use serde_json::{json, Value};

use crate::json::iso_ms;
use crate::db::DbError;

/// The namespace the clients publish in.
pub const NAMESPACE: &str = "queen-supervisor";

/// One publisher's rows: its head, its chunks by index, its newest write.
type Slot = (Option<Value>, Vec<(i64, Value)>, chrono::DateTime<chrono::Utc>);

/// Every live consumer of `tenant` (of `group` when given), by group and
/// instance.
pub async fn consumers(pool: &Pool, tenant: crate::tenancy::Tenant, group: Option<&str>) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let prefix = group.map(|g| format!("{g}/")).unwrap_or_default();
    let rows = client
        .query(
            "SELECT key, value::text, updated_at FROM queen.kv
             WHERE ns = $1 AND starts_with(key, $2) AND (expires_at IS NULL OR expires_at > now())
             ORDER BY key",
            &[&tenant.stored(NAMESPACE), &prefix],
        )
        .await?;
    let mut slots: std::collections::BTreeMap<String, Slot> = Default::default();
    for r in &rows {
        let key: String = r.get(0);
        let value: Value = serde_json::from_str(r.get(1)).unwrap_or(Value::Null);
        let updated: chrono::DateTime<chrono::Utc> = r.get(2);
        let (slot, part) = match key.rsplit_once("/head") {
            Some((slot, "")) => (slot.to_string(), None),
            _ => match key.rsplit_once("/chunk/") {
                Some((slot, n)) => (slot.to_string(), n.parse::<i64>().ok()),
                None => continue,
            },
        };
        let entry = slots.entry(slot).or_insert((None, Vec::new(), updated));
        entry.2 = entry.2.max(updated);
        match part {
            None => entry.0 = Some(value),
            Some(n) => entry.1.push((n, value)),
        }
    }
    let mut out = Vec::new();
    for (slot, (head, mut chunks, updated)) in slots {
        let Some(head) = head else { continue };
        let write = head.get("write").cloned().unwrap_or(Value::Null);
        chunks.sort_by_key(|c| c.0);
        // Only the chunks of the head's own write, all of them.
        let data: Option<Vec<u8>> = chunks
            .iter()
            .filter(|(_, c)| c.get("write") == Some(&write))
            .map(|(_, c)| c.get("data").and_then(Value::as_str).and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok()))
            .collect::<Option<Vec<Vec<u8>>>>()
            .filter(|parts| Some(parts.len() as u64) == head.get("chunks").and_then(Value::as_u64))
            .map(|parts| parts.concat());
        let Some(doc) = data.and_then(|d| serde_json::from_slice::<Value>(&d).ok()) else { continue };
        let (group, instance) = slot.split_once('/').unwrap_or((slot.as_str(), ""));
        out.push(json!({"group": group, "instanceId": doc.get("instance_id").cloned().unwrap_or(json!(instance)),
                        "state": doc.get("state"), "hostname": doc.get("hostname"), "pid": doc.get("pid"),
                        "engine": doc.get("engine"), "uptimeSeconds": doc.get("uptime_seconds"),
                        "publishedAt": iso_ms(updated), "pools": doc.get("pool_status"), "status": doc}));
    }
    Ok(json!({"consumers": out, "total": out.len()}))
}
