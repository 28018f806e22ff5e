//! Dead letters and messages (API.md §2.8, issue 4).

mod common;

use common::Broker;
use serde_json::{json, Value};

/// Dead-letters `txns` of queue `q` (one message each, partition p) for `group`.
async fn dead_letter(b: &Broker, group: &str, txns: &[&str]) -> String {
    let items: Vec<Value> = txns.iter().map(|t| json!({"queue": "q", "partition": "p", "payload": {"t": t}, "transactionId": t})).collect();
    b.post("/api/v1/push", json!({ "items": items })).await;
    let mut pid = String::new();
    for _ in txns {
        let body = b.pop(&format!("/api/v1/pop/queue/q?batch=1&consumerGroup={group}")).await.body.unwrap();
        let m = &body["messages"][0];
        pid = m["partitionId"].as_str().unwrap().to_string();
        let (_, r) = b
            .post("/api/v1/ack", json!({"transactionId": m["transactionId"], "partitionId": pid, "status": "dlq", "error": format!("bad {}", m["transactionId"]), "consumerGroup": group, "leaseId": body["leaseId"]}))
            .await;
        assert_eq!(r[0]["dlq"], true);
    }
    pid
}

#[tokio::test]
async fn the_dlq_lists_newest_first_with_filters_and_the_full_total() {
    let b = Broker::start().await;
    let pid = dead_letter(&b, "g1", &["a", "b"]).await;
    dead_letter(&b, "g2", &["a"]).await;
    let (status, body) = b.get("/api/v1/dlq?queue=q").await;
    assert_eq!(status, 200);
    assert_eq!(body["total"], 3);
    assert_eq!(body["pagination"], json!({"limit": 100, "offset": 0}));
    let msgs = body["messages"].as_array().unwrap();
    let order: Vec<(&str, &str)> = msgs.iter().map(|m| (m["consumerGroup"].as_str().unwrap(), m["transactionId"].as_str().unwrap())).collect();
    assert_eq!(order, [("g2", "a"), ("g1", "b"), ("g1", "a")]);
    let m = &msgs[2];
    assert_eq!(m["data"], json!({"t": "a"}));
    assert_eq!(m["errorMessage"], "bad \"a\"");
    assert_eq!(m["retryCount"], 0);
    assert_eq!(m["partitionId"], pid);
    assert_eq!((m["queue"].as_str(), m["partition"].as_str()), (Some("q"), Some("p")));
    assert!(m["failedAt"].as_str().unwrap().ends_with('Z'));
    let (_, body) = b.get("/api/v1/dlq?queue=q&consumerGroup=g1&limit=1&offset=1").await;
    assert_eq!(body["total"], 2);
    assert_eq!(body["messages"].as_array().unwrap().len(), 1);
    assert_eq!(body["messages"][0]["transactionId"], "a");
    assert_eq!(b.get("/api/v1/dlq?queue=q&partition=elsewhere").await.1["total"], 0);
    assert_eq!(b.get("/api/v1/dlq").await.0, 400);
    assert_eq!(b.get("/api/v1/dlq?queue=q&from=yesterday").await.0, 400);
}

#[tokio::test]
async fn a_message_by_address_shows_its_derived_status() {
    // A queue without a dedup window keeps no index: found among the newest segments.
    for window in [None, Some(0)] {
        a_message_by_address_shows_its_status(window).await;
    }
}

async fn a_message_by_address_shows_its_status(window: Option<i64>) {
    let b = Broker::start().await;
    if let Some(w) = window {
        b.post("/api/v1/configure", json!({"queue": "s", "options": {"dedupWindowSeconds": w}})).await;
    }
    let pushed = b.push_to("s", "p", &[json!({"n": 1}), json!({"n": 2})]).await;
    let (pid, txn) = (pushed[0]["partitionId"].as_str().unwrap().to_string(), pushed[0]["transactionId"].as_str().unwrap().to_string());
    let path = format!("/api/v1/messages/{pid}/{txn}");
    let status = || async { b.get(&path).await.1["status"].as_str().unwrap().to_string() };
    let (code, body) = b.get(&format!("/api/v1/messages/{pid}/{txn}")).await;
    assert_eq!(code, 200);
    assert_eq!((body["data"].clone(), body["id"].clone(), body["queue"].as_str()), (json!({"n": 1}), pushed[0]["messageId"].clone(), Some("s")));
    assert_eq!(body["status"], "pending");
    let popped = b.pop("/api/v1/pop/queue/s?batch=1").await.body.unwrap();
    assert_eq!(status().await, "processing");
    b.ack_batch(None, &[(&txn, &pid, "completed", popped["leaseId"].as_str())]).await;
    assert_eq!(status().await, "completed");
    let (code, body) = b.get(&format!("/api/v1/messages/{pid}/no-such-txn")).await;
    assert_eq!((code, body), (404, json!({"error": "Message not found"})));
    assert_eq!(b.get("/api/v1/messages/not-a-pid/x").await.0, 404);
}

