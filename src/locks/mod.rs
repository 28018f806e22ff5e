//! Locks and semaphores (issue 29 §2, API.md §2.10): `POST /api/v1/locks`.
//!
//! A permit is a KV row (namespace `queen-locks`, key `<name>#<slot>`)
//! written through KV's own stored functions (migrations/0011_locks.sql calls
//! `queen.kv_put_v1`; renew and release are a put and a delete with `expect`),
//! so there is one implementation of "who holds this row" and expiry is
//! KV's: a permit past its lifetime is free at once, with no sweeper on the
//! critical path. The permit's KV version is its fencing token; it only
//! grows and a renew issues a new one. `guard` is the KV `check` a client
//! copies into a transaction so that a commit made after the permit was
//! lost is refused.
//!
//! A token is shown only to its holder (issue 45): the answer of a
//! successful acquire or renew carries it; the holders listed by a `get`, a
//! refused acquire or a refused renew show slot, owner and times, never a
//! token. Tokens grow from one sequence and owners are listed, so neither is
//! a secret: a permit also remembers the JWT subject that took it
//! (migrations/0023_lock_subjects.sql), and an owner's retry, a renew and a
//! release act only for that subject. Direct KV access to the namespace is
//! refused ([`crate::kv::ops`]), so a token cannot be read around this API.

use deadpool_postgres::Pool;
use serde_json::{json, Value};

use crate::json::iso_ms;
use crate::db::DbError;
use crate::kv::stmt;

/// The KV namespace of permits.
pub const NAMESPACE: &str = "queen-locks";
/// Most operations in one call.
pub const MAX_OPS: usize = 64;
/// Most permits of one semaphore.
pub const MAX_LIMIT: i64 = 1024;
/// Longest name and owner, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// One validated operation.
#[derive(Debug, Clone, PartialEq)]
pub enum LockOp {
    Acquire { name: String, ttl: i32, owner: Option<String>, limit: i32 },
    Renew { name: String, token: i64, ttl: i32, slot: Option<i32>, owner: Option<String> },
    Release { name: String, token: i64, slot: Option<i32> },
    Get { name: String },
}

/// A refused call: `400 locks_bad_request` or `413` (too many operations).
#[derive(Debug, Clone, PartialEq)]
pub struct LocksError {
    pub too_many: bool,
    pub reason: &'static str,
    pub detail: String,
}

fn bad(reason: &'static str, detail: String) -> LocksError {
    LocksError { too_many: false, reason, detail }
}

/// Reads a call: `{operations: [...]}` or a bare array.
pub fn parse(body: &Value) -> Result<Vec<LockOp>, LocksError> {
    let list = if body.is_array() { body } else { body.get("operations").unwrap_or(&Value::Null) };
    let list = list.as_array().ok_or_else(|| bad("invalid_body", "operations: required, an array".into()))?;
    if list.len() > MAX_OPS {
        return Err(LocksError { too_many: true, reason: "too_many_operations", detail: format!("operations: at most {MAX_OPS} per call, got {}", list.len()) });
    }
    list.iter().enumerate().map(|(i, op)| parse_one(op, &format!("operations[{i}]"))).collect()
}

