//! The KV operations as the clients send them (the Python client's
//! `kv/ops.py` shapes them), validated into [`Op`] before anything runs. A
//! bad operation is a [`KvError`] naming its index and field, and the whole
//! call changes nothing.

use serde_json::Value;

pub use crate::config::KvLimits;

/// Longest namespace, in bytes; its characters are `[A-Za-z0-9._:-]`.
pub const MAX_NS_BYTES: usize = 128;
/// Page size of `getPrefix` when the caller names none.
pub const DEFAULT_PREFIX_LIMIT: i64 = 100;

/// One validated operation. Values travel as their JSON text; numbers of
/// `incr` as decimal text (PostgreSQL's numeric reads them exactly).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Get { ns: String, key: String },
    GetMany { ns: String, keys: Vec<String> },
    GetPrefix { ns: String, prefix: String, after: Option<String>, limit: i64, keys_only: bool },
    /// `put` and `putIfAbsent` (which is `expect: 0`). `ttl` None = forever.
    Put { ns: String, key: String, value: String, ttl: Option<i32>, expect: Option<i64>, required: bool },
    Delete { ns: String, key: String, expect: Option<i64>, required: bool },
    Check { ns: String, key: String, expect: Option<i64>, required: bool },
    Incr { ns: String, key: String, delta: String, min: Option<String>, max: Option<String>, ttl: Option<i32>, required: bool },
}

impl Op {
    pub fn is_required(&self) -> bool {
        matches!(self, Op::Put { required: true, .. } | Op::Delete { required: true, .. } | Op::Check { required: true, .. } | Op::Incr { required: true, .. })
    }

    /// Whether the operation changes a row (so a rollback undoes it).
    pub fn is_write(&self) -> bool {
        matches!(self, Op::Put { .. } | Op::Delete { .. } | Op::Incr { .. })
    }

    /// The namespace the operation touches.
    pub fn ns(&self) -> &str {
        match self {
            Op::Get { ns, .. }
            | Op::GetMany { ns, .. }
            | Op::GetPrefix { ns, .. }
            | Op::Put { ns, .. }
            | Op::Delete { ns, .. }
            | Op::Check { ns, .. }
            | Op::Incr { ns, .. } => ns,
        }
    }

    /// Whether the operation names a locks' namespace (any tenant's: see
    /// `tenancy`), where only a guard's check is allowed.
    pub fn in_locks(&self) -> bool {
        crate::tenancy::shown(self.ns()) == LOCKS_NAMESPACE
    }

    /// Moves the operation to `tenant`'s namespace of the same name.
    pub fn own(&mut self, tenant: crate::tenancy::Tenant) {
        match self {
            Op::Get { ns, .. }
            | Op::GetMany { ns, .. }
            | Op::GetPrefix { ns, .. }
            | Op::Put { ns, .. }
            | Op::Delete { ns, .. }
            | Op::Check { ns, .. }
            | Op::Incr { ns, .. } => *ns = tenant.stored(ns),
        }
    }

    /// The one key a single-key operation touches ("" for the reads of
    /// several).
    pub fn key_str(&self) -> &str {
        match self {
            Op::Get { key, .. } | Op::Put { key, .. } | Op::Delete { key, .. } | Op::Check { key, .. } | Op::Incr { key, .. } => key,
            Op::GetMany { .. } | Op::GetPrefix { .. } => "",
        }
    }

    pub fn key(&self) -> Value {
        match self {
            Op::Get { key, .. } | Op::Put { key, .. } | Op::Delete { key, .. } | Op::Check { key, .. } | Op::Incr { key, .. } => {
                Value::String(key.clone())
            }
            Op::GetMany { .. } | Op::GetPrefix { .. } => Value::Null,
        }
    }
}

/// The namespace of lock permits: a row there is a permit and its version
/// the permit's fencing token, shown only to its holder (`crate::locks`).
/// A KV call or a transaction's `kv` rider may `check` a row there (a
/// lock's guard, copied from an acquire's answer) and nothing else; a check
/// answers no version it was not given (`kv::run`).
pub const LOCKS_NAMESPACE: &str = "queen-locks";

