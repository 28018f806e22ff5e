//! Transactions that carry KV (issue 29 §4): the `kv` rider commits with
//! the bundle's acks and pushes or not at all; a lost guard refuses the
//! whole step; switched-off families answer 403; a kill mid-stream leaves
//! every bundle whole or absent.

mod common;

use std::time::Duration;

use common::{eventually, stored_messages, Broker};
use serde_json::{json, Value};

async fn leased(b: &Broker, txn: &str) -> (String, String) {
    b.post("/api/v1/push", json!({"items": [{"queue": "in", "payload": "work", "transactionId": txn}]})).await;
    let body = b.pop("/api/v1/pop/queue/in?consumerGroup=g&batch=1").await.body.unwrap();
    (body["messages"][0]["partitionId"].as_str().unwrap().into(), body["leaseId"].as_str().unwrap().into())
}

async fn get(b: &Broker, ns: &str, key: &str) -> Value {
    let (_, r) = b.post("/api/v1/kv", json!([{"op": "get", "ns": ns, "key": key}])).await;
    r["results"][0].clone()
}

#[tokio::test]
async fn a_step_acks_its_input_pushes_its_output_and_updates_its_state_in_one_commit() {
    let b = Broker::start().await;
    let (pid, lease) = leased(&b, "job-1").await;
    let (status, body) = b
        .post("/api/v1/transaction", json!({
            "operations": [
                {"type": "ack", "transactionId": "job-1", "partitionId": pid, "status": "completed", "consumerGroup": "g", "leaseId": lease},
                {"type": "push", "items": [{"queue": "out", "payload": {"done": 1}, "transactionId": "o1"}]}],
            "requiredLeases": [lease],
            "kv": [{"op": "incr", "ns": "stats", "key": "done", "forever": true},
                   {"op": "put", "ns": "stats", "key": "last", "value": "job-1", "ttlSeconds": 60}]}))
        .await;
    assert_eq!((status, body["success"].clone()), (200, json!(true)), "{body}");
    let r = body["results"].as_array().unwrap();
    assert_eq!(r.len(), 4, "the ack, the pushed item, then the two kv results");
    assert_eq!((r[2]["index"].clone(), r[2]["type"].clone(), r[2]["value"].clone()), (json!(2), json!("kv"), json!(1)));
    assert_eq!((r[3]["index"].clone(), r[3]["applied"].clone()), (json!(3), json!(true)));
    assert_eq!(get(&b, "stats", "done").await["value"], 1);
    assert_eq!(get(&b, "stats", "last").await["value"], "job-1");
    assert_eq!(b.cursor(&pid, "g").await.0, 0);
    assert_eq!(stored_messages(&b.sql().await, "out", "Default").await.len(), 1);
}

#[tokio::test]
async fn a_lost_guard_refuses_the_whole_step() {
    let b = Broker::start().await;
    let (pid, lease) = leased(&b, "job-2").await;
    let (_, lock) = b.post("/api/v1/locks", json!([{"op": "acquire", "name": "step", "ttlSeconds": 1, "owner": "zombie"}])).await;
    let guard = lock["results"][0]["guard"].clone();
    // The holder pauses past its lifetime; someone else takes the lock.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, other) = b.post("/api/v1/locks", json!([{"op": "acquire", "name": "step", "ttlSeconds": 30, "owner": "successor"}])).await;
    assert_eq!(other["results"][0]["acquired"], true);
    let (status, body) = b
        .post("/api/v1/transaction", json!({
            "operations": [
                {"type": "push", "items": [{"queue": "out", "payload": 1, "transactionId": "z1"}, {"queue": "out", "payload": 2, "transactionId": "z2"}]},
                {"type": "ack", "transactionId": "job-2", "partitionId": pid, "status": "completed", "consumerGroup": "g", "leaseId": lease}],
            "requiredLeases": [lease],
            "kv": [guard, {"op": "put", "ns": "stats", "key": "by", "value": "zombie", "forever": true}]}))
        .await;
    assert_eq!(status, 200);
    assert_eq!((body["success"].clone(), body["reason"].clone(), body["failedIndex"].clone(), body["kvReason"].clone()),
               (json!(false), json!("kv_precondition"), json!(3), json!("version")), "{body}");
    assert_eq!(body["value"], json!({"owner": "successor"}), "the client compares the owner to tell its own renewal");
    assert_eq!(body["results"], json!([]));
    assert_eq!(b.cursor(&pid, "g").await.0, -1, "the ack did not commit");
    assert!(stored_messages(&b.sql().await, "out", "Default").await.is_empty(), "nor the pushes");
    assert_eq!(get(&b, "stats", "by").await["found"], false, "nor the kv write");
    // With the successor's guard (its token is shown to it alone) the same step commits.
    let token = other["results"][0]["token"].clone();
    let (_, ok) = b
        .post("/api/v1/transaction", json!({
            "operations": [{"type": "ack", "transactionId": "job-2", "partitionId": pid, "status": "completed", "consumerGroup": "g", "leaseId": lease}],
            "requiredLeases": [lease],
            "kv": [{"op": "check", "ns": "queen-locks", "key": "step#0", "expect": token, "required": true}]}))
        .await;
    assert_eq!(ok["success"], true, "{ok}");
}

