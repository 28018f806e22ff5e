//! Traces (issue 28 §1): the write a consumer makes per message, the three
//! reads, what bad input gets, that traces leave with their messages, and
//! that an answered trace survives a crash.

mod common;

use std::time::Duration;

use common::{eventually, Broker};
use serde_json::{json, Value};

/// Pushes `n` messages to (queue, "p") and pops them; (partitionId, transactionIds).
async fn consumed(b: &Broker, queue: &str, n: usize) -> (String, Vec<String>) {
    let payloads: Vec<Value> = (0..n).map(|i| json!({"i": i})).collect();
    b.push_to(queue, "p", &payloads).await;
    let popped = b.pop(&format!("/api/v1/pop/queue/{queue}?batch={n}&wait=false")).await;
    let messages = popped.messages();
    assert_eq!(messages.len(), n);
    let pid = messages[0]["partitionId"].as_str().unwrap().to_string();
    (pid, messages.iter().map(|m| m["transactionId"].as_str().unwrap().to_string()).collect())
}

async fn trace(b: &Broker, body: Value) -> (u16, Value) {
    b.post("/api/v1/traces", body).await
}

async fn trace_count(b: &Broker) -> i64 {
    b.sql().await.query_one("SELECT count(*) FROM queen.traces", &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn traces_are_stored_and_read_by_message_by_name_and_as_a_name_list() {
    let b = Broker::start().await;
    let (pid, txns) = consumed(&b, "orders", 3).await;
    // Message 0 gets two events, the second named twice; message 1 one
    // event under another name; message 2 one without a name.
    let (status, first) = trace(&b, json!({"transactionId": txns[0], "partitionId": pid, "consumerGroup": "billing",
                                           "traceNames": ["order-1"], "eventType": "step", "data": {"stage": "received"}})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["success"], true);
    let first_id = first["traceId"].as_str().unwrap().to_string();
    assert_eq!(uuid::Uuid::parse_str(&first_id).unwrap().get_version_num(), 7);
    for body in [
        json!({"transactionId": txns[0], "partitionId": pid, "traceNames": ["order-1", "customer-9"], "data": {"stage": "charged"}}),
        json!({"transactionId": txns[1], "partitionId": pid, "traceNames": ["customer-9"], "eventType": "error", "data": "declined"}),
        json!({"transactionId": txns[2], "partitionId": pid, "traceNames": null, "data": 3}),
    ] {
        let (status, r) = trace(&b, body).await;
        assert_eq!((status, r["success"].clone()), (200, json!(true)), "{r}");
    }

    // By message: oldest first, every field.
    let (status, m) = b.get(&format!("/api/v1/traces/{pid}/{}", txns[0])).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!((m["count"].clone(), m["queue"].clone(), m["partition"].clone()), (json!(2), json!("orders"), json!("p")));
    let t = &m["traces"][0];
    assert_eq!(t["traceId"], json!(first_id));
    assert_eq!((t["transactionId"].as_str(), t["partitionId"].as_str()), (Some(txns[0].as_str()), Some(pid.as_str())));
    assert_eq!((t["consumerGroup"].clone(), t["eventType"].clone()), (json!("billing"), json!("step")));
    assert_eq!((t["traceNames"].clone(), t["data"].clone()), (json!(["order-1"]), json!({"stage": "received"})));
    assert!(t["createdAt"].as_str().unwrap().ends_with('Z'));
    let t = &m["traces"][1];
    assert_eq!((t["consumerGroup"].clone(), t["eventType"].clone()), (json!("__QUEUE_MODE__"), json!("info")), "the defaults");
    assert_eq!(t["traceNames"], json!(["order-1", "customer-9"]));
    let (_, none) = b.get(&format!("/api/v1/traces/{pid}/not-a-traced-message")).await;
    assert_eq!((none["count"].clone(), none["traces"].clone()), (json!(0), json!([])));

    // By name: newest first, with the total, paged.
    let (status, by) = b.get("/api/v1/traces/by-name/customer-9").await;
    assert_eq!(status, 200, "{by}");
    assert_eq!(by["total"], 2);
    let data: Vec<Value> = by["traces"].as_array().unwrap().iter().map(|t| t["data"].clone()).collect();
    assert_eq!(data, [json!("declined"), json!({"stage": "charged"})]);
    assert_eq!((by["traces"][0]["queue"].clone(), by["traces"][0]["partition"].clone()), (json!("orders"), json!("p")));
    let (_, page) = b.get("/api/v1/traces/by-name/customer-9?limit=1&offset=1").await;
    assert_eq!((page["total"].clone(), page["traces"].as_array().unwrap().len()), (json!(2), 1));
    assert_eq!(page["traces"][0]["data"], json!({"stage": "charged"}));
    let (_, future) = b.get("/api/v1/traces/by-name/customer-9?from=2999-01-01T00:00:00Z").await;
    assert_eq!((future["total"].clone(), future["traces"].clone()), (json!(0), json!([])));

    // The name list: counts of traces and of distinct messages.
    let (status, names) = b.get("/api/v1/traces/names").await;
    assert_eq!(status, 200, "{names}");
    assert_eq!(names["total"], 2);
    let by_name = |n: &str| names["names"].as_array().unwrap().iter().find(|x| x["name"] == n).cloned().unwrap();
    assert_eq!((by_name("order-1")["traceCount"].clone(), by_name("order-1")["messageCount"].clone()), (json!(2), json!(1)));
    assert_eq!((by_name("customer-9")["traceCount"].clone(), by_name("customer-9")["messageCount"].clone()), (json!(2), json!(2)));
    let (_, found) = b.get("/api/v1/traces/names?search=ORDER").await;
    let found: Vec<&str> = found["names"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(found, ["order-1"], "search is a case-insensitive substring");
    let (_, literal) = b.get("/api/v1/traces/names?search=%25").await;
    assert_eq!(literal["total"], 0, "% in a search is a character, not a wildcard");
}

#[tokio::test]
async fn bad_trace_bodies_are_400_naming_the_field_and_unknown_partitions_404() {
    let b = Broker::start().await;
    let (pid, txns) = consumed(&b, "q", 1).await;
    let long = "n".repeat(257);
    for (body, error) in [
        (json!({"partitionId": pid, "data": 1}), "transactionId: required, a non-empty string"),
        (json!({"transactionId": txns[0], "data": 1}), "partitionId: required"),
        (json!({"transactionId": txns[0], "partitionId": "x1", "data": 1}), "partitionId: must be a partition id"),
        (json!({"transactionId": txns[0], "partitionId": pid}), "data: required (any JSON value)"),
        (json!({"transactionId": txns[0], "partitionId": pid, "data": 1, "traceNames": [long]}), "traceNames[0]: longer than 256 bytes"),
        (json!({"transactionId": txns[0], "partitionId": pid, "data": 1, "traceNames": "a", "eventType": {}}), "eventType: must be a string"),
    ] {
        let (status, r) = trace(&b, body).await;
        assert_eq!(status, 400, "{r}");
        assert!(r["error"].as_str().unwrap().starts_with(error), "{r}");
    }
    let r = b.http.post(format!("{}/api/v1/traces", b.url)).header("content-type", "application/json").body("{not json").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let (status, r) = trace(&b, json!({"transactionId": "t", "partitionId": "999999", "data": 1})).await;
    assert_eq!((status, r["error"].as_str().unwrap()), (404, "partition 999999 not found"));
    assert_eq!(trace_count(&b).await, 0, "nothing was stored");
    assert_eq!(b.get("/api/v1/traces/999999/t").await.0, 404);
    assert_eq!(b.get("/api/v1/traces/abc/t").await.0, 404);
    assert_eq!(b.get("/api/v1/traces/names?limit=0").await.0, 400);
    assert_eq!(b.get("/api/v1/traces/by-name/x?from=soon").await.0, 400);
}

#[tokio::test]
async fn a_storm_of_concurrent_traces_is_stored_exactly_once_each() {
    let b = Broker::start().await;
    let (pid, txns) = consumed(&b, "storm", 50).await;
    let mut tasks = Vec::new();
    for round in 0..8 {
        for t in &txns {
            let (http, url, pid, t) = (b.http.clone(), b.url.clone(), pid.clone(), t.clone());
            tasks.push(tokio::spawn(async move {
                let r = http
                    .post(format!("{url}/api/v1/traces"))
                    .json(&json!({"transactionId": t, "partitionId": pid, "traceNames": [format!("round-{round}")], "data": round}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200);
                r.json::<Value>().await.unwrap()["traceId"].as_str().unwrap().to_string()
            }));
        }
    }
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        assert!(ids.insert(t.await.unwrap()), "every answer has its own traceId");
    }
    assert_eq!(trace_count(&b).await, 400);
    let (_, names) = b.get("/api/v1/traces/names").await;
    assert_eq!(names["total"], 8);
    for n in names["names"].as_array().unwrap() {
        assert_eq!((n["traceCount"].clone(), n["messageCount"].clone()), (json!(50), json!(50)), "{n}");
    }
}

#[tokio::test]
async fn traces_leave_with_their_queue_their_retained_messages_and_their_age() {
    let b = Broker::start_with(&[("RETENTION_INTERVAL", "200"), ("TRACES_RETENTION_DAYS", "2")]).await;
    // Queue deletion takes the queue's traces and leaves others alone.
    let (gone_pid, gone) = consumed(&b, "doomed", 2).await;
    let (kept_pid, kept) = consumed(&b, "kept", 1).await;
    for (pid, t) in [(&gone_pid, &gone[0]), (&gone_pid, &gone[1]), (&kept_pid, &kept[0])] {
        assert_eq!(trace(&b, json!({"transactionId": t, "partitionId": pid, "traceNames": ["x"], "data": 1})).await.0, 200);
    }
    let r = b.http.delete(format!("{}/api/v1/resources/queues/doomed", b.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(trace_count(&b).await, 1);
    let (_, x) = b.get("/api/v1/traces/by-name/x").await;
    assert_eq!((x["total"].clone(), x["traces"][0]["queue"].clone()), (json!(1), json!("kept")), "the name rows went too");

    // Age: a trace older than TRACES_RETENTION_DAYS goes; a younger one stays.
    let sql = b.sql().await;
    sql.execute("UPDATE queen.traces SET created_at = now() - interval '3 days'", &[]).await.unwrap();
    let (fresh_pid, fresh) = consumed(&b, "fresh", 1).await;
    assert_eq!(trace(&b, json!({"transactionId": fresh[0], "partitionId": fresh_pid, "data": "new"})).await.0, 200);
    eventually("the sweeper removes the three-day-old trace", Duration::from_secs(10), || async {
        trace_count(&b).await == 1
    })
    .await;
    let left: String = sql.query_one("SELECT transaction_id FROM queen.traces", &[]).await.unwrap().get(0);
    assert_eq!(left, fresh[0]);

    // Retention: when a message's segment goes, its traces go with it.
    let (status, _) = b.post("/api/v1/configure", json!({"queue": "brief", "options": {"retentionEnabled": true, "retentionSeconds": 1}})).await;
    assert_eq!(status, 200);
    let (pid, txns) = consumed(&b, "brief", 2).await;
    assert_eq!(trace(&b, json!({"transactionId": txns[0], "partitionId": pid, "data": 1})).await.0, 200);
    let pid_n: i64 = pid.parse().unwrap();
    let count_in = || async {
        sql.query_one("SELECT count(*) FROM queen.traces WHERE partition_id = $1", &[&pid_n]).await.unwrap().get::<_, i64>(0)
    };
    assert_eq!(count_in().await, 1);
    eventually("retention removes the segment and its message's trace", Duration::from_secs(15), || async {
        count_in().await == 0
    })
    .await;
    assert_eq!(trace_count(&b).await, 1, "other queues' traces stay");
}

#[tokio::test]
async fn every_trace_answered_before_a_kill_is_stored() {
    let mut b = Broker::start().await;
    let (pid, txns) = consumed(&b, "crash", 20).await;
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    for i in 0..2000 {
        let (http, url, pid, t, answered) = (b.http.clone(), b.url.clone(), pid.clone(), txns[i % 20].clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            let r = http.post(format!("{url}/api/v1/traces")).json(&json!({"transactionId": t, "partitionId": pid, "traceNames": ["crash", format!("m{}", i % 20)], "data": i})).send().await;
            if let Ok(r) = r {
                if r.status().as_u16() == 200 {
                    if let Ok(v) = r.json::<Value>().await {
                        answered.lock().unwrap().push(v["traceId"].as_str().unwrap().to_string());
                    }
                }
            }
        }));
    }
    eventually("some traces are answered", Duration::from_secs(20), || {
        let answered = answered.clone();
        async move { answered.lock().unwrap().len() >= 200 }
    })
    .await;
    b.kill();
    for t in tasks {
        t.await.unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    let stored: std::collections::HashSet<String> = b
        .sql()
        .await
        .query("SELECT trace_id::text FROM queen.traces", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lost: Vec<&String> = answered.iter().filter(|t| !stored.contains(*t)).collect();
    assert!(lost.is_empty(), "{} of {} answered traces lost", lost.len(), answered.len());
    // Whatever the kill interrupted is either whole or absent: each trace's
    // name rows match its names.
    let torn: i64 = b
        .sql()
        .await
        .query_one(
            "SELECT count(*) FROM queen.traces t WHERE cardinality(t.names) <> (SELECT count(*) FROM queen.trace_names n WHERE n.trace = t.id)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(torn, 0);
}
