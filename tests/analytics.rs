//! The analytics family (issue 28 §3): every route on real traffic, with its
//! numbers checked against what was pushed, consumed, leased and
//! dead-lettered, across two broker processes on one database.

mod common;

use std::time::Duration;

use common::{cluster, eventually, Broker};
use serde_json::{json, Value};

/// A broker named `name` on `db` that samples every 200 ms.
async fn named(db: &str, name: &str) -> Broker {
    Broker::spawn(
        db.to_string(),
        vec![
            ("QUEEN_DATABASE_URL".into(), cluster().url(db)),
            ("QUEEN_SERVER_ID".into(), name.into()),
            ("METRICS_FLUSH_MS".into(), "200".into()),
        ],
    )
    .await
}

/// Pops one batch from a partition for a group; (leaseId, messages).
async fn pop(b: &Broker, queue: &str, partition: &str, group: &str, n: usize) -> (String, Vec<Value>) {
    let r = b.pop(&format!("/api/v1/pop/queue/{queue}/partition/{partition}?consumerGroup={group}&batch={n}&wait=false")).await;
    let body = r.body.expect("messages");
    (body["leaseId"].as_str().unwrap().to_string(), body["messages"].as_array().unwrap().clone())
}

async fn ack_all(b: &Broker, group: &str, lease: &str, messages: &[Value], status: &str, error: Option<&str>) {
    for m in messages {
        let (status_code, r) = b
            .post("/api/v1/ack", json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": status,
                                        "error": error, "consumerGroup": group, "leaseId": lease}))
            .await;
        assert_eq!(status_code, 200, "{r}");
    }
}

fn find<'a>(rows: &'a Value, key: &str, value: &str) -> &'a Value {
    rows.as_array().unwrap().iter().find(|r| r[key] == value).unwrap_or_else(|| panic!("no {key}={value} in {rows}"))
}