#[tokio::test]
async fn riders_of_switched_off_or_unbuilt_families_are_403_and_bad_ones_400() {
    let off = Broker::start_with(&[("QUEEN_KV_ENABLED", "false")]).await;
    let (status, body) = off
        .post("/api/v1/transaction", json!({"operations": [{"type": "push", "queue": "q", "payload": 1}],
                                            "kv": [{"op": "get", "ns": "n", "key": "k"}]}))
        .await;
    assert_eq!((status, body["success"].clone()), (403, json!(false)));
    assert!(body["error"].as_str().unwrap().contains("kv riders"));
    let (status, _) = off.post("/api/v1/transaction", json!({"operations": [{"type": "push", "queue": "q", "payload": 1}], "kv": []})).await;
    assert_eq!(status, 200, "an empty rider is no rider");
    let b = Broker::start().await;
    let (status, body) = b
        .post("/api/v1/transaction", json!({"operations": [{"type": "push", "queue": "q", "payload": 1}],
                                          "kv": [{"op": "incr", "ns": "n", "key": "k"}]}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"], "kv[0]: exactly one of ttlSeconds and forever:true is required");
    assert!(stored_messages(&b.sql().await, "q", "Default").await.is_empty(), "nothing of a refused bundle ran");
}

#[tokio::test]
async fn a_broker_killed_mid_stream_leaves_every_bundle_whole_or_absent() {
    let mut b = Broker::start().await;
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
    let mut tasks = Vec::new();
    for i in 0..300 {
        let (http, url, answered) = (b.http.clone(), b.url.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            let body = json!({"operations": [{"type": "push", "items": [{"queue": "ledger", "payload": i, "transactionId": format!("t{i}")}]}],
                              "kv": [{"op": "incr", "ns": "ledger", "key": "count", "forever": true}]});
            if let Ok(r) = http.post(format!("{url}/api/v1/transaction")).json(&body).send().await {
                if r.json::<Value>().await.is_ok_and(|v| v["success"] == true) {
                    answered.lock().unwrap().push(i);
                }
            }
        }));
    }
    eventually("some bundles commit", Duration::from_secs(20), || {
        let answered = answered.clone();
        async move { answered.lock().unwrap().len() >= 30 }
    })
    .await;
    b.kill();
    for t in tasks {
        t.await.unwrap();
    }
    let sql = b.sql().await;
    let messages = stored_messages(&sql, "ledger", "Default").await;
    let count: i64 = sql
        .query_opt("SELECT value::text FROM queen.kv WHERE ns = 'ledger' AND key = 'count'", &[])
        .await
        .unwrap()
        .map_or(0, |r| r.get::<_, String>(0).parse().unwrap());
    assert_eq!(count, messages.len() as i64, "the counter and the pushes moved together");
    let stored: std::collections::HashSet<String> = messages.iter().map(|m| m.transaction_id.clone()).collect();
    for i in answered.lock().unwrap().clone() {
        assert!(stored.contains(&format!("t{i}")), "answered bundle {i} is stored");
    }
}

#[tokio::test]
async fn a_binary_transaction_carries_its_riders_in_its_head() {
    use base64::Engine as _;
    let b = Broker::start().await;
    let head = json!({"kv": [{"op": "incr", "ns": "bin", "key": "n", "forever": true}],
                      "timers": [{"op": "schedule", "queue": "bin-later", "timerKey": "k", "delayMs": 60_000, "txn": "bt",
                                  "payload": base64::engine::general_purpose::STANDARD.encode("1")}]});
    let (status, body) = b.post_raw("/api/v1/transaction", "application/x-queen-push", common::qtb1(&head, "bin-out", "b1")).await;
    assert_eq!((status, body["success"].clone()), (200, json!(true)), "{body}");
    let kinds: Vec<Value> = body["results"].as_array().unwrap().iter().map(|r| r["type"].clone()).collect();
    assert_eq!(kinds, [json!("push"), json!("kv"), json!("timer")], "pushed items, then kv, then timers");
    assert_eq!(get(&b, "bin", "n").await["value"], 1);
    assert_eq!(stored_messages(&b.sql().await, "bin-out", "Default").await.len(), 1);
    // A lost required verdict in the head refuses the framed pushes too.
    let head = json!({"kv": [{"op": "check", "ns": "bin", "key": "n", "expect": 999, "required": true}]});
    let (_, body) = b.post_raw("/api/v1/transaction", "application/x-queen-push", common::qtb1(&head, "bin-out", "b2")).await;
    assert_eq!((body["reason"].clone(), body["failedIndex"].clone()), (json!("kv_precondition"), json!(1)));
    assert_eq!(stored_messages(&b.sql().await, "bin-out", "Default").await.len(), 1);
}