/// Refuses an operation other than a guard's `check` on the locks'
/// namespace. `at` names the array, as in [`parse`].
pub fn refuse_reserved(ops: &[Op], at: &str) -> Result<(), KvError> {
    match ops.iter().position(|op| op.in_locks() && !matches!(op, Op::Check { .. })) {
        None => Ok(()),
        Some(i) => Err(KvError::Reserved {
            detail: format!("{at}[{i}].ns: {LOCKS_NAMESPACE} holds the locks' permits: only a lock's guard (a check) may name it; use /api/v1/locks"),
        }),
    }
}

/// The version a result on `op` may show: on the locks' namespace, only
/// the one a check named and found (a holder's own token), never another.
pub fn shown_version(op: &Op, applied: bool, version: Value) -> Value {
    match op {
        Op::Check { expect, .. } if op.in_locks() => match (applied, expect) {
            (true, Some(e)) => Value::from(*e),
            _ => Value::Null,
        },
        _ if op.in_locks() => Value::Null,
        _ => version,
    }
}

/// Why a call was refused before it ran.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KvError {
    /// `400 kv_bad_request`: `reason` is a short code, `detail` names the
    /// operation and the field.
    #[error("{detail}")]
    BadRequest { reason: &'static str, detail: String },
    /// `413 kv_value_too_large`.
    #[error("{detail}")]
    TooLarge { detail: String },
    /// `403 kv_forbidden`: a reserved namespace ([`refuse_reserved`]).
    #[error("{detail}")]
    Reserved { detail: String },
}

fn bad(reason: &'static str, detail: String) -> KvError {
    KvError::BadRequest { reason, detail }
}

/// Reads `operations`, the body of `POST /api/v1/kv` or a transaction's
/// `kv` rider; `at` names the array in messages (`operations`, `kv`).
pub fn parse(operations: &Value, at: &str, limits: &KvLimits) -> Result<Vec<Op>, KvError> {
    let list = operations.as_array().ok_or_else(|| bad("invalid_body", format!("{at}: required, an array of operations")))?;
    if list.len() > limits.max_ops_per_call {
        return Err(bad("too_many_operations", format!("{at}: at most {} operations per call, got {}", limits.max_ops_per_call, list.len())));
    }
    list.iter().enumerate().map(|(i, op)| parse_one(op, &format!("{at}[{i}]"), limits)).collect()
}