#[tokio::test]
async fn the_analytics_routes_count_what_two_brokers_did() {
    let db = cluster().create_db().await;
    let a = named(&db, "broker-a").await;
    let b = named(&db, "broker-b").await;
    // Through broker a: queue la, p1 five messages and p2 three. Through
    // broker b: queue lb, two messages.
    a.push_to("la", "p1", &(0..5).map(|i| json!({"i": i})).collect::<Vec<_>>()).await;
    a.push_to("la", "p2", &[json!(1), json!(2), json!(3)]).await;
    b.push_to("lb", "x", &[json!("x"), json!("y")]).await;
    // Group g1 takes three of p1 and acks them, and leases two of p2.
    let (lease, got) = pop(&a, "la", "p1", "g1", 3).await;
    ack_all(&a, "g1", &lease, &got, "completed", None).await;
    let (_, leased) = pop(&a, "la", "p2", "g1", 2).await;
    assert_eq!(leased.len(), 2);
    // Group dl dead-letters the rest of p1: two failures of one kind and
    // one of another.
    let (lease, rest) = pop(&a, "la", "p1", "dl", 1).await;
    ack_all(&a, "dl", &lease, &rest[0..1], "dlq", Some("timeout after 30 ms on order 123")).await;
    let (lease, rest) = pop(&a, "la", "p1", "dl", 1).await;
    ack_all(&a, "dl", &lease, &rest[0..1], "dlq", Some("timeout after 45 ms on order 9")).await;
    let (lease, rest) = pop(&a, "la", "p1", "dl", 1).await;
    ack_all(&a, "dl", &lease, &rest[0..1], "dlq", Some("bad payload")).await;

    // queue-ops: the samples of both brokers, summed per queue (a dead
    // letter is an ack too).
    eventually("queue-ops counts every push, pop and ack", Duration::from_secs(10), || async {
        let (_, ops) = a.get("/api/v1/analytics/queue-ops").await;
        let Some(la) = ops["queues"].as_array().and_then(|q| q.iter().find(|x| x["queue"] == "la")) else { return false };
        let Some(lb) = ops["queues"].as_array().and_then(|q| q.iter().find(|x| x["queue"] == "lb")) else { return false };
        la["totals"]["pushed"] == 8 && la["totals"]["popped"] == 8 && la["totals"]["acked"] == 6 && lb["totals"]["pushed"] == 2
    })
    .await;
    let (status, ops) = a.get("/api/v1/analytics/queue-ops?interval=hour").await;
    assert_eq!(status, 200, "{ops}");
    assert_eq!((ops["interval"].clone(), ops["total"].clone()), (json!("hour"), json!(2)));
    let la = find(&ops["queues"], "queue", "la");
    assert_eq!(la["totals"]["deadLettered"], 3);
    let pushed: i64 = la["series"].as_array().unwrap().iter().map(|p| p["pushed"].as_i64().unwrap()).sum();
    let dead: i64 = la["series"].as_array().unwrap().iter().map(|p| p["deadLettered"].as_i64().unwrap()).sum();
    assert_eq!((pushed, dead), (8, 3), "the series adds up to the totals");
    assert_eq!(ops["queues"][0]["queue"], "la", "busiest first");
    let (_, only_b) = a.get("/api/v1/analytics/queue-ops?queue=lb").await;
    assert_eq!((only_b["total"].clone(), only_b["queues"][0]["queue"].clone()), (json!(1), json!("lb")));

    // worker-metrics: each broker's own traffic, and its system sample.
    let (status, w) = a.get("/api/v1/analytics/worker-metrics").await;
    assert_eq!(status, 200, "{w}");
    let wa = find(&w["workers"], "broker", "broker-a");
    let wb = find(&w["workers"], "broker", "broker-b");
    assert_eq!((wa["traffic"]["pushed"].clone(), wa["traffic"]["acked"].clone()), (json!(8), json!(6)));
    assert_eq!((wb["traffic"]["pushed"].clone(), wb["traffic"]["popped"].clone()), (json!(2), json!(0)));
    assert!(wa["system"]["rssBytes"].as_i64().unwrap() > 1_000_000, "{wa}");
    assert!(w["series"].as_array().unwrap().iter().any(|p| p["broker"] == "broker-b" && p["pushed"] == 2));

    // system-metrics: both brokers sampled; the series sum them.
    let (status, sys) = a.get("/api/v1/analytics/system-metrics").await;
    assert_eq!(status, 200, "{sys}");
    let names: Vec<&str> = sys["brokers"].as_array().unwrap().iter().map(|b| b["broker"].as_str().unwrap()).collect();
    assert_eq!(names, ["broker-a", "broker-b"]);
    let last = |name: &str| sys["series"][name].as_array().unwrap().last().unwrap()["value"].as_f64().unwrap();
    assert_eq!(last("brokers"), 2.0);
    assert!(last("rssBytes") > 2_000_000.0 && last("dbConnections") >= 1.0, "{sys}");
    for b in sys["brokers"].as_array().unwrap() {
        assert!(b["uptimeSeconds"].as_i64().unwrap() >= 0 && b["sampledAt"].as_str().unwrap().ends_with('Z'));
    }

    // queue-lag: g1 has 2 left on p1 and 3 on p2 (two of them leased).
    let (status, lag) = a.get("/api/v1/analytics/queue-lag?queue=la").await;
    assert_eq!(status, 200, "{lag}");
    let g1 = find(&lag["groups"], "consumerGroup", "g1");
    assert_eq!((g1["pendingMessages"].clone(), g1["partitions"].clone(), g1["partitionsBehind"].clone()), (json!(5), json!(2), json!(2)));
    assert_eq!(g1["activeLeases"], 1);
    assert!(g1["oldestPendingAt"].as_str().unwrap().ends_with('Z') && g1["lagSeconds"].as_i64().unwrap() >= 0);
    let dl = find(&lag["groups"], "consumerGroup", "dl");
    assert_eq!((dl["pendingMessages"].clone(), dl["partitions"].clone()), (json!(2), json!(1)),
               "dl read only p1 and committed three of it (a dead letter commits)");
    assert_eq!(lag["total"], 2);
    let (_, paged) = a.get("/api/v1/analytics/queue-lag?limit=1").await;
    assert_eq!((paged["total"].clone(), paged["groups"].as_array().unwrap().len()), (json!(2), 1));

    // workload: pending is what the slowest group has not committed.
    let (status, work) = a.get("/api/v1/analytics/workload").await;
    assert_eq!(status, 200, "{work}");
    let wla = find(&work["queues"], "queue", "la");
    assert_eq!((wla["pendingMessages"].clone(), wla["partitions"].clone(), wla["partitionsWithPending"].clone()), (json!(5), json!(2), json!(2)));
    assert_eq!((wla["inFlightMessages"].clone(), wla["activeLeases"].clone(), wla["groups"].clone()), (json!(2), json!(1), json!(2)));
    let wlb = find(&work["queues"], "queue", "lb");
    assert_eq!((wlb["pendingMessages"].clone(), wlb["groups"].clone()), (json!(2), json!(0)), "nobody read lb: its whole log");
    assert_eq!((work["totals"]["queues"].clone(), work["totals"]["pendingMessages"].clone()), (json!(2), json!(7)));
    assert!(wla["ackPerSecond"].as_f64().unwrap() > 0.0 && wla["drainSeconds"].as_i64().is_some());

    // dlq-signatures: ids and numbers masked, largest first.
    let (status, sigs) = a.get("/api/v1/analytics/dlq-signatures").await;
    assert_eq!(status, 200, "{sigs}");
    assert_eq!((sigs["total"].clone(), sigs["deadLetters"].clone()), (json!(2), json!(3)));
    let top = &sigs["signatures"][0];
    assert_eq!((top["signature"].clone(), top["count"].clone()), (json!("timeout after <n> ms on order <n>"), json!(2)));
    assert_eq!((top["queue"].clone(), top["consumerGroup"].clone()), (json!("la"), json!("dl")));
    assert_eq!(top["sample"]["error"], "timeout after 45 ms on order 9", "the newest of the kind");
    assert_eq!(sigs["signatures"][1]["signature"], "bad payload");
    let (_, later) = a.get("/api/v1/analytics/dlq-signatures?from=2999-01-01T00:00:00Z").await;
    assert_eq!(later["total"], 0);

    // retention: what each queue keeps, and when its oldest goes.
    assert_eq!(a.post("/api/v1/configure", json!({"queue": "lb", "options": {"retentionSeconds": 3600}})).await.0, 200);
    let (status, ret) = a.get("/api/v1/analytics/retention").await;
    assert_eq!(status, 200, "{ret}");
    let rla = find(&ret["queues"], "queue", "la");
    assert_eq!((rla["messages"].clone(), rla["partitions"].clone(), rla["segments"].clone()), (json!(8), json!(2), json!(2)));
    assert_eq!((rla["deadLetters"].clone(), rla["nextRemovalAt"].clone()), (json!(3), Value::Null));
    assert!(rla["storedBytes"].as_i64().unwrap() > 0);
    let rlb = find(&ret["queues"], "queue", "lb");
    assert_eq!(rlb["options"]["retentionSeconds"], 3600);
    let oldest = chrono::DateTime::parse_from_rfc3339(rlb["oldestMessageAt"].as_str().unwrap()).unwrap();
    let next = chrono::DateTime::parse_from_rfc3339(rlb["nextRemovalAt"].as_str().unwrap()).unwrap();
    assert_eq!((next - oldest).num_seconds(), 3600);

    // partition-liveness: every partition was written within the minute.
    let (status, live) = a.get("/api/v1/analytics/partition-liveness?queue=la").await;
    assert_eq!(status, 200, "{live}");
    let l = &live["queues"][0];
    assert_eq!((l["queue"].clone(), l["partitions"].clone(), l["writtenLastMinute"].clone(), l["idleOverADay"].clone()),
               (json!("la"), json!(2), json!(2), json!(0)));
    assert_eq!(live["partitionsTotal"], 2);
    let p1 = find(&live["partitions"], "name", "p1");
    assert_eq!((p1["messages"].clone(), p1["pendingMessages"].clone()), (json!(5), json!(2)));
    let p2 = find(&live["partitions"], "name", "p2");
    assert_eq!((p2["pendingMessages"].clone(), p2["activeLeases"].clone()), (json!(3), json!(1)));
    assert_eq!(live["partitions"][0]["name"], "p2", "most recently written first");

    // postgres-stats: this database, its tables.
    let (status, pg) = a.get("/api/v1/analytics/postgres-stats").await;
    assert_eq!(status, 200, "{pg}");
    assert_eq!(pg["database"]["name"], json!(db));
    assert_eq!(pg["database"]["inRecovery"], false);
    assert!(pg["connections"]["total"].as_i64().unwrap() >= 2, "two brokers are connected: {pg}");
    let segments = find(&pg["tables"], "name", "segments");
    assert!(segments["totalBytes"].as_i64().unwrap() > 0, "{segments}");
    assert!(segments["inserted"].is_i64() && segments["deadRows"].is_i64(), "counters flush lazily; they are numbers");
}

