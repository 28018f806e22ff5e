//! `POST /api/v1/transaction` (API.md §2.4): push and ack atomically.

mod common;

use common::{stored_messages, Broker};
use serde_json::{json, Value};

/// Pushes one message to `in` and pops it leased: (transactionId, partitionId, leaseId).
async fn leased_one(b: &Broker) -> (String, String, String) {
    b.post("/api/v1/push", json!({"items": [{"queue": "in", "payload": "work", "transactionId": "job-1"}]})).await;
    let body = b.pop("/api/v1/pop/queue/in?consumerGroup=g").await.body.unwrap();
    let m = &body["messages"][0];
    (m["transactionId"].as_str().unwrap().into(), m["partitionId"].as_str().unwrap().into(), body["leaseId"].as_str().unwrap().into())
}

async fn segments(b: &Broker) -> i64 {
    b.sql().await.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_bundle_commits_the_ack_and_the_push_together() {
    let b = Broker::start().await;
    let (txn, pid, lease) = leased_one(&b).await;
    let (status, body) = b
        .post(
            "/api/v1/transaction",
            json!({"operations": [
                {"type": "ack", "transactionId": txn, "partitionId": pid, "status": "completed", "consumerGroup": "g", "leaseId": lease},
                {"type": "push", "items": [{"queue": "out", "payload": {"done": 1}, "transactionId": "o1"},
                                           {"queue": "out", "payload": {"done": 2}, "transactionId": "o1"},
                                           {"queue": "out", "partition": "p", "payload": 3, "transactionId": "o3"}]}
            ], "requiredLeases": [lease]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["success"], true, "{body}");
    assert_eq!(uuid::Uuid::parse_str(body["transactionId"].as_str().unwrap()).unwrap().get_version_num(), 7);
    let r = body["results"].as_array().unwrap();
    assert_eq!(r.len(), 4, "one slot per ack op and per pushed item");
    assert_eq!((r[0]["type"].as_str(), r[0]["index"].as_u64(), r[0]["error"].clone()), (Some("ack"), Some(0), Value::Null));
    assert_eq!((r[1]["type"].as_str(), r[1]["transactionId"].as_str(), r[1]["queueName"].as_str()), (Some("push"), Some("o1"), Some("out")));
    assert_eq!(r[2]["duplicate"], true, "in-bundle duplicates are first-wins");
    assert_eq!(r[2]["messageId"], r[1]["messageId"]);
    assert_eq!(r[3]["index"], 3);
    assert_eq!(b.cursor(&pid, "g").await, (0, None, 0));
    let sql = b.sql().await;
    assert_eq!(stored_messages(&sql, "out", "Default").await.len(), 1);
    assert_eq!(stored_messages(&sql, "out", "p").await.len(), 1);
    // And consumers of `out` see it.
    assert_eq!(b.pop("/api/v1/pop/queue/out/partition/Default").await.data(), [json!({"done": 1})]);
}

#[tokio::test]
async fn a_duplicate_push_rolls_the_whole_bundle_back() {
    let b = Broker::start().await;
    let (txn, pid, lease) = leased_one(&b).await;
    b.post("/api/v1/push", json!({"items": [{"queue": "out", "payload": "first", "transactionId": "same"}]})).await;
    let before = segments(&b).await;
    let (status, body) = b
        .post(
            "/api/v1/transaction",
            json!({"operations": [
                {"type": "ack", "transactionId": txn, "partitionId": pid, "status": "completed", "consumerGroup": "g", "leaseId": lease},
                {"type": "push", "items": [{"queue": "out", "payload": "fresh", "transactionId": "new"}]},
                {"type": "push", "items": [{"queue": "out", "payload": "again", "transactionId": "same"}]}
            ], "requiredLeases": [lease]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["success"], false);
    assert!(body["error"].as_str().unwrap().starts_with("QDUP"), "{body}");
    assert_eq!(body["results"], json!([]));
    assert_eq!(segments(&b).await, before, "nothing was written");
    assert_eq!(b.cursor(&pid, "g").await.0, -1, "the ack was rolled back");
    assert!(b.cursor(&pid, "g").await.1.is_some(), "and the lease still stands");
}

#[tokio::test]
async fn a_refused_ack_rolls_the_whole_bundle_back() {
    let b = Broker::start().await;
    let (txn, pid, _lease) = leased_one(&b).await;
    let before = segments(&b).await;
    let (_, body) = b
        .post(
            "/api/v1/transaction",
            json!({"operations": [
                {"type": "push", "items": [{"queue": "out", "payload": 1}]},
                {"type": "ack", "transactionId": txn, "partitionId": pid, "status": "completed", "consumerGroup": "g", "leaseId": "bogus"}
            ], "requiredLeases": ["bogus"]}),
        )
        .await;
    assert_eq!(body["success"], false);
    let error = body["error"].as_str().unwrap();
    assert!(error.starts_with("QTXN") && error.contains("invalid or expired lease"), "{error}");
    assert_eq!(segments(&b).await, before);
    assert_eq!(b.cursor(&pid, "g").await.0, -1);
}

#[tokio::test]
async fn an_ack_without_its_own_lease_takes_the_single_required_lease() {
    let b = Broker::start().await;
    let (txn, pid, lease) = leased_one(&b).await;
    let bundle = |required: Value| {
        json!({"operations": [{"type": "ack", "transactionId": txn, "partitionId": pid, "status": "completed", "consumerGroup": "g"}],
               "requiredLeases": required})
    };
    let (_, body) = b.post("/api/v1/transaction", bundle(json!(["someone-else"]))).await;
    assert_eq!(body["success"], false, "the required lease is checked: {body}");
    let (_, body) = b.post("/api/v1/transaction", bundle(json!([lease]))).await;
    assert_eq!(body["success"], true, "{body}");
    assert_eq!(b.cursor(&pid, "g").await.0, 0);
}

#[tokio::test]
async fn malformed_bundles_answer_400_and_riders_403() {
    let b = Broker::start().await;
    let (status, body) = b.post("/api/v1/transaction", json!({"requiredLeases": []})).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"], "transaction requires an operations array");
    assert_eq!(body["success"], false);
    assert_eq!(body["results"], json!([]));
    let (status, body) = b.post("/api/v1/transaction", json!({"operations": [{"type": "delete"}]})).await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("only push and ack"));
    let (status, body) = b.post("/api/v1/transaction", json!({"operations": [{"type": "push", "items": [{"queue": 3}]}]})).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"], "operations[0]: items[0].queue: must be a string");
    let (status, body) = b
        .post("/api/v1/transaction", json!({"operations": [{"type": "push", "queue": "q", "payload": 1}], "kv": [{"op": "put"}]}))
        .await;
    assert_eq!(status, 400, "a malformed kv rider: {body}");
    assert!(body["error"].as_str().unwrap().starts_with("kv[0]."), "{body}");
    let (status, body) = b.post("/api/v1/transaction", json!({"operations": [{"type": "push", "queue": "flat", "payload": 1}]})).await;
    assert_eq!((status, body["success"].as_bool()), (200, Some(true)), "a flat push operation is one item");
}

/// A bundle pushing more messages to one partition than a segment holds
/// writes segments of at most QUEEN_V2_FUSION_FRAMES, all in its one
/// transaction: consecutive offsets, every message once, in order.
#[tokio::test]
async fn a_bundle_larger_than_a_segment_is_written_as_segments_of_the_bounds_in_one_commit() {
    let b = Broker::start_with(&[("QUEEN_V2_FUSION_FRAMES", "100")]).await;
    let items: Vec<Value> = (0..250).map(|i| json!({"queue": "big", "partition": "p", "payload": i, "transactionId": format!("t{i}")})).collect();
    let others: Vec<Value> = (0..30).map(|i| json!({"queue": "big", "partition": "q", "payload": i})).collect();
    let (status, body) = b.post("/api/v1/transaction", json!({"operations": [{"type": "push", "items": items}, {"type": "push", "items": others}]})).await;
    assert_eq!((status, body["success"].clone()), (200, json!(true)), "{body}");
    let sql = b.sql().await;
    let sizes: Vec<(i64, i32)> = sql
        .query(
            "SELECT s.base_offset, s.msg_count FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
             WHERE p.name = 'p' ORDER BY s.base_offset",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(sizes, vec![(0, 100), (100, 100), (200, 50)]);
    let stored = stored_messages(&sql, "big", "p").await;
    assert_eq!(stored.iter().map(|m| m.offset).collect::<Vec<_>>(), (0..250).collect::<Vec<i64>>());
    assert_eq!(stored_messages(&sql, "big", "q").await.len(), 30);
    // A repeat of one of them rolls the whole bundle back, wherever its segment falls.
    let again = vec![json!({"queue": "big", "partition": "p", "payload": "new", "transactionId": "t-new"}),
                     json!({"queue": "big", "partition": "p", "payload": "dup", "transactionId": "t180"})];
    let (_, body) = b.post("/api/v1/transaction", json!({"operations": [{"type": "push", "items": again}]})).await;
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(stored_messages(&sql, "big", "p").await.len(), 250);
}
