//! Operating the broker: configure, queue resources, consumer groups and
//! seek (API.md §2.6, §2.7, issue 5).

mod common;

use std::time::Duration;

use common::Broker;
use serde_json::{json, Value};

fn client_defaults() -> Value {
    json!({"leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0,
           "maxSize": 0, "retentionSeconds": 0, "completedRetentionSeconds": 0, "encryptionEnabled": false})
}

#[tokio::test]
async fn configure_echoes_all_21_options_with_their_defaults() {
    let b = Broker::start().await;
    let (status, body) =
        b.post("/api/v1/configure", json!({"queue": "cfg.orders", "namespace": null, "task": null, "options": client_defaults()})).await;
    assert_eq!(status, 200);
    assert_eq!(body["configured"], true);
    assert_eq!(body["queue"], "cfg.orders");
    assert_eq!(body["partitionId"], Value::Null);
    assert_eq!(body["storage"], "segments");
    assert!(body["queueId"].as_str().unwrap().parse::<i64>().is_ok());
    assert_eq!(
        body["options"],
        json!({"leaseTime": 300, "retryLimit": 3, "retryDelay": 1000, "priority": 0, "maxSize": 0, "ttl": 3600,
               "deadLetterQueue": true, "dlqAfterMaxRetries": true, "delayedProcessing": 0, "windowBuffer": 0,
               "retentionSeconds": 0, "completedRetentionSeconds": 0, "retentionEnabled": false,
               "encryptionEnabled": false, "maxWaitTimeSeconds": 0, "minPopWaitTime": 0, "dedupWindowSeconds": 3600,
               "retentionSinkHold": "", "retentionSinkHoldMaxSeconds": 604800, "namespace": "", "task": ""})
    );
}

#[tokio::test]
async fn merge_keeps_what_is_not_sent_null_restores_and_replace_resets() {
    let b = Broker::start().await;
    let opt = |body: &Value, k: &str| body["options"][k].clone();
    b.post("/api/v1/configure", json!({"queue": "m", "options": {"retryLimit": 7, "windowBuffer": 2}})).await;
    let (_, body) = b.post("/api/v1/configure", json!({"queue": "m", "options": {"leaseTime": 30}})).await;
    assert_eq!((opt(&body, "retryLimit"), opt(&body, "leaseTime"), opt(&body, "windowBuffer")), (json!(7), json!(30), json!(2)));
    let (_, body) = b.post("/api/v1/configure", json!({"queue": "m", "options": {"retryLimit": null}})).await;
    assert_eq!((opt(&body, "retryLimit"), opt(&body, "leaseTime")), (json!(3), json!(30)), "null restores one default");
    let (_, body) = b.post("/api/v1/configure", json!({"queue": "m", "mode": "replace", "options": {"windowBuffer": 1}})).await;
    assert_eq!((opt(&body, "leaseTime"), opt(&body, "windowBuffer")), (json!(300), json!(1)), "replace resets the rest");
    let (_, body) = b.post("/api/v1/configure", json!({"queue": "m", "namespace": "billing", "options": {"minPopWaitTime": 999999}})).await;
    assert_eq!((body["namespace"].clone(), opt(&body, "minPopWaitTime")), (json!("billing"), json!(60000)), "clamped, not refused");
}

#[tokio::test]
async fn option_refusals_name_the_option() {
    let b = Broker::start().await;
    let (status, body) = b.post("/api/v1/configure", json!({"queue": "r", "options": {"leaseTime": "long"}})).await;
    assert_eq!(status, 400);
    assert_eq!(body["invalid"], "leaseTime");
    assert!(body["error"].as_str().unwrap().starts_with("leaseTime"));
    let (status, body) = b.post("/api/v1/configure", json!({"queue": "r", "options": {"retentionSinkHold": "no spaces"}})).await;
    assert_eq!((status, body["invalid"].as_str()), (400, Some("retentionSinkHold")));
    let (status, body) = b.post("/api/v1/configure", json!({"options": {}})).await;
    assert_eq!((status, body), (400, json!({"error": "queue is required"})));
    let (status, body) = b.post("/api/v1/configure", json!({"queue": "r", "mode": "overwrite"})).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"], "mode must be \"merge\" or \"replace\", got \"overwrite\"");
}