fn parse_one(op: &Value, at: &str, limits: &KvLimits) -> Result<Op, KvError> {
    let field = |name: &str| format!("{at}.{name}");
    if !op.is_object() {
        return Err(bad("invalid_operation", format!("{at}: must be an object")));
    }
    let kind = op.get("op").and_then(Value::as_str).ok_or_else(|| bad("invalid_operation", format!("{}: required, a string", field("op"))))?;
    let ns = namespace(op, &field("ns"))?;
    let key = |name: &str| key_of(op.get(name), &field(name), limits);
    let required = match op.get("required") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("invalid_field", format!("{}: must be a boolean", field("required")))),
    };
    let expect = match op.get("expect") {
        None => None,
        Some(v) => Some(v.as_i64().filter(|e| *e >= 0).ok_or_else(|| {
            bad("invalid_expect", format!("{}: must be a version (an integer, 0 for \"must not exist\")", field("expect")))
        })?),
    };
    let no_expect = |what: &str| -> Result<(), KvError> {
        match expect {
            Some(_) => Err(bad("invalid_expect", format!("{}: {what} takes no expect", field("expect")))),
            None => Ok(()),
        }
    };
    Ok(match kind {
        "get" => Op::Get { ns, key: key("key")? },
        "getMany" => {
            let keys = op.get("keys").and_then(Value::as_array).ok_or_else(|| bad("invalid_field", format!("{}: required, an array of keys", field("keys"))))?;
            if keys.is_empty() || keys.len() > limits.max_keys_per_call {
                return Err(bad("invalid_field", format!("{}: from 1 to {} keys, got {}", field("keys"), limits.max_keys_per_call, keys.len())));
            }
            let mut out: Vec<String> = Vec::with_capacity(keys.len());
            for (j, k) in keys.iter().enumerate() {
                let k = key_of(Some(k), &format!("{}[{j}]", field("keys")), limits)?;
                if !out.contains(&k) {
                    out.push(k);
                }
            }
            Op::GetMany { ns, keys: out }
        }
        "getPrefix" => {
            let prefix = match op.get("prefix") {
                Some(Value::String(p)) if !p.is_empty() => p.clone(),
                _ => return Err(bad("kv_prefix_required", format!("{}: required, a non-empty string (a namespace is not a table to enumerate)", field("prefix")))),
            };
            let after = match op.get("after") {
                None | Some(Value::Null) => None,
                Some(Value::String(a)) => Some(a.clone()),
                Some(_) => return Err(bad("invalid_field", format!("{}: must be a string", field("after")))),
            };
            // Clamped, never refused: the caller cannot know the ceiling.
            let limit = match op.get("limit") {
                None | Some(Value::Null) => DEFAULT_PREFIX_LIMIT,
                Some(v) => v.as_i64().ok_or_else(|| bad("invalid_field", format!("{}: must be an integer", field("limit"))))?,
            }
            .clamp(1, limits.max_prefix_limit);
            let keys_only = op.get("keysOnly").and_then(Value::as_bool).unwrap_or(false);
            Op::GetPrefix { ns, prefix, after, limit, keys_only }
        }
        "put" | "putIfAbsent" => {
            let key = key("key")?;
            let value = op.get("value").ok_or_else(|| bad("invalid_field", format!("{}: required (any JSON value)", field("value"))))?.to_string();
            if crate::push::validate::holds_nul(&value) {
                return Err(bad("invalid_value", format!("{}: {}", field("value"), crate::push::validate::NUL_REFUSED)));
            }
            if value.len() > limits.max_value_bytes {
                return Err(KvError::TooLarge {
                    detail: format!("{}: {} bytes of JSON, more than the limit of {}", field("value"), value.len(), limits.max_value_bytes),
                });
            }
            let ttl = expiry(op, at)?;
            let expect = if kind == "putIfAbsent" {
                match expect {
                    None | Some(0) => Some(0),
                    Some(_) => return Err(bad("invalid_expect", format!("{}: putIfAbsent is expect 0; another expect contradicts it", field("expect")))),
                }
            } else {
                expect
            };
            Op::Put { ns, key, value, ttl, expect, required }
        }
        "delete" => Op::Delete { ns, key: key("key")?, expect, required },
        "check" => {
            let key = key("key")?;
            if expect.is_none() {
                return Err(bad("invalid_expect", format!("{}: check needs expect (a version, or 0 for \"must not exist\")", field("expect"))));
            }
            Op::Check { ns, key, expect, required }
        }
        "incr" => {
            let key = key("key")?;
            no_expect("incr")?;
            let number = |name: &str| -> Result<Option<String>, KvError> {
                match op.get(name) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::Number(n)) => Ok(Some(n.to_string())),
                    Some(_) => Err(bad("invalid_field", format!("{}: must be a number", field(name)))),
                }
            };
            let delta = number("delta")?.unwrap_or_else(|| "1".into());
            let (min, max) = (number("min")?, number("max")?);
            let ttl = expiry(op, at)?;
            Op::Incr { ns, key, delta, min, max, ttl, required }
        }
        other => return Err(bad("invalid_operation", format!("{}: unknown operation {other:?} (get, getMany, getPrefix, put, putIfAbsent, delete, incr, check)", field("op")))),
    })
}

fn namespace(op: &Value, at: &str) -> Result<String, KvError> {
    match op.get("ns").or_else(|| op.get("namespace")) {
        Some(Value::String(ns))
            if !ns.is_empty()
                && ns.len() <= MAX_NS_BYTES
                && ns.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')) =>
        {
            Ok(ns.clone())
        }
        _ => Err(bad("invalid_namespace", format!("{at}: required, 1 to {MAX_NS_BYTES} characters of A-Z a-z 0-9 . _ : -"))),
    }
}

