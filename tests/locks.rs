//! Locks and semaphores (issue 29 §2): acquire, renew, release, get;
//! fencing tokens that only grow; expiry without a sweeper; guards; many
//! contenders; bad calls.

mod common;

use std::time::Duration;

use common::Broker;
use serde_json::{json, Value};

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
    assert_eq!((bob["holders"][0]["owner"].clone(), bob["holders"][0]["token"].clone()), (json!("alice"), json!(t1)));

    let r = one(&b, json!({"op": "renew", "name": "report", "token": t1, "ttlSeconds": 30})).await;
    assert_eq!(r["renewed"], true);
    let t2 = r["token"].as_i64().unwrap();
    assert!(t2 > t1, "a renew issues a new, larger token");
    assert_eq!(r["guard"]["expect"], t2);
    let stale = one(&b, json!({"op": "renew", "name": "report", "token": t1, "ttlSeconds": 30})).await;
    assert_eq!((stale["renewed"].clone(), stale["reason"].clone()), (json!(false), json!("lost")));
    let g = one(&b, json!({"op": "get", "name": "report"})).await;
    assert_eq!((g["held"].clone(), g["holders"][0]["owner"].clone(), g["holders"][0]["token"].clone()), (json!(true), json!("alice"), json!(t2)));
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
