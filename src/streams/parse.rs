//! The bodies of `/streams/v1/*`, validated before anything runs. The
//! clients send snake_case (the streams runtime's own HTTP client); a bad
//! field is a 400 naming it.

use serde_json::Value;
use uuid::Uuid;

use super::{CycleAck, StateOp};
use crate::push::validate::{check_name, DEFAULT_PARTITION, MAX_TRANSACTION_ID_BYTES};

/// Most state ops and push items in one cycle.
pub const MAX_CYCLE_OPS: usize = 10_000;

fn text<'a>(v: &'a Value, field: &str) -> Result<Option<&'a str>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(_) => Err(format!("{field}: must be a non-empty string")),
    }
}

fn required<'a>(v: &'a Value, field: &str) -> Result<&'a str, String> {
    text(v, field)?.ok_or_else(|| format!("{field}: required, a non-empty string"))
}

fn query_id(v: &Value) -> Result<Uuid, String> {
    Uuid::parse_str(required(v, "query_id")?).map_err(|_| "query_id: must be the id the registration answered".to_string())
}

fn partition_id(v: &Value) -> Result<i64, String> {
    match v.get("partition_id") {
        Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
        Some(Value::Number(n)) => n.as_i64(),
        _ => None,
    }
    .filter(|p| *p > 0)
    .ok_or_else(|| "partition_id: required, a partition id as the pop answered it".to_string())
}

/// A registration.
pub struct Register {
    pub name: String,
    pub source: String,
    pub sink: Option<String>,
    pub hash: String,
    pub reset: bool,
}

pub fn register(v: &Value) -> Result<Register, String> {
    let name = required(v, "name")?;
    if name.len() > 255 || name.chars().any(char::is_control) {
        return Err("name: at most 255 bytes, without control characters".into());
    }
    let source = required(v, "source_queue")?;
    check_name(source).map_err(|e| format!("source_queue: {e}"))?;
    let sink = text(v, "sink_queue")?;
    if let Some(s) = sink {
        check_name(s).map_err(|e| format!("sink_queue: {e}"))?;
    }
    let hash = required(v, "config_hash")?;
    let reset = match v.get("reset") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("reset: must be a boolean".into()),
    };
    Ok(Register { name: name.into(), source: source.into(), sink: sink.map(str::to_string), hash: hash.into(), reset })
}

/// A state read.
pub struct StateGet {
    pub query: Uuid,
    pub partition_id: i64,
    pub keys: Vec<String>,
    pub prefix: Option<String>,
    pub ripe_at_or_before: Option<i64>,
}

pub fn state_get(v: &Value) -> Result<StateGet, String> {
    let keys = match v.get("keys") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, k)| k.as_str().map(str::to_string).ok_or_else(|| format!("keys[{i}]: must be a string")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("keys: must be an array of strings".into()),
    };
    let ripe_at_or_before = match v.get("ripe_at_or_before") {
        None | Some(Value::Null) => None,
        Some(n) => Some(n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)).ok_or("ripe_at_or_before: must be a time in epoch milliseconds")?),
    };
    Ok(StateGet {
        query: query_id(v)?,
        partition_id: partition_id(v)?,
        keys,
        prefix: text(v, "key_prefix")?.map(str::to_string),
        ripe_at_or_before,
    })
}

/// A cycle's body, owning what its push items borrow.
pub struct CycleBody {
    pub query: Uuid,
    pub partition_id: i64,
    pub group: String,
    pub state_ops: Vec<StateOp>,
    /// (queue, partition, payload JSON text, transactionId)
    pub pushes: Vec<(String, String, String, Option<String>)>,
    pub ack: Option<CycleAck>,
    pub release_lease: bool,
}

pub fn cycle(v: &Value) -> Result<CycleBody, String> {
    let list = |field: &str| -> Result<&[Value], String> {
        match v.get(field) {
            None | Some(Value::Null) => Ok(&[]),
            Some(Value::Array(a)) if a.len() <= MAX_CYCLE_OPS => Ok(a),
            Some(Value::Array(_)) => Err(format!("{field}: at most {MAX_CYCLE_OPS} entries")),
            Some(_) => Err(format!("{field}: must be an array")),
        }
    };
    let state_ops = list("state_ops")?
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let key = op.get("key").and_then(Value::as_str).filter(|k| !k.is_empty()).ok_or_else(|| format!("state_ops[{i}].key: required, a non-empty string"))?;
            match op.get("type").and_then(Value::as_str) {
                Some("upsert") => {
                    let value = op.get("value").ok_or_else(|| format!("state_ops[{i}].value: required for an upsert"))?;
                    let ripe_at = value.get("windowEnd").and_then(|w| w.as_i64().or_else(|| w.as_f64().map(|f| f as i64)));
                    let value = value.to_string();
                    if crate::push::validate::holds_nul(&value) || key.contains('\0') {
                        return Err(format!("state_ops[{i}]: {}", crate::push::validate::NUL_REFUSED));
                    }
                    Ok(StateOp::Upsert { key: key.into(), value, ripe_at })
                }
                Some("delete") => Ok(StateOp::Delete { key: key.into() }),
                _ => Err(format!("state_ops[{i}].type: must be upsert or delete")),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    let pushes = list("push_items")?
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let queue = item.get("queue").and_then(Value::as_str).ok_or_else(|| format!("push_items[{i}].queue: required, a string"))?;
            check_name(queue).map_err(|e| format!("push_items[{i}].queue: {e}"))?;
            let partition = match item.get("partition") {
                None | Some(Value::Null) => DEFAULT_PARTITION.to_string(),
                Some(Value::String(p)) => p.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(_) => return Err(format!("push_items[{i}].partition: must be a string")),
            };
            check_name(&partition).map_err(|e| format!("push_items[{i}].partition: {e}"))?;
            let payload = item.get("payload").or_else(|| item.get("data")).ok_or_else(|| format!("push_items[{i}].payload: required"))?;
            if crate::push::validate::holds_nul(&payload.to_string()) {
                return Err(format!("push_items[{i}].payload: {}", crate::push::validate::NUL_REFUSED));
            }
            let txn = match item.get("transactionId") {
                None | Some(Value::Null) => None,
                Some(Value::String(t)) if t.len() > MAX_TRANSACTION_ID_BYTES => {
                    return Err(format!("push_items[{i}].transactionId: longer than {MAX_TRANSACTION_ID_BYTES} bytes"))
                }
                Some(Value::String(t)) => Some(t.clone()).filter(|t| !t.is_empty()),
                Some(_) => return Err(format!("push_items[{i}].transactionId: must be a string")),
            };
            Ok((queue.to_string(), partition, payload.to_string(), txn))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let ack = match v.get("ack") {
        None | Some(Value::Null) => None,
        Some(a @ Value::Object(_)) => Some(CycleAck {
            transaction_id: required(a, "transactionId").map_err(|e| format!("ack.{e}"))?.to_string(),
            lease_id: text(a, "leaseId").map_err(|e| format!("ack.{e}"))?.map(str::to_string),
            status: text(a, "status").map_err(|e| format!("ack.{e}"))?.map(str::to_string),
        }),
        Some(_) => return Err("ack: must be an object or null".into()),
    };
    let release_lease = match v.get("release_lease") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("release_lease: must be a boolean".into()),
    };
    Ok(CycleBody {
        query: query_id(v)?,
        partition_id: partition_id(v)?,
        group: required(v, "consumer_group")?.to_string(),
        state_ops,
        pushes,
        ack,
        release_lease,
    })
}