fn parse_one(op: &Value, at: &str) -> Result<LockOp, LocksError> {
    let field = |f: &str| format!("{at}.{f}");
    let text = |f: &str, hash_ok: bool| -> Result<Option<String>, LocksError> {
        match op.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s))
                if !s.is_empty() && s.len() <= MAX_NAME_BYTES && !s.chars().any(char::is_control) && (hash_ok || !s.contains('#')) =>
            {
                Ok(Some(s.clone()))
            }
            Some(_) => Err(bad(
                "invalid_field",
                format!("{}: a non-empty string of at most {MAX_NAME_BYTES} bytes without control characters{}", field(f), if hash_ok { "" } else { " or '#'" }),
            )),
        }
    };
    let int = |f: &str, min: i64, max: i64| -> Result<Option<i64>, LocksError> {
        match op.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_i64().filter(|n| (min..=max).contains(n)).map(Some).ok_or_else(|| bad("invalid_field", format!("{}: an integer from {min} to {max}", field(f)))),
        }
    };
    let kind = op.get("op").and_then(Value::as_str).ok_or_else(|| bad("invalid_operation", format!("{}: required, a string", field("op"))))?;
    let name = text("name", false)?.ok_or_else(|| bad("invalid_field", format!("{}: required", field("name"))))?;
    let ttl = || -> Result<i32, LocksError> {
        int("ttlSeconds", 1, i32::MAX as i64)?.map(|t| t as i32).ok_or_else(|| bad("invalid_ttl", format!("{}: required, a positive whole number of seconds (there is no forever)", field("ttlSeconds"))))
    };
    let token = || -> Result<i64, LocksError> {
        int("token", 1, i64::MAX)?.ok_or_else(|| bad("invalid_token", format!("{}: required, the token the last acquire or renew answered", field("token"))))
    };
    let slot = || int("slot", 0, MAX_LIMIT - 1).map(|s| s.map(|s| s as i32));
    Ok(match kind {
        "acquire" => LockOp::Acquire { name, ttl: ttl()?, owner: text("owner", true)?, limit: int("limit", 1, MAX_LIMIT)?.unwrap_or(1) as i32 },
        "renew" => LockOp::Renew { name, token: token()?, ttl: ttl()?, slot: slot()?, owner: text("owner", true)? },
        "release" => LockOp::Release { name, token: token()?, slot: slot()? },
        "get" => LockOp::Get { name },
        other => return Err(bad("invalid_operation", format!("{}: unknown operation {other:?} (acquire, renew, release, get)", field("op")))),
    })
}

/// A live permit.
struct Holder {
    slot: i32,
    owner: Option<String>,
    token: i64,
    since: chrono::DateTime<chrono::Utc>,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    renewed_at: chrono::DateTime<chrono::Utc>,
    /// The JWT subject that took the permit (None without authentication).
    sub: Option<String>,
}

impl Holder {
    /// What anyone may see of a permit: no token, no subject.
    fn json(&self) -> Value {
        json!({"slot": self.slot, "owner": self.owner, "since": iso_ms(self.since),
               "expiresAt": self.expires_at.map(iso_ms), "renewedAt": iso_ms(self.renewed_at)})
    }

    /// Whether `token` (on `slot`, when named) moves this permit for `sub`.
    fn answers_to(&self, token: i64, slot: Option<i32>, sub: Option<&str>) -> bool {
        self.token == token && slot.is_none_or(|s| s == self.slot) && self.sub.as_deref() == sub
    }
}

/// The KV check that holds while this permit is the holder's.
pub fn guard(name: &str, slot: i32, token: i64) -> Value {
    json!({"op": "check", "ns": NAMESPACE, "key": format!("{name}#{slot}"), "expect": token, "required": true})
}

async fn holders(client: &deadpool_postgres::Client, ns: &str, name: &str) -> Result<Vec<Holder>, DbError> {
    let rows = client.query(&stmt(client, "SELECT * FROM queen.lock_holders_v3($1, $2)").await?, &[&ns, &name]).await?;
    Ok(rows
        .iter()
        .map(|r| Holder { slot: r.get(0), owner: r.get(1), token: r.get(2), since: r.get(3), expires_at: r.get(4), renewed_at: r.get(5), sub: r.get(6) })
        .collect())
}

fn holders_json(h: &[Holder]) -> Value {
    Value::Array(h.iter().map(Holder::json).collect())
}