#[tokio::test]
async fn a_configured_lease_applies_to_the_next_pop() {
    let b = Broker::start().await;
    b.push_to("lease", "p", &[json!(1)]).await;
    b.post("/api/v1/configure", json!({"queue": "lease", "options": {"leaseTime": 7}})).await;
    b.pop("/api/v1/pop/queue/lease").await;
    let secs: f64 = b
        .sql()
        .await
        .query_one("SELECT extract(epoch FROM lease_expires_at - lease_acquired_at)::float8 FROM queen.consumers", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(secs, 7.0);
}

#[tokio::test]
async fn queue_resources_answer_their_shapes() {
    let b = Broker::start().await;
    b.push_to("res.one", "p1", &[json!(1), json!(2), json!(3), json!(4), json!(5)]).await;
    b.push_to("res.one", "p2", &[json!(6), json!(7), json!(8)]).await;
    b.push_to("res.two", "p", &[json!(9)]).await;
    b.pop("/api/v1/pop/queue/res.one/partition/p1?batch=2&autoAck=true&consumerGroup=g").await;

    let (status, q) = b.get("/api/v1/resources/queues/res.one").await;
    assert_eq!(status, 200);
    assert_eq!((q["namespace"].as_str(), q["task"].as_str(), q["partitions"].as_i64(), q["messages"].as_i64()), (Some("res"), Some("one"), Some(2), Some(8)));
    assert_eq!(q["options"]["leaseTime"], 60, "an implicit queue leases for 60 s");
    assert_eq!(q["options"].as_object().unwrap().len(), 21);
    assert_eq!(b.get("/api/v1/resources/queues/nope").await, (404, json!({"error": "Queue not found"})));

    let (_, list) = b.get("/api/v1/resources/queues?search=two").await;
    assert_eq!(list["total"], 1);
    assert_eq!(list["queues"][0]["name"], "res.two");

    let (_, d) = b.get("/api/v1/resources/queues/res.one/depth?group=g").await;
    assert_eq!((d["pending"].as_i64(), d["partitionsPending"].as_i64()), (Some(6), Some(2)));
    assert_eq!(d["partitions"], json!([{"partition": "p1", "pending": 3}, {"partition": "p2", "pending": 3}]));
    assert_eq!(b.get("/api/v1/resources/queues/res.one/depth").await.1["pending"], 8, "queue mode has read nothing");

    let (_, o) = b.get("/api/v1/resources/overview").await;
    assert_eq!((o["queues"].as_i64(), o["partitions"].as_i64(), o["messages"]["total"].as_i64()), (Some(2), Some(3), Some(9)));
    let (_, ns) = b.get("/api/v1/resources/namespaces").await;
    assert_eq!(ns["namespaces"][0]["namespace"], "res");
    assert_eq!(ns["namespaces"][0]["queues"], 2);
    let (_, t) = b.get("/api/v1/resources/tasks").await;
    assert_eq!(t["tasks"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn deleting_a_queue_removes_everything_and_is_idempotent() {
    let b = Broker::start().await;
    b.push_to("gone", "p", &[json!(1), json!(2)]).await;
    b.pop("/api/v1/pop/queue/gone?consumerGroup=g&batch=1").await;
    let (status, body) = b.http.delete(format!("{}/api/v1/resources/queues/gone", b.url)).send().await.map(|r| (r.status().as_u16(), r)).unwrap();
    assert_eq!(status, 200);
    let body: Value = body.json().await.unwrap();
    assert_eq!((body["deleted"].as_bool(), body["existed"].as_bool()), (Some(true), Some(true)));
    let sql = b.sql().await;
    for table in ["queues", "partitions", "segments", "txn_index", "consumers", "subscriptions"] {
        let n: i64 = sql.query_one(&format!("SELECT count(*) FROM queen.{table}"), &[]).await.unwrap().get(0);
        assert_eq!(n, 0, "{table} emptied");
    }
    let r: Value = b.http.delete(format!("{}/api/v1/resources/queues/gone", b.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(r, json!({"deleted": false, "existed": false, "queue": "gone", "message": "Queue not found, nothing was deleted"}));
    // The queue can be used again from scratch.
    b.push_to("gone", "p", &[json!("again")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/gone?consumerGroup=g").await.data(), [json!("again")]);
}

#[tokio::test]
async fn consumer_groups_report_lag() {
    let b = Broker::start().await;
    b.push_to("lag", "p", &[json!(1), json!(2), json!(3)]).await;
    b.pop("/api/v1/pop/queue/lag?consumerGroup=slow&batch=1&autoAck=true").await;
    b.pop("/api/v1/pop/queue/lag?consumerGroup=fast&batch=10&autoAck=true").await;
    let (_, list) = b.get("/api/v1/consumer-groups").await;
    let find = |name: &str| list.as_array().unwrap().iter().find(|g| g["name"] == name).unwrap().clone();
    let slow = find("slow");
    assert_eq!((slow["totalLag"].as_i64(), slow["queues"].clone()), (Some(2), json!(["lag"])));
    assert_eq!(find("fast")["totalLag"], 0);
    assert_eq!(find("fast")["state"], "Stable");
    let (_, g) = b.get("/api/v1/consumer-groups/slow").await;
    let p = &g["lag"]["partitions"][0];
    assert_eq!((p["partition"].as_str(), p["offsetLag"].as_i64(), p["totalConsumed"].as_i64(), p["leaseActive"].as_bool()), (Some("p"), Some(2), Some(1), Some(false)));
    let (_, lagging) = b.get("/api/v1/consumer-groups/lagging?minLagSeconds=0").await;
    let rows = lagging.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0]["consumer_group"].as_str(), rows[0]["offset_lag"].as_i64()), (Some("slow"), Some(2)));
    assert_eq!(b.get("/api/v1/consumer-groups/lagging").await.1, json!([]), "nothing is an hour behind");
}

#[tokio::test]
async fn seek_to_the_end_or_to_a_timestamp_then_pop_returns_exactly_what_follows() {
    let b = Broker::start().await;
    b.push_to("seek", "p", &[json!("old")]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cut = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    tokio::time::sleep(Duration::from_millis(50)).await;
    b.push_to("seek", "p", &[json!("new")]).await;
    // Leased by the group, then moved: the lease is cleared with the cursor.
    assert_eq!(b.pop("/api/v1/pop/queue/seek?consumerGroup=g&batch=10").await.messages().len(), 2);
    let (status, body) = b.post("/api/v1/consumer-groups/g/queues/seek/seek", json!({"timestamp": cut})).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({"success": true, "consumerGroup": "g", "queueName": "seek", "partitionsUpdated": 1}));
    assert_eq!(b.pop("/api/v1/pop/queue/seek?consumerGroup=g&batch=10").await.data(), [json!("new")]);
    let (status, _) = b.post("/api/v1/consumer-groups/g/queues/seek/seek", json!({"toEnd": true})).await;
    assert_eq!(status, 200);
    assert_eq!(b.pop("/api/v1/pop/queue/seek?consumerGroup=g").await.status, 204);
    b.push_to("seek", "p", &[json!("after")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/seek?consumerGroup=g").await.data(), [json!("after")]);
    for body in [json!({}), json!({"toEnd": false}), json!({"timestamp": "whenever"})] {
        let (status, answer) = b.post("/api/v1/consumer-groups/g/queues/seek/seek", body).await;
        assert_eq!((status, answer), (400, json!({"error": "Must specify toEnd=true or a timestamp"})));
    }
    let (status, _) = b.post_raw("/api/v1/consumer-groups/g/queues/seek/seek", "application/json", vec![]).await;
    assert_eq!(status, 400, "an empty body too");
    assert_eq!(b.post("/api/v1/consumer-groups/g/queues/nope/seek", json!({"toEnd": true})).await.0, 404);
    // The per-partition seek: an empty body means the end.
    b.push_to("seek", "p", &[json!("skipped")]).await;
    let (status, body) = b.post_raw("/api/v1/consumer-groups/g/queues/seek/partitions/p/seek", "application/json", vec![]).await;
    assert_eq!((status, body["partitionsUpdated"].as_i64()), (200, Some(1)));
    assert_eq!(b.pop("/api/v1/pop/queue/seek?consumerGroup=g").await.status, 204);
}

#[tokio::test]
async fn deleting_a_group_makes_it_consume_again_and_subscription_needs_a_timestamp() {
    let b = Broker::start().await;
    b.push_to("dg", "p", &[json!(1)]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/dg?consumerGroup=g&autoAck=true").await.data(), [json!(1)]);
    assert_eq!(b.pop("/api/v1/pop/queue/dg?consumerGroup=g&autoAck=true").await.status, 204);
    let r: Value = b.http.delete(format!("{}/api/v1/consumer-groups/g", b.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(r, json!({"success": true, "consumerGroup": "g", "deletedPartitions": 1, "metadataDeleted": true}));
    assert_eq!(b.pop("/api/v1/pop/queue/dg?consumerGroup=g&autoAck=true").await.data(), [json!(1)], "re-consumed from scratch");
    let r: Value = b
        .http
        .delete(format!("{}/api/v1/consumer-groups/g/queues/dg?deleteMetadata=false", b.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["metadataDeleted"], false);
    let subs: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.subscriptions", &[]).await.unwrap().get(0);
    assert_eq!(subs, 1, "the subscription record was kept");
    assert_eq!(b.post("/api/v1/consumer-groups/g/subscription", json!({})).await, (400, json!({"error": "subscriptionTimestamp is required"})));
    let (status, body) = b.post("/api/v1/consumer-groups/g/subscription", json!({"subscriptionTimestamp": "2030-01-01T00:00:00Z"})).await;
    assert_eq!((status, body["queuesUpdated"].as_i64()), (200, Some(1)));
    let (status, body) = b.post_raw("/api/v1/stats/refresh", "application/json", vec![]).await;
    assert_eq!((status, body["success"].as_bool()), (200, Some(true)));
}

#[tokio::test]
async fn the_openapi_document_and_the_dashboard_are_served_without_a_token() {
    let b = Broker::start_with(&[("JWT_ENABLED", "true"), ("JWT_SECRET", "s")]).await;
    let (status, doc) = b.get("/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/api/v1/push"]["post"]["security"].is_array(), "the push needs a token");
    assert!(doc["paths"]["/health"]["get"]["security"].is_null(), "health does not");
    let page = b.http.get(format!("{}/", b.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(page.text().await.unwrap().contains("/dashboard/app.js"));
    let script = b.http.get(format!("{}/dashboard/app.js", b.url)).send().await.unwrap();
    assert_eq!(script.status(), 200);
    assert_eq!(b.http.get(format!("{}/dashboard/nope.js", b.url)).send().await.unwrap().status(), 404);
    // The API behind them still asks for one.
    assert_eq!(b.get("/api/v1/status").await.0, 401);
}
