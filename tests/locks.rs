//! Locks and semaphores (issue 29 §2): acquire, renew, release, get;
//! fencing tokens that only grow; expiry without a sweeper; guards; many
//! contenders; bad calls.

mod common;

use std::time::Duration;

use common::Broker;
use serde_json::{json, Value};

const SECRET: &str = "locks-test-secret";

/// A read-write token of subject `sub`.
fn token(sub: &str) -> String {
    let claims = json!({"sub": sub, "role": "read-write", "exp": chrono::Utc::now().timestamp() + 300});
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes())).unwrap()
}

/// `POST path body` as `sub`: status and body.
async fn post_as(b: &Broker, sub: &str, path: &str, body: Value) -> (u16, Value) {
    let r = b.http.post(format!("{}{path}", b.url)).bearer_auth(token(sub)).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn locks(b: &Broker, ops: Value) -> Vec<Value> {
    let (status, r) = b.post("/api/v1/locks", json!({ "operations": ops })).await;
    assert_eq!(status, 200, "{r}");
    r["results"].as_array().unwrap().clone()
}

async fn one(b: &Broker, op: Value) -> Value {
    locks(b, json!([op])).await.remove(0)
}

#[tokio::test]
async fn a_lock_is_held_by_one_owner_renewed_with_new_tokens_and_released() {
    let b = Broker::start().await;
    let a = one(&b, json!({"op": "acquire", "name": "report", "ttlSeconds": 30, "owner": "alice"})).await;
    assert_eq!((a["acquired"].clone(), a["slot"].clone(), a["owner"].clone()), (json!(true), json!(0), json!("alice")));
    let t1 = a["token"].as_i64().unwrap();
    assert!(t1 > 0);
    assert_eq!(a["guard"], json!({"op": "check", "ns": "queen-locks", "key": "report#0", "expect": t1, "required": true}));
    // A retry whose answer was lost gets the same permit back.
    let again = one(&b, json!({"op": "acquire", "name": "report", "ttlSeconds": 30, "owner": "alice"})).await;
    assert_eq!((again["already"].clone(), again["token"].clone()), (json!(true), json!(t1)));
    let bob = one(&b, json!({"op": "acquire", "name": "report", "ttlSeconds": 30, "owner": "bob"})).await;
    assert_eq!((bob["acquired"].clone(), bob["reason"].clone()), (json!(false), json!("held")));
    // Who holds it is shown; the holder's token is not (issue 45).
    assert_eq!(bob["holders"][0]["owner"], "alice");
    assert_eq!(bob["holders"][0].get("token"), None, "{bob}");

    let r = one(&b, json!({"op": "renew", "name": "report", "token": t1, "ttlSeconds": 30})).await;
    assert_eq!(r["renewed"], true);
    let t2 = r["token"].as_i64().unwrap();
    assert!(t2 > t1, "a renew issues a new, larger token");
    assert_eq!(r["guard"]["expect"], t2);
    let stale = one(&b, json!({"op": "renew", "name": "report", "token": t1, "ttlSeconds": 30})).await;
    assert_eq!((stale["renewed"].clone(), stale["reason"].clone()), (json!(false), json!("lost")));
    let g = one(&b, json!({"op": "get", "name": "report"})).await;
    assert_eq!((g["held"].clone(), g["holders"][0]["owner"].clone(), g["holders"][0].get("token")), (json!(true), json!("alice"), None));
    assert_eq!(stale["holders"][0].get("token"), None, "a refused renew shows no token: {stale}");
    assert_eq!(one(&b, json!({"op": "release", "name": "report", "token": t1})).await["released"], false);
    assert_eq!(one(&b, json!({"op": "release", "name": "report", "token": t2})).await["released"], true);
    assert_eq!(one(&b, json!({"op": "get", "name": "report"})).await["held"], false);
    let next = one(&b, json!({"op": "acquire", "name": "report", "ttlSeconds": 30})).await;
    assert!(next["acquired"] == true && next["token"].as_i64().unwrap() > t2);
    assert!(next["owner"].as_str().unwrap().len() >= 32, "an owner is minted when none is given");
}

#[tokio::test]
async fn a_semaphore_hands_out_its_permits_and_expired_ones_come_back_without_a_sweeper() {
    let b = Broker::start_with(&[("QUEEN_KV_SWEEP_INTERVAL_MS", "3600000")]).await;
    let mut slots = Vec::new();
    for who in ["w1", "w2", "w3"] {
        let r = one(&b, json!({"op": "acquire", "name": "pool", "ttlSeconds": 1, "owner": who, "limit": 3})).await;
        assert_eq!(r["acquired"], true, "{r}");
        slots.push(r["slot"].as_i64().unwrap());
    }
    assert_eq!(slots, [0, 1, 2]);
    let full = one(&b, json!({"op": "acquire", "name": "pool", "ttlSeconds": 1, "owner": "w4", "limit": 3})).await;
    assert_eq!((full["acquired"].clone(), full["holders"].as_array().unwrap().len()), (json!(false), 3));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let freed = one(&b, json!({"op": "acquire", "name": "pool", "ttlSeconds": 30, "owner": "w4", "limit": 3})).await;
    assert_eq!((freed["acquired"].clone(), freed["slot"].clone()), (json!(true), json!(0)), "an expired permit is free at once");
    let g = one(&b, json!({"op": "get", "name": "pool"})).await;
    assert_eq!(g["holders"].as_array().unwrap().len(), 1, "expired holders are not listed");
}

#[tokio::test]
async fn a_guard_holds_while_the_permit_is_ours_and_refuses_after_it_was_lost() {
    let b = Broker::start().await;
    let a = one(&b, json!({"op": "acquire", "name": "job", "ttlSeconds": 1, "owner": "old"})).await;
    let guard = a["guard"].clone();
    let (_, ok) = b.post("/api/v1/kv", json!({"operations": [guard.clone(), {"op": "put", "ns": "out", "key": "step", "value": 1, "forever": true}]})).await;
    assert_eq!(ok["success"], true, "{ok}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(one(&b, json!({"op": "acquire", "name": "job", "ttlSeconds": 30, "owner": "new"})).await["acquired"], true);
    let (_, late) = b.post("/api/v1/kv", json!({"operations": [guard, {"op": "put", "ns": "out", "key": "step", "value": 2, "forever": true}]})).await;
    assert_eq!((late["success"].clone(), late["reason"].clone(), late["failedIndex"].clone()), (json!(false), json!("kv_precondition"), json!(0)));
    let (_, step) = b.post("/api/v1/kv", json!({"operations": [{"op": "get", "ns": "out", "key": "step"}]})).await;
    assert_eq!(step["results"][0]["value"], 1, "the zombie's write did not land");
}

#[tokio::test]
async fn of_thirty_two_contenders_one_wins_and_on_a_thousand_locks_all_do() {
    let b = Broker::start().await;
    let contend = |names: Vec<String>| {
        let (http, url) = (b.http.clone(), b.url.clone());
        names
            .into_iter()
            .enumerate()
            .map(move |(i, name)| {
                let (http, url) = (http.clone(), url.clone());
                tokio::spawn(async move {
                    let body = json!([{"op": "acquire", "name": name, "ttlSeconds": 30, "owner": format!("o{i}")}]);
                    let r: Value = http.post(format!("{url}/api/v1/locks")).json(&body).send().await.unwrap().json().await.unwrap();
                    r["results"][0]["acquired"].as_bool().unwrap()
                })
            })
            .collect::<Vec<_>>()
    };
    let mut won = 0;
    for t in contend(vec!["one".to_string(); 32]) {
        won += t.await.unwrap() as i32;
    }
    assert_eq!(won, 1);
    let mut won = 0;
    for t in contend((0..1000).map(|i| format!("l{i}")).collect()) {
        won += t.await.unwrap() as i32;
    }
    assert_eq!(won, 1000);
}

#[tokio::test]
async fn bad_lock_calls_are_refused_with_the_envelope() {
    let b = Broker::start().await;
    let (status, r) = b.post("/api/v1/locks", json!({"operations": [{"op": "acquire", "name": "x"}]})).await;
    assert_eq!((status, r["error"].clone(), r["reason"].clone()), (400, json!("locks_bad_request"), json!("invalid_ttl")));
    assert!(r["detail"].as_str().unwrap().starts_with("operations[0].ttlSeconds"));
    let (status, _) = b.post("/api/v1/locks", json!({"nope": 1})).await;
    assert_eq!(status, 400);
    let many: Vec<Value> = (0..65).map(|_| json!({"op": "get", "name": "x"})).collect();
    let (status, r) = b.post("/api/v1/locks", json!(many)).await;
    assert_eq!((status, r["reason"].clone()), (413, json!("too_many_operations")));
    let r = locks(&b, json!([{"op": "get", "name": "x"}, {"op": "acquire", "name": "x", "ttlSeconds": 5}, {"op": "get", "name": "x"}])).await;
    assert_eq!(r.len(), 3, "one result per operation, in order");
    assert_eq!((r[0]["held"].clone(), r[1]["acquired"].clone(), r[2]["held"].clone()), (json!(false), json!(true), json!(true)));
}

/// Issue 44 §4: an acquire sent again by the owner that holds the permit (a
/// retry after a lost reply, racing the original) answers success with
/// `already: true` and the same token, for a lock and for a semaphore: never
/// a second permit, never a refusal.
#[tokio::test]
async fn an_owners_concurrent_retries_get_its_one_permit_back() {
    let b = Broker::start().await;
    for (round, limit) in [1, 3, 1, 3, 1, 3, 1, 3].into_iter().enumerate() {
        let name = format!("retry-{round}");
        let calls = (0..6).map(|_| {
            let b = &b;
            let name = name.clone();
            async move { one(b, json!({"op": "acquire", "name": name, "ttlSeconds": 30, "owner": "worker-1", "limit": limit})).await }
        });
        let answers = futures_util::future::join_all(calls).await;
        for a in &answers {
            assert_eq!(a["acquired"], true, "limit {limit}: {a}");
        }
        let tokens: std::collections::BTreeSet<i64> = answers.iter().map(|a| a["token"].as_i64().unwrap()).collect();
        let slots: std::collections::BTreeSet<i64> = answers.iter().map(|a| a["slot"].as_i64().unwrap()).collect();
        assert_eq!((tokens.len(), slots.len()), (1, 1), "limit {limit}: one permit, one token: {answers:?}");
        assert_eq!(answers.iter().filter(|a| a.get("already").is_none()).count(), 1, "one took it, the rest were retries: {answers:?}");
        let held = one(&b, json!({"op": "get", "name": name})).await;
        assert_eq!(held["holders"].as_array().unwrap().len(), 1, "{held}");
    }
}

/// Issue 45: read-write alone does not break another's lock. Mallory knows
/// the owner name (holders show it) and can guess tokens (they grow from one
/// sequence), yet gets no token, renews and releases nothing, and cannot
/// read or write the permit rows through plain KV or a transaction.
#[tokio::test]
async fn another_subject_can_neither_read_nor_move_a_permit() {
    let b = Broker::start_with(&[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)]).await;
    let lock = |ops: Value| json!({ "operations": ops });
    let (_, a) = post_as(&b, "alice", "/api/v1/locks", lock(json!([{"op": "acquire", "name": "ledger", "ttlSeconds": 30, "owner": "w1"}]))).await;
    let a = &a["results"][0];
    let t = a["token"].as_i64().unwrap();
    assert_eq!(a["acquired"], true);
    // Alice's own retry still answers her permit and token.
    let (_, again) = post_as(&b, "alice", "/api/v1/locks", lock(json!([{"op": "acquire", "name": "ledger", "ttlSeconds": 30, "owner": "w1"}]))).await;
    assert_eq!((again["results"][0]["already"].clone(), again["results"][0]["token"].clone()), (json!(true), json!(t)));
    // Mallory, with Alice's owner name and her exact token.
    let (_, m) = post_as(&b, "mallory", "/api/v1/locks", lock(json!([
        {"op": "acquire", "name": "ledger", "ttlSeconds": 30, "owner": "w1"},
        {"op": "get", "name": "ledger"},
        {"op": "renew", "name": "ledger", "token": t, "ttlSeconds": 30},
        {"op": "release", "name": "ledger", "token": t},
    ]))).await;
    let m = m["results"].as_array().unwrap();
    assert_eq!((m[0]["acquired"].clone(), m[0]["reason"].clone()), (json!(false), json!("held")));
    assert!(!m.iter().any(|r| r.to_string().contains(&format!("\"token\":{t}"))), "no answer to mallory names the token: {m:?}");
    assert_eq!(m[1]["holders"][0]["owner"], "w1", "owners may be shown");
    assert_eq!((m[2]["renewed"].clone(), m[3]["released"].clone()), (json!(false), json!(false)));
    // Plain KV: 403 naming the namespace, nothing read or written.
    for op in [json!({"op": "get", "ns": "queen-locks", "key": "ledger#0"}),
               json!({"op": "getPrefix", "ns": "queen-locks", "prefix": "ledger"}),
               json!({"op": "delete", "ns": "queen-locks", "key": "ledger#0"}),
               json!({"op": "put", "ns": "queen-locks", "key": "ledger#0", "value": {"owner": "m"}, "forever": true})] {
        let (status, r) = post_as(&b, "mallory", "/api/v1/kv", json!({"operations": [op.clone()]})).await;
        assert_eq!((status, r["error"].clone(), r["reason"].clone()), (403, json!("kv_forbidden"), json!("reserved_namespace")), "{op}: {r}");
        assert!(r["detail"].as_str().unwrap().starts_with("operations[0].ns: queen-locks"), "{r}");
    }
    let r = b.http.get(format!("{}/api/v1/kv/queen-locks/ledger%230", b.url)).bearer_auth(token("mallory")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // The operator's key listing shows the permit, not its token.
    let (status, listed) = post_as(&b, "mallory", "/api/v1/resources/kv/list", json!({"ns": "queen-locks"})).await;
    assert_eq!((status, listed["keys"][0]["key"].clone(), listed["keys"][0]["version"].clone()), (200, json!("ledger#0"), Value::Null), "{listed}");
    // A transaction may check a guard, and a lost one does not say which token holds.
    let (status, r) = post_as(&b, "mallory", "/api/v1/transaction", json!({"operations": [], "kv": [{"op": "delete", "ns": "queen-locks", "key": "ledger#0"}]})).await;
    assert_eq!(status, 403, "{r}");
    let guess = json!({"op": "check", "ns": "queen-locks", "key": "ledger#0", "expect": t + 7, "required": true});
    let (status, r) = post_as(&b, "mallory", "/api/v1/transaction", json!({"operations": [], "kv": [guess.clone()]})).await;
    assert_eq!((status, r["success"].clone(), r["kvReason"].clone(), r["version"].clone()), (200, json!(false), json!("version"), Value::Null), "{r}");
    let (status, r) = post_as(&b, "mallory", "/api/v1/kv", json!({"operations": [{"op": "check", "ns": "queen-locks", "key": "ledger#0", "expect": 0}]})).await;
    assert_eq!((status, r["results"][0]["reason"].clone(), r["results"][0]["version"].clone()), (200, json!("exists"), Value::Null), "a 'must not exist' probe learns no token: {r}");
    // Alice still holds it with the same token; her guard holds; she releases it.
    let (_, r) = post_as(&b, "alice", "/api/v1/kv", json!({"operations": [a["guard"].clone()]})).await;
    assert_eq!((r["success"].clone(), r["results"][0]["version"].clone()), (json!(true), json!(t)), "{r}");
    let (_, r) = post_as(&b, "alice", "/api/v1/locks", lock(json!([{"op": "renew", "name": "ledger", "token": t, "ttlSeconds": 30}]))).await;
    let t2 = r["results"][0]["token"].as_i64().unwrap();
    let (_, r) = post_as(&b, "alice", "/api/v1/locks", lock(json!([{"op": "release", "name": "ledger", "token": t2}]))).await;
    assert_eq!(r["results"][0]["released"], true);
}