/// Runs each operation in turn (each is atomic on its own) for the caller
/// `sub` (its JWT subject; None without authentication) on `tenant`'s
/// locks; one result per operation.
pub async fn run(pool: &Pool, tenant: crate::tenancy::Tenant, ops: &[LockOp], sub: Option<&str>) -> Result<Vec<Value>, DbError> {
    let client = pool.get().await?;
    let ns = tenant.stored(NAMESPACE);
    let ns = &ns;
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        results.push(match op {
            LockOp::Acquire { name, ttl, owner, limit } => {
                let owner = owner.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
                let row = client.query_opt(&stmt(&client, "SELECT * FROM queen.lock_acquire_v3($1, $2, $3, $4, $5, $6)").await?, &[ns, name, ttl, &owner, limit, &sub]).await?;
                match row {
                    Some(r) => {
                        let (slot, token, already): (i32, i64, bool) = (r.get(0), r.get(1), r.get(2));
                        let mut v = json!({"acquired": true, "name": name, "slot": slot, "token": token, "owner": owner,
                                           "expiresAt": r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(3).map(iso_ms),
                                           "guard": guard(name, slot, token)});
                        if already {
                            v["already"] = json!(true);
                        }
                        v
                    }
                    None => json!({"acquired": false, "name": name, "reason": "held", "holders": holders_json(&holders(&client, ns, name).await?)}),
                }
            }
            LockOp::Renew { name, token, ttl, slot, owner } => {
                let current = holders(&client, ns, name).await?;
                let mine = current.iter().find(|h| h.answers_to(*token, *slot, sub));
                let renewed = match mine {
                    None => None,
                    Some(h) => {
                        let owner = owner.clone().or_else(|| h.owner.clone());
                        let put = stmt(&client, "SELECT applied, version, expires_at FROM queen.kv_put_v1($1, $2, jsonb_strip_nulls(jsonb_build_object('owner', $3::text, 'sub', $6::text)), $4, $5)").await?;
                        let r = client.query_one(&put, &[ns, &format!("{name}#{}", h.slot), &owner, ttl, token, &sub]).await?;
                        r.get::<_, Option<bool>>(0).unwrap_or(false).then(|| (h.slot, r.get::<_, i64>(1), r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(2)))
                    }
                };
                match renewed {
                    Some((slot, token, expires)) => {
                        json!({"renewed": true, "name": name, "slot": slot, "token": token, "expiresAt": expires.map(iso_ms), "guard": guard(name, slot, token)})
                    }
                    None => json!({"renewed": false, "name": name, "reason": "lost", "holders": holders_json(&holders(&client, ns, name).await?)}),
                }
            }
            LockOp::Release { name, token, slot } => {
                let current = holders(&client, ns, name).await?;
                let released = match current.iter().find(|h| h.answers_to(*token, *slot, sub)) {
                    None => false,
                    Some(h) => client
                        .query_one(&stmt(&client, "SELECT applied FROM queen.kv_delete_v1($1, $2, $3)").await?, &[ns, &format!("{name}#{}", h.slot), token])
                        .await?
                        .get::<_, Option<bool>>(0)
                        .unwrap_or(false),
                };
                if released {
                    json!({"released": true, "name": name})
                } else {
                    json!({"released": false, "name": name, "reason": "lost"})
                }
            }
            LockOp::Get { name } => {
                let h = holders(&client, ns, name).await?;
                json!({"held": !h.is_empty(), "name": name, "holders": holders_json(&h)})
            }
        });
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_parse_and_bad_ones_name_their_field() {
        let ops = parse(&json!([{"op": "acquire", "name": "report", "ttlSeconds": 30, "limit": 3},
                               {"op": "renew", "name": "report", "token": 7, "ttlSeconds": 30, "slot": 1},
                               {"op": "release", "name": "report", "token": 8},
                               {"op": "get", "name": "report"}]))
        .unwrap();
        assert_eq!(ops[0], LockOp::Acquire { name: "report".into(), ttl: 30, owner: None, limit: 3 });
        assert_eq!(ops[2], LockOp::Release { name: "report".into(), token: 8, slot: None });
        for (op, want) in [
            (json!({"op": "acquire", "name": "a#b", "ttlSeconds": 1}), "operations[0].name"),
            (json!({"op": "acquire", "name": "a"}), "operations[0].ttlSeconds: required"),
            (json!({"op": "acquire", "name": "a", "ttlSeconds": 1, "limit": 2000}), "operations[0].limit"),
            (json!({"op": "renew", "name": "a", "ttlSeconds": 1}), "operations[0].token: required"),
            (json!({"op": "release", "name": "a", "token": 0}), "operations[0].token"),
            (json!({"op": "steal", "name": "a"}), "operations[0].op: unknown"),
        ] {
            let e = parse(&json!({"operations": [op.clone()]})).unwrap_err();
            assert!(e.detail.starts_with(want), "{op}: {}", e.detail);
        }
        let many: Vec<Value> = (0..65).map(|_| json!({"op": "get", "name": "a"})).collect();
        assert!(parse(&json!(many)).unwrap_err().too_many);
    }
}