#[tokio::test]
async fn parked_long_polls_show_per_broker_and_bad_parameters_are_400() {
    let db = cluster().create_db().await;
    let a = named(&db, "replica-a").await;
    let b = named(&db, "replica-b").await;
    // A database without queues answers empty tables, not errors.
    for path in ["/api/v1/analytics/queue-lag", "/api/v1/analytics/workload", "/api/v1/analytics/dlq-signatures",
                 "/api/v1/analytics/retention", "/api/v1/analytics/partition-liveness", "/api/v1/analytics/queue-ops"] {
        let (status, r) = a.get(path).await;
        assert_eq!(status, 200, "{path}: {r}");
        assert_eq!(r["total"], 0, "{path}: {r}");
    }
    // Two pops parked on b, none on a.
    let parked: Vec<_> = (0..2)
        .map(|_| {
            let (http, url) = (b.http.clone(), b.url.clone());
            tokio::spawn(async move { http.get(format!("{url}/api/v1/pop/queue/empty?wait=true&timeout=4000")).send().await.unwrap().status() })
        })
        .collect();
    eventually("b's sample shows its two parked pops", Duration::from_secs(3), || async {
        let (_, r) = a.get("/api/v1/analytics/queue-parked-replicas").await;
        r["brokers"].as_array().is_some_and(|bs| bs.iter().any(|x| x["broker"] == "replica-b" && x["parkedLongPolls"] == 2))
    })
    .await;
    let (status, r) = a.get("/api/v1/analytics/queue-parked-replicas").await;
    assert_eq!(status, 200);
    let me = find(&r["brokers"], "broker", "replica-a");
    assert_eq!((me["self"].clone(), me["parkedLongPolls"].clone()), (json!(true), json!(0)));
    assert_eq!(r["parkedLongPolls"], 2);
    for p in parked {
        assert_eq!(p.await.unwrap().as_u16(), 204);
    }

    for path in [
        "/api/v1/analytics/system-metrics?interval=week",
        "/api/v1/analytics/queue-ops?interval=fortnight",
        "/api/v1/analytics/queue-lag?limit=0",
        "/api/v1/analytics/workload?offset=-1",
        "/api/v1/analytics/retention?limit=5000",
        "/api/v1/analytics/dlq-signatures?from=yesterday",
        "/api/v1/analytics/partition-liveness?to=later",
        "/api/v1/analytics/worker-metrics?from=soon",
    ] {
        let (status, r) = a.get(path).await;
        assert_eq!(status, 400, "{path}: {r}");
        assert!(r["error"].as_str().unwrap().contains(':'), "names the parameter: {r}");
    }
}
