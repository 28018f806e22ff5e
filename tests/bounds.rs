//! Limits on what one request may make the broker hold or do (issue 45,
//! "Unbounded growth driven by requests"): each is a documented bound
//! answered with a 400 or 413 that names it, and the bound itself passes.

mod common;

use common::Broker;
use serde_json::{json, Value};

#[tokio::test]
async fn a_pop_bounds_its_wait_its_lease_and_its_group_name() {
    let b = Broker::start().await;
    b.push_to("q", "p", &[json!(1)]).await;
    for (query, field) in [
        ("timeout=3600001&wait=true", "timeout: must be from 0 to 3600000 ms, got 3600001"),
        ("leaseSeconds=604801", "leaseSeconds: at most 604800, got 604801"),
        (&*format!("consumerGroup={}", "g".repeat(256)), "consumerGroup: longer than 255 bytes"),
        ("consumerGroup=a%01b", "consumerGroup: must not contain control characters"),
    ] {
        let (status, body) = b.get(&format!("/api/v1/pop/queue/q?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body["error"].as_str().unwrap().contains(field), "{query}: {body}");
    }
    // The bounds themselves are accepted, and nothing above was delivered.
    let group = "g".repeat(255);
    let popped = b.pop(&format!("/api/v1/pop/queue/q?consumerGroup={group}&leaseSeconds=604800&timeout=3600000")).await;
    assert_eq!(popped.data(), vec![json!(1)]);
    assert_eq!(b.pop("/api/v1/pop/queue/q?batch=5").await.data(), vec![json!(1)], "queue mode still has it: the refused pops claimed nothing");
}

#[tokio::test]
async fn a_lease_extension_says_what_is_wrong_with_its_body() {
    let b = Broker::start().await;
    b.push_to("q", "p", &[json!(1)]).await;
    let popped = b.pop("/api/v1/pop/queue/q?batch=1").await.body.unwrap();
    let lease = popped["leaseId"].as_str().unwrap();
    let path = format!("/api/v1/lease/{lease}/extend");
    for (body, want) in [
        (json!({"seconds": 604801}), "seconds: a whole number from 1 to 604800, got 604801"),
        (json!({"seconds": 0}), "seconds: a whole number from 1 to 604800, got 0"),
        (json!({"seconds": "soon"}), "seconds: a whole number from 1 to 604800, got \"soon\""),
    ] {
        let (status, r) = b.post(&path, body).await;
        assert_eq!((status, r["error"].as_str().unwrap_or_default()), (400, want), "{r}");
    }
    let (status, r) = b.post_raw(&path, "application/json", b"{\"seconds\": 3".to_vec()).await;
    assert_eq!(status, 400, "a body that does not parse no longer extends by 60 s: {r}");
    assert!(r["error"].as_str().unwrap().starts_with("bad body"), "{r}");
    // `{}` (what the official client sends) still means 60 s; a number is that many.
    let (_, r) = b.post(&path, json!({})).await;
    assert_eq!(r["success"], true, "{r}");
    let (_, r) = b.post(&path, json!({"seconds": 604800})).await;
    let expires = chrono::DateTime::parse_from_rfc3339(r["expiresAt"].as_str().unwrap()).unwrap();
    let days = (expires.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_hours() as f64 / 24.0;
    assert!((6.9..=7.0).contains(&days), "a week: {r}");
}

#[tokio::test]
async fn a_stream_state_read_is_bounded_and_never_cut_silently() {
    let b = Broker::start().await;
    let (_, r) = b.post("/streams/v1/queries", json!({"name": "big", "source_queue": "src", "config_hash": "h", "reset": false})).await;
    let q = r["query_id"].as_str().unwrap().to_string();
    let sql = b.sql().await;
    let qid = uuid::Uuid::parse_str(&q).unwrap();
    sql.execute(
        "INSERT INTO queen.stream_state (query_id, partition_id, key, value) SELECT $1, 7, 'k' || lpad(i::text, 6, '0'), '1' FROM generate_series(1, 10001) i",
        &[&qid],
    )
    .await
    .unwrap();
    let get = |extra: Value| {
        let mut body = json!({"query_id": q, "partition_id": "7"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        b.post("/streams/v1/state/get", body)
    };
    let (status, r) = get(json!({})).await;
    assert_eq!((status, r["success"].clone()), (413, json!(false)), "{r}");
    assert!(r["error"].as_str().unwrap().starts_with("more than 10000 state rows match"), "{r}");
    let keys: Vec<String> = (0..10_001).map(|i| format!("k{i}")).collect();
    let (status, r) = get(json!({"keys": keys})).await;
    assert_eq!((status, r["error"].clone()), (413, json!("keys: at most 10000 per call, got 10001")));
    // Narrowed under the bound: every matching row, exactly.
    let (status, r) = get(json!({"key_prefix": "k00"})).await;
    assert_eq!((status, r["rows"].as_array().map(Vec::len)), (200, Some(9999)), "k000001..k009999");
    sql.execute("DELETE FROM queen.stream_state WHERE key = 'k010001'", &[]).await.unwrap();
    let (status, r) = get(json!({})).await;
    assert_eq!((status, r["rows"].as_array().map(Vec::len)), (200, Some(10_000)), "the bound itself is answered whole");
}