#[tokio::test]
async fn a_dead_letter_can_be_replayed_once_and_deleted() {
    let b = Broker::start().await;
    let pid = dead_letter(&b, "w", &["poison", "other"]).await;
    assert_eq!(b.get(&format!("/api/v1/messages/{pid}/poison")).await.1["status"], "dead_letter");
    let (status, body) = b.post_raw(&format!("/api/v1/messages/{pid}/poison/retry"), "application/json", vec![]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], "moved");
    assert_eq!(body["dlqRowRemoved"], true);
    let replay_txn = body["replayedAs"]["transaction_id"].as_str().unwrap().to_string();
    assert!(replay_txn.starts_with("dlq:"));
    assert_eq!(body["replayedAs"]["status"], "queued");
    // The group reads it again, now under the replay's transactionId.
    let r = b.pop("/api/v1/pop/queue/q?consumerGroup=w&batch=10").await;
    assert_eq!(r.data(), [json!({"t": "poison"})]);
    assert_eq!(r.messages()[0]["transactionId"], replay_txn);
    let (status, _) = b.post_raw(&format!("/api/v1/messages/{pid}/poison/retry"), "application/json", vec![]).await;
    assert_eq!(status, 404, "the row is gone: nothing to replay twice");
    // Delete removes a dead-letter row; live messages are immutable.
    let (status, body) = b.http.delete(format!("{}/api/v1/messages/{pid}/other", b.url)).send().await.map(|r| (r.status().as_u16(), r)).unwrap();
    assert_eq!(status, 200);
    assert_eq!(body.json::<Value>().await.unwrap()["message"], "Message deleted successfully");
    let r = b.http.delete(format!("{}/api/v1/messages/{pid}/{replay_txn}", b.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(b.get("/api/v1/dlq?queue=q").await.1["total"], 0);
}

#[tokio::test]
async fn the_message_listing_is_newest_first_with_filters() {
    let b = Broker::start().await;
    b.push_to("list", "a", &[json!(1), json!(2)]).await;
    b.push_to("list", "b", &[json!(3)]).await;
    b.push_to("other", "a", &[json!(9)]).await;
    let (status, body) = b.get("/api/v1/messages?queue=list&limit=2").await;
    assert_eq!(status, 200);
    assert_eq!(body["total"], 3);
    let data: Vec<Value> = body["messages"].as_array().unwrap().iter().map(|m| m["data"].clone()).collect();
    assert_eq!(data, [json!(3), json!(2)]);
    let (_, body) = b.get("/api/v1/messages?queue=list&partition=a&offset=1").await;
    assert_eq!(body["messages"].as_array().unwrap().iter().map(|m| m["data"].clone()).collect::<Vec<_>>(), [json!(1)]);
    b.pop("/api/v1/pop/queue/list/partition/b?autoAck=true").await;
    let (_, body) = b.get("/api/v1/messages?queue=list&status=completed").await;
    assert_eq!(body["messages"].as_array().unwrap().iter().map(|m| m["data"].clone()).collect::<Vec<_>>(), [json!(3)]);
    assert_eq!(b.get("/api/v1/messages?limit=zero").await.0, 400);
}

/// `DELETE /api/v1/dlq` (issue 28 §3): the filters pick what goes, and only
/// that; `queue` is required.
#[tokio::test]
async fn a_dlq_purge_removes_what_its_filters_match_and_nothing_else() {
    let b = Broker::start().await;
    dead_letter(&b, "g1", &["a", "b"]).await;
    dead_letter(&b, "g2", &["a"]).await;
    let r = b.http.delete(format!("{}/api/v1/dlq?queue=q&consumerGroup=g1", b.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!((body["success"].clone(), body["deleted"].clone()), (json!(true), json!(2)));
    let (_, left) = b.get("/api/v1/dlq?queue=q").await;
    assert_eq!(left["total"], 1);
    assert_eq!(left["messages"][0]["consumerGroup"], "g2");
    let r = b.http.delete(format!("{}/api/v1/dlq", b.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400, "queue is required");
    assert_eq!(b.get("/api/v1/dlq?queue=q").await.1["total"], 1, "a refused purge removes nothing");
    let r = b.http.delete(format!("{}/api/v1/dlq?queue=q", b.url)).send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["deleted"], 1);
    assert_eq!(b.get("/api/v1/dlq?queue=q").await.1["total"], 0);
}

/// `POST /api/v1/dlq/{id}/replay` (issue 28 §3): one row by id, into its own
/// partition or into the body's target; a repeat is a 404 (the row went), a
/// bad target a 400 that changes nothing, push maintenance a 503.
#[tokio::test]
async fn a_dead_letter_replays_by_id_into_its_partition_or_a_target() {
    let b = Broker::start().await;
    dead_letter(&b, "g", &["a", "b"]).await;
    let (_, dlq) = b.get("/api/v1/dlq?queue=q").await;
    let id_of = |txn: &str| {
        dlq["messages"].as_array().unwrap().iter().find(|m| m["transactionId"] == txn).unwrap()["id"].as_str().unwrap().to_string()
    };
    let (a, bb) = (id_of("a"), id_of("b"));

    let (status, r) = b.post(&format!("/api/v1/dlq/{a}/replay"), json!({})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["result"].clone(), r["queue"].clone(), r["partition"].clone()), (json!("moved"), json!("q"), json!("p")));
    assert_eq!(r["originalTransactionId"], "a");
    assert_eq!(r["replayedAs"]["transaction_id"], format!("dlq:{a}"));
    assert_eq!(b.post(&format!("/api/v1/dlq/{a}/replay"), json!({})).await.0, 404, "the row went with the replay");

    let (status, r) = b.post(&format!("/api/v1/dlq/{bb}/replay"), json!({"queue": 7})).await;
    assert_eq!((status, r["error"].clone()), (400, json!("queue: must be a string")));
    b.post("/api/v1/system/maintenance", json!({"enabled": true})).await;
    assert_eq!(b.post(&format!("/api/v1/dlq/{bb}/replay"), json!({})).await.0, 503);
    b.post("/api/v1/system/maintenance", json!({"enabled": false})).await;
    assert_eq!(b.get("/api/v1/dlq?queue=q").await.1["total"], 1, "refusals changed nothing");

    let (status, r) = b.post(&format!("/api/v1/dlq/{bb}/replay"), json!({"queue": "repaired", "partition": "fixed"})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["queue"].clone(), r["partition"].clone()), (json!("repaired"), json!("fixed")));
    let popped = b.pop("/api/v1/pop/queue/repaired/partition/fixed?batch=5").await;
    assert_eq!(popped.data(), vec![json!({"t": "b"})]);
    assert_eq!(popped.messages()[0]["transactionId"], format!("dlq:{bb}"));
    // The replay into q's own partition is there too, for a group that reads it.
    let again = b.pop("/api/v1/pop/queue/q?batch=10&consumerGroup=fresh").await;
    assert!(again.data().contains(&json!({"t": "a"})));
    assert_eq!(b.post("/api/v1/dlq/not-a-number/replay", json!({})).await.0, 404);
    assert_eq!(b.get("/api/v1/dlq?queue=q").await.1["total"], 0);
}

/// Issue 45: a replay pushed on one connection and deleted the dead letter
/// on another, so a crash between them left it to be replayed again, and
/// two replays at once could both push. Now one transaction locks, pushes
/// and deletes: of many concurrent replays of one dead letter exactly one
/// moves it, the rest find nothing, and it is in the queue once.
#[tokio::test]
async fn concurrent_replays_of_one_dead_letter_move_it_once() {
    let b = Broker::start().await;
    let pid = dead_letter(&b, "w", &["poison"]).await;
    let (_, list) = b.get("/api/v1/dlq?queue=q").await;
    let id = list["messages"][0]["id"].as_str().map(str::to_string).unwrap_or_else(|| list["messages"][0]["id"].to_string());
    let replays: Vec<_> = (0..8)
        .map(|_| {
            let (http, url) = (b.http.clone(), format!("{}/api/v1/dlq/{id}/replay", b.url));
            tokio::spawn(async move {
                let r = http.post(url).send().await.unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for r in replays {
        outcomes.push(r.await.unwrap());
    }
    let moved = outcomes.iter().filter(|(s, b)| *s == 200 && b["result"] == "moved").count();
    let gone = outcomes.iter().filter(|(s, _)| *s == 404).count();
    assert_eq!((moved, gone), (1, 7), "{outcomes:?}");
    let stored = common::stored_messages(&b.sql().await, "q", "p").await;
    let replayed: Vec<_> = stored.iter().filter(|m| m.transaction_id.starts_with("dlq:")).collect();
    assert_eq!(replayed.len(), 1, "pushed back once");
    assert_eq!(b.get("/api/v1/dlq?queue=q").await.1["total"], 0);
    assert_eq!(b.get(&format!("/api/v1/messages/{pid}/poison")).await.1["status"], "completed");
}