fn key_of(v: Option<&Value>, at: &str, limits: &KvLimits) -> Result<String, KvError> {
    match v {
        Some(Value::String(k)) if !k.is_empty() && k.len() <= limits.max_key_bytes && !k.chars().any(char::is_control) => Ok(k.clone()),
        Some(Value::String(k)) if k.len() > limits.max_key_bytes => {
            Err(bad("key_too_long", format!("{at}: {} bytes, more than the limit of {}", k.len(), limits.max_key_bytes)))
        }
        _ => Err(bad("invalid_key", format!("{at}: required, a non-empty string without control characters"))),
    }
}

/// Exactly one of `ttlSeconds` (a positive integer) and `forever: true`;
/// None = forever. A put never inherits the previous expiry.
fn expiry(op: &Value, at: &str) -> Result<Option<i32>, KvError> {
    let ttl = op.get("ttlSeconds").filter(|v| !v.is_null());
    let forever = op.get("forever").filter(|v| !v.is_null());
    match (ttl, forever) {
        (Some(t), None) => t
            .as_i64()
            .filter(|t| *t > 0 && *t <= i32::MAX as i64)
            .map(|t| Some(t as i32))
            .ok_or_else(|| bad("invalid_ttl", format!("{at}.ttlSeconds: must be a positive whole number of seconds"))),
        (None, Some(Value::Bool(true))) => Ok(None),
        (None, Some(_)) => Err(bad("invalid_ttl", format!("{at}.forever: must be true when given"))),
        (None, None) => Err(bad("kv_expiry_not_specified", format!("{at}: exactly one of ttlSeconds and forever:true is required"))),
        (Some(_), Some(_)) => Err(bad("kv_expiry_not_specified", format!("{at}: ttlSeconds and forever are exclusive"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(op: Value) -> Result<Op, KvError> {
        parse(&json!([op]), "operations", &KvLimits::default()).map(|mut v| v.remove(0))
    }

    fn detail(op: Value) -> String {
        match one(op).unwrap_err() {
            KvError::BadRequest { detail, .. } | KvError::TooLarge { detail } | KvError::Reserved { detail } => detail,
        }
    }

    #[test]
    fn the_locks_namespace_takes_a_guard_check_and_nothing_else() {
        let ops = parse(&json!([{"op": "get", "ns": "app", "key": "k"}, {"op": "check", "ns": "queen-locks", "key": "l#0", "expect": 3}]), "kv", &KvLimits::default()).unwrap();
        assert_eq!(refuse_reserved(&ops, "kv"), Ok(()));
        assert_eq!(shown_version(&ops[1], true, json!(3)), json!(3));
        assert_eq!(shown_version(&ops[1], false, json!(9)), Value::Null, "a lost guard does not name the holder's token");
        assert_eq!(shown_version(&ops[0], true, json!(9)), json!(9));
        let probe = Op::Check { ns: LOCKS_NAMESPACE.into(), key: "l#0".into(), expect: None, required: false };
        assert_eq!(shown_version(&probe, true, json!(9)), Value::Null, "a check without a token learns none");
        for op in [json!({"op": "put", "ns": "queen-locks", "key": "l#0", "value": 1, "forever": true}), json!({"op": "get", "ns": "queen-locks", "key": "l#0"})] {
            let ops = parse(&json!([{"op": "get", "ns": "app", "key": "k"}, op.clone()]), "operations", &KvLimits::default()).unwrap();
            let Err(KvError::Reserved { detail }) = refuse_reserved(&ops, "operations") else { panic!("{op} was not refused") };
            assert!(detail.starts_with("operations[1].ns: queen-locks"), "{detail}");
        }
        // The supervisor namespace stays the clients' to write (API.md §2.10).
        let ops = parse(&json!([{"op": "put", "ns": "queen-supervisor", "key": "g/i/head", "value": 1, "ttlSeconds": 60}]), "operations", &KvLimits::default()).unwrap();
        assert_eq!(refuse_reserved(&ops, "operations"), Ok(()));
    }

    #[test]
    fn the_clients_operations_parse() {
        assert_eq!(one(json!({"op": "get", "ns": "n", "key": "k"})).unwrap(), Op::Get { ns: "n".into(), key: "k".into() });
        let put = one(json!({"op": "putIfAbsent", "ns": "n", "key": "k", "value": {"a": 1}, "ttlSeconds": 60, "required": true})).unwrap();
        assert_eq!(put, Op::Put { ns: "n".into(), key: "k".into(), value: "{\"a\":1}".into(), ttl: Some(60), expect: Some(0), required: true });
        let incr = one(json!({"op": "incr", "ns": "n", "key": "k", "delta": 2.5, "max": 10, "forever": true})).unwrap();
        assert_eq!(incr, Op::Incr { ns: "n".into(), key: "k".into(), delta: "2.5".into(), min: None, max: Some("10".into()), ttl: None, required: false });
        let many = one(json!({"op": "getMany", "ns": "n", "keys": ["a", "b", "a"]})).unwrap();
        assert_eq!(many, Op::GetMany { ns: "n".into(), keys: vec!["a".into(), "b".into()] });
        let page = one(json!({"op": "getPrefix", "ns": "n", "prefix": "p", "limit": 1_000_000})).unwrap();
        assert!(matches!(page, Op::GetPrefix { limit: 1000, .. }), "a limit is clamped, not refused");
    }

    #[test]
    fn bad_operations_name_the_index_and_the_field() {
        for (op, want) in [
            (json!({"op": "fly", "ns": "n"}), "operations[0].op: unknown operation"),
            (json!({"op": "get", "ns": "bad ns", "key": "k"}), "operations[0].ns: required"),
            (json!({"op": "get", "ns": "n"}), "operations[0].key: required"),
            (json!({"op": "put", "ns": "n", "key": "k", "value": 1}), "operations[0]: exactly one of ttlSeconds"),
            (json!({"op": "put", "ns": "n", "key": "k", "value": 1, "ttlSeconds": 5, "forever": true}), "operations[0]: ttlSeconds and forever"),
            (json!({"op": "put", "ns": "n", "key": "k", "value": 1, "ttlSeconds": 0}), "operations[0].ttlSeconds"),
            (json!({"op": "put", "ns": "n", "key": "k", "forever": true}), "operations[0].value: required"),
            (json!({"op": "put", "ns": "n", "key": "k", "value": 1, "forever": true, "expect": -1}), "operations[0].expect"),
            (json!({"op": "putIfAbsent", "ns": "n", "key": "k", "value": 1, "forever": true, "expect": 3}), "operations[0].expect: putIfAbsent"),
            (json!({"op": "check", "ns": "n", "key": "k"}), "operations[0].expect: check needs expect"),
            (json!({"op": "incr", "ns": "n", "key": "k", "delta": "1", "forever": true}), "operations[0].delta: must be a number"),
            (json!({"op": "incr", "ns": "n", "key": "k", "expect": 1, "forever": true}), "operations[0].expect: incr takes no expect"),
            (json!({"op": "getPrefix", "ns": "n", "prefix": ""}), "operations[0].prefix"),
            (json!({"op": "getMany", "ns": "n", "keys": []}), "operations[0].keys: from 1"),
            (json!({"op": "put", "ns": "n", "key": "k", "value": 1, "forever": true, "required": "yes"}), "operations[0].required"),
        ] {
            let d = detail(op.clone());
            assert!(d.starts_with(want), "{op}: {d}");
        }
        let big = "x".repeat(70_000);
        assert!(matches!(one(json!({"op": "put", "ns": "n", "key": "k", "value": big, "forever": true})), Err(KvError::TooLarge { .. })));
        let long_key = "k".repeat(513);
        assert!(detail(json!({"op": "get", "ns": "n", "key": long_key})).contains("more than the limit of 512"));
        let many: Vec<Value> = (0..257).map(|_| json!({"op": "get", "ns": "n", "key": "k"})).collect();
        assert!(parse(&json!(many), "operations", &KvLimits::default()).is_err());
    }
}
