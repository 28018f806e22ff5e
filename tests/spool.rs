//! Push maintenance and the spool (issue 5): what is answered `buffered` is
//! on disk and reaches the log once, in order, even across a restart.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{eventually, Broker};
use serde_json::{json, Value};

#[tokio::test]
async fn a_thousand_spooled_pushes_survive_a_restart_and_arrive_once_in_order() {
    let mut b = Broker::start().await;
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    for r in 0..10 {
        let items: Vec<Value> = (0..100)
            .map(|i| {
                let n = r * 100 + i;
                json!({"queue": "spooled", "partition": format!("p{}", n % 4), "payload": n})
            })
            .collect();
        let (status, body) = b.post("/api/v1/push", json!({ "items": items })).await;
        assert_eq!(status, 201);
        assert!(body.as_array().unwrap().iter().all(|i| i["status"] == "buffered" && i["transactionId"].is_string()));
    }
    let (_, m) = b.get("/api/v1/system/maintenance").await;
    assert_eq!((m["enabled"].as_bool(), m["spoolPending"].as_bool()), (Some(true), Some(true)));
    let sql = b.sql().await;
    let segments: i64 = sql.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get(0);
    assert_eq!(segments, 0, "nothing written during maintenance");

    b.restart().await; // kill -9: the spool files are all that is left
    b.post("/api/v1/system/maintenance", json!({"enabled": false})).await;
    eventually("the spool to drain", Duration::from_secs(20), || async {
        sql.query_one("SELECT COALESCE(sum(last_offset + 1), 0)::bigint FROM queen.partitions", &[]).await.unwrap().get::<_, i64>(0) == 1000
    })
    .await;
    let mut per_partition: HashMap<String, Vec<i64>> = HashMap::new();
    for p in 0..4 {
        for m in common::stored_messages(&sql, "spooled", &format!("p{p}")).await {
            per_partition.entry(format!("p{p}")).or_default().push(m.payload.parse().unwrap());
        }
    }
    let total: usize = per_partition.values().map(Vec::len).sum();
    assert_eq!(total, 1000, "each message once");
    for (p, ns) in &per_partition {
        let mut sorted = ns.clone();
        sorted.sort();
        assert_eq!(ns, &sorted, "{p} keeps push order");
    }
    assert_eq!(b.get("/api/v1/system/maintenance").await.1["spoolPending"], false);
    // Pushes go straight to the log again.
    let (_, r) = b.post("/api/v1/push", json!({"items": [{"queue": "spooled", "payload": "live"}]})).await;
    assert_eq!(r[0]["status"], "queued");
}

#[tokio::test]
async fn a_spooled_push_to_names_with_quotes_and_backslashes_is_replayed() {
    // The spool line stores names as JSON strings; these need escapes, which
    // a line reader borrowing plain `&str` could not read back.
    let b = Broker::start().await;
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    let (queue, partition) = ("sp\"ool", "p\\1");
    let (status, body) = b.post("/api/v1/push", json!({"items": [{"queue": queue, "partition": partition, "payload": {"n": 1}}]})).await;
    assert_eq!((status, body[0]["status"].as_str()), (201, Some("buffered")));
    assert_eq!(body[0]["queueName"], queue);
    b.post("/api/v1/system/maintenance", json!({"enabled": false})).await;
    let sql = b.sql().await;
    eventually("the spooled push to reach its partition", Duration::from_secs(20), || async {
        !common::stored_messages(&sql, queue, partition).await.is_empty()
    })
    .await;
    let stored = common::stored_messages(&sql, queue, partition).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].payload, r#"{"n":1}"#);
    assert_eq!(b.get("/api/v1/system/maintenance").await.1["spoolPending"], false);
}
