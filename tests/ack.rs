//! Acks as offset commits, lease extension, retries and the DLQ over HTTP
//! (API.md §2.3, §2.5, issue 4).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::Broker;
use serde_json::{json, Value};

/// Five messages t0..t4 in one partition, popped as one leased batch.
async fn leased_five(b: &Broker, query: &str) -> (String, String) {
    let items: Vec<Value> = (0..5).map(|i| json!({"queue": "q", "partition": "p", "payload": i, "transactionId": format!("t{i}")})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    let r = b.pop(&format!("/api/v1/pop/queue/q?batch=5{query}")).await;
    let body = r.body.expect("a batch");
    (body["leaseId"].as_str().unwrap().to_string(), body["partitionId"].as_str().unwrap().to_string())
}

/// The two ways an ack finds its message's offset.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Resolution {
    /// A default queue: the registry the pop filled (the segments around the
    /// cursor behind it: a push writes no index, `0019_dedup_in_segments.sql`).
    Registry,
    /// Neither: a queue without a dedup window keeps no index and a 0 MiB
    /// registry remembers nothing, so acks decode the segments around the
    /// cursor (`queen.ack_span_v1`).
    Span,
}

const RESOLUTIONS: [Resolution; 2] = [Resolution::Registry, Resolution::Span];

/// A broker whose queue `q` resolves acks the given way.
async fn broker_resolving(resolution: Resolution) -> Broker {
    match resolution {
        Resolution::Registry => Broker::start().await,
        Resolution::Span => {
            let b = Broker::start_with(&[("QUEEN_ACK_REGISTRY_MB", "0")]).await;
            let (status, _) = b.post("/api/v1/configure", json!({"queue": "q", "options": {"dedupWindowSeconds": 0}})).await;
            assert_eq!(status, 200);
            b
        }
    }
}

/// Entries in the transaction index, which pushes no longer write: 0
/// proves an ack resolved without it.
async fn index_entries(b: &Broker) -> i64 {
    b.sql().await.query_one("SELECT count(*) FROM queen.txn_index", &[]).await.unwrap().get(0)
}

const UNRESOLVABLE: &str =
    "unresolvable: transaction not in the ack window (hash purged or never pushed); if leased, the message redelivers";

fn outcome(r: &Value) -> (bool, Option<&str>) {
    (r["success"].as_bool().unwrap(), r["error"].as_str())
}

#[tokio::test]
async fn the_clamping_rules_table() {
    // (acks as (txn, status, lease: true = the batch's lease), committed after,
    //  lease still held, retry count, per-item success)
    type Case = (&'static str, Vec<(&'static str, &'static str, bool)>, i64, bool, i32, Vec<bool>);
    let cases: Vec<Case> = vec![
        ("all completed commits the batch and releases", vec![("t0", "completed", true), ("t1", "completed", true), ("t2", "completed", true), ("t3", "completed", true), ("t4", "completed", true)], 4, false, 0, vec![true; 5]),
        ("a prefix commits and keeps the lease", vec![("t0", "completed", true), ("t1", "completed", true)], 1, true, 0, vec![true, true]),
        ("a completed offset implicitly acks everything below", vec![("t3", "completed", true)], 3, true, 0, vec![true]),
        ("completed above a failed does not move the cursor", vec![("t0", "completed", true), ("t1", "failed", true), ("t2", "completed", true)], 0, false, 1, vec![true, true, false]),
        ("retry releases without charging the budget", vec![("t0", "retry", true)], -1, false, 0, vec![true]),
        ("the lowest signal is the head", vec![("t3", "failed", true), ("t0", "completed", true), ("t1", "retry", true)], 0, false, 0, vec![true, true, true]),
        ("a lease-less ack still advances the cursor", vec![("t2", "completed", false)], 2, true, 0, vec![true]),
        ("success is the normalized completed", vec![("t0", "success", true), ("t1", "ok", true), ("t2", "acked", true)], 2, true, 0, vec![true; 3]),
    ];
    for ((name, acks, committed, leased, retries, success), resolution) in
        cases.iter().flat_map(|c| RESOLUTIONS.map(|r| (c.clone(), r)))
    {
        let name = format!("{name} ({resolution:?})");
        let b = broker_resolving(resolution).await;
        let (lease, pid) = leased_five(&b, "").await;
        let items: Vec<(&str, &str, &str, Option<&str>)> =
            acks.iter().map(|(t, s, l)| (*t, pid.as_str(), *s, l.then_some(lease.as_str()))).collect();
        let results = b.ack_batch(None, &items).await;
        let got: Vec<bool> = results.iter().map(|r| r["success"].as_bool().unwrap()).collect();
        assert_eq!(got, success, "{name}: {results:?}");
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r["index"], i, "{name}");
            if r["success"] == true {
                assert_eq!(r["error"], Value::Null, "{name}: successful items carry error null");
            }
        }
        let (c, holder, rc) = b.cursor(&pid, "__QUEUE_MODE__").await;
        assert_eq!(c, committed, "{name}: committed");
        assert_eq!(holder.is_some(), leased, "{name}: lease held");
        assert_eq!(rc, retries, "{name}: retry count");
        assert_eq!(index_entries(&b).await, 0, "{name}");
    }
}

#[tokio::test]
async fn a_wrong_or_expired_lease_moves_nothing() {
    let b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "&leaseSeconds=1").await;
    let r = b.ack_batch(None, &[("t0", &pid, "completed", Some("not-the-lease")), ("t1", &pid, "completed", Some("not-the-lease"))]).await;
    for item in &r {
        assert_eq!(outcome(item), (false, Some("invalid or expired lease")));
    }
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await.0, -1);
    tokio::time::sleep(Duration::from_millis(1100)).await; // the lease length is the rule under test
    let r = b.ack_batch(None, &[("t0", &pid, "completed", Some(&lease))]).await;
    assert_eq!(outcome(&r[0]), (false, Some("invalid or expired lease")));
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await.0, -1, "the message redelivers");
}

#[tokio::test]
async fn acks_below_the_cursor_and_unknown_ids_are_reported_as_such() {
    for resolution in RESOLUTIONS {
        acks_below_the_cursor_and_unknown_ids_resolve(resolution).await;
    }
}

async fn acks_below_the_cursor_and_unknown_ids_resolve(resolution: Resolution) {
    let b = broker_resolving(resolution).await;
    let (lease, pid) = leased_five(&b, "").await;
    b.ack_batch(None, &[("t2", &pid, "completed", Some(&lease))]).await;
    let r = b
        .ack_batch(None, &[("t1", &pid, "completed", Some(&lease)), ("t1", &pid, "failed", Some(&lease)), ("never-pushed", &pid, "completed", Some(&lease))])
        .await;
    assert_eq!(outcome(&r[0]), (true, None));
    assert_eq!(r[0]["noop"], true);
    assert_eq!(outcome(&r[1]), (false, Some("already committed: the cursor moved past this message before this ack")));
    assert_eq!(
        outcome(&r[2]),
        (false, Some(UNRESOLVABLE))
    );
    let r = b.ack_batch(None, &[("t0", "not-a-partition", "completed", None)]).await;
    assert_eq!(r[0]["success"], false);
}

#[tokio::test]
async fn the_single_route_answers_an_array_and_refuses_missing_fields() {
    let b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "&consumerGroup=g").await;
    let (status, body) = b
        .post("/api/v1/ack", json!({"transactionId": "t4", "partitionId": pid, "status": "completed", "error": null, "consumerGroup": "g", "leaseId": lease}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body, json!([{"index": 0, "transactionId": "t4", "success": true, "error": null, "leaseReleased": true, "dlq": false, "noop": false}]));
    assert_eq!(b.cursor(&pid, "g").await, (4, None, 0));
    for (body, field) in [
        (json!({"partitionId": pid}), "transactionId"),
        (json!({"transactionId": 5, "partitionId": pid}), "transactionId"),
        (json!({"transactionId": "t0"}), "partitionId"),
        (json!({"transactionId": "t0", "partitionId": 12}), "partitionId"),
    ] {
        let (status, answer) = b.post("/api/v1/ack", body).await;
        assert_eq!(status, 400);
        assert!(answer["error"].as_str().unwrap().starts_with(field), "{answer}");
    }
    let (status, answer) = b.post("/api/v1/ack/batch", json!({"consumerGroup": null})).await;
    assert_eq!((status, answer["error"].as_str()), (400, Some("acknowledgments: required, an array")));
}

#[tokio::test]
async fn a_malformed_item_of_a_batch_is_refused_alone_and_the_rest_commit() {
    let b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "&consumerGroup=g").await;
    // Sent as text: the escaped id must read as "t1", the status `true` as completed.
    let body = format!(
        r#"{{"consumerGroup": "g", "acknowledgments": [
            {{"transactionId": "t0", "partitionId": "{pid}", "status": "completed", "leaseId": "{lease}", "extra": [1, {{"x": null}}]}},
            42,
            {{"transactionId": 7, "partitionId": "{pid}"}},
            {{"transactionId": "t\u0031", "partitionId": "{pid}", "status": true, "error": null, "leaseId": "{lease}"}},
            {{"transactionId": "t2", "partitionId": {{"not": "a string"}}}},
            {{"transactionId": "", "partitionId": "{pid}"}},
            {{"transactionId": "t3", "transactionId": "t4", "partitionId": "{pid}", "leaseId": "{lease}"}}
        ]}}"#
    );
    let (status, r) = b.post_raw("/api/v1/ack/batch", "application/json", body.into_bytes()).await;
    assert_eq!(status, 200);
    let answers: Vec<(i64, Value, bool, Option<&str>)> = r
        .as_array()
        .expect("an array")
        .iter()
        .map(|a| (a["index"].as_i64().unwrap(), a["transactionId"].clone(), a["success"].as_bool().unwrap(), a["error"].as_str()))
        .collect();
    assert_eq!(
        answers,
        [
            (0, json!("t0"), true, None),
            (1, Value::Null, false, Some("must be an object")),
            (2, json!(7), false, Some("transactionId: must be a string")),
            (3, json!("t1"), true, None),
            (4, json!("t2"), false, Some("partitionId: must be a string")),
            (5, json!(""), false, Some("transactionId: required, a non-empty string")),
            (6, json!("t4"), false, Some("duplicate field `transactionId`")),
        ]
    );
    assert_eq!(b.cursor(&pid, "g").await.0, 1, "t0 and t1 committed, the lease still held for t2..t4");
    // An array where an item belongs is refused like any non-object.
    let body = format!(r#"{{"acknowledgments": [["t2", "{pid}"]]}}"#);
    let (status, r) = b.post_raw("/api/v1/ack/batch", "application/json", body.into_bytes()).await;
    assert_eq!((status, r[0]["error"].as_str()), (200, Some("must be an object")));
    let (status, answer) = b.post_raw("/api/v1/ack/batch", "application/json", b"[1, 2]".to_vec()).await;
    assert_eq!((status, answer["error"].as_str()), (400, Some("acknowledgments: required, an array")));
    let (status, answer) = b.post_raw("/api/v1/ack/batch", "application/json", br#"{"acknowledgments": {"a": 1}}"#.to_vec()).await;
    assert_eq!((status, answer["error"].as_str()), (400, Some("acknowledgments: required, an array")));
    let (status, answer) = b.post_raw("/api/v1/ack/batch", "application/json", b"{\"acknowledgments\": [".to_vec()).await;
    assert_eq!(status, 400);
    assert!(answer["error"].as_str().unwrap().starts_with("bad body: "), "{answer}");
}

#[tokio::test]
async fn an_id_pushed_twice_to_a_queue_without_window_resolves_to_its_latest_offset() {
    for resolution in RESOLUTIONS {
        let b = broker_resolving(resolution).await;
        b.post("/api/v1/configure", json!({"queue": "q", "options": {"dedupWindowSeconds": 0}})).await;
        for t in ["t0", "t1", "t0"] {
            let (status, r) = b.post("/api/v1/push", json!({"items": [{"queue": "q", "partition": "p", "payload": t, "transactionId": t}]})).await;
            assert_eq!((status, r[0]["status"].as_str()), (201, Some("queued")), "{resolution:?}");
        }
        let popped = b.pop("/api/v1/pop/queue/q?batch=3").await.body.expect("a batch");
        let (lease, pid) = (popped["leaseId"].as_str().unwrap(), popped["partitionId"].as_str().unwrap());
        let r = b.ack_batch(None, &[("t0", pid, "completed", Some(lease))]).await;
        assert_eq!(outcome(&r[0]), (true, None), "{resolution:?}");
        assert_eq!(b.cursor(pid, "__QUEUE_MODE__").await, (2, None, 0), "{resolution:?}: offset 2 acked, 0 and 1 implicitly");
        assert_eq!(index_entries(&b).await, 0, "{resolution:?}");
    }
}

#[tokio::test]
async fn an_ack_resolves_from_the_segments_after_a_broker_restart() {
    let mut b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "").await;
    b.restart().await; // the in-memory registry is gone
    let r = b.ack_batch(None, &[("t1", &pid, "completed", Some(&lease))]).await;
    assert_eq!(outcome(&r[0]), (true, None));
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await.0, 1);
}

#[tokio::test]
async fn a_message_nacked_past_its_retry_limit_lands_in_the_dlq_and_the_next_one_is_delivered() {
    let b = Broker::start().await;
    b.push_to("r", "p", &[json!({"job": "bad"}), json!({"job": "good"})]).await;
    b.sql().await.execute("UPDATE queen.queues SET retry_limit = 2 WHERE name = 'r'", &[]).await.unwrap();
    for attempt in 1..=3 {
        let r = b.pop("/api/v1/pop/queue/r?batch=1&consumerGroup=w").await;
        assert_eq!(r.data(), [json!({"job": "bad"})], "attempt {attempt} redelivers the bad one");
        let body = r.body.unwrap();
        let m = &body["messages"][0];
        let (status, answer) = b
            .post("/api/v1/ack", json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "failed", "error": format!("boom {attempt}"), "consumerGroup": "w", "leaseId": body["leaseId"]}))
            .await;
        assert_eq!(status, 200);
        assert_eq!(answer[0]["success"], true);
        assert_eq!(answer[0]["dlq"], attempt == 3, "attempt {attempt}");
    }
    let r = b.pop("/api/v1/pop/queue/r?batch=1&consumerGroup=w").await;
    assert_eq!(r.data(), [json!({"job": "good"})], "the cursor moved past the dead letter");
    let row = b
        .sql()
        .await
        .query_one("SELECT payload::text, error_message, retry_count, consumer_group, msg_offset FROM queen.dead_letters", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), r#"{"job": "bad"}"#);
    assert_eq!(row.get::<_, String>(1), "boom 3");
    assert_eq!(row.get::<_, i32>(2), 2);
    assert_eq!(row.get::<_, String>(3), "w");
    assert_eq!(row.get::<_, i64>(4), 0);
}

#[tokio::test]
async fn a_dlq_status_dead_letters_at_once() {
    let b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "").await;
    let r = b.ack_batch(None, &[("t0", &pid, "completed", Some(&lease)), ("t1", &pid, "dlq", Some(&lease))]).await;
    assert_eq!(r[1]["dlq"], true);
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await, (1, None, 0));
    let n: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.dead_letters WHERE transaction_id = 't1'", &[]).await.unwrap().get(0);
    assert_eq!(n, 1);
    assert_eq!(b.pop("/api/v1/pop/queue/q?batch=1").await.data(), [json!(2)]);
}

#[tokio::test]
async fn a_queue_without_dlq_drops_the_exhausted_message() {
    let b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "").await;
    b.sql().await.execute("UPDATE queen.queues SET retry_limit = 0, dead_letter_queue = false, dlq_after_max_retries = false", &[]).await.unwrap();
    let r = b.ack_batch(None, &[("t0", &pid, "failed", Some(&lease))]).await;
    assert_eq!((r[0]["success"].as_bool(), r[0]["dlq"].as_bool()), (Some(true), Some(false)));
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await.0, 0, "dropped: the cursor moved past it");
}

#[tokio::test]
async fn two_leases_in_one_batch_ack_are_applied_per_partition_in_one_transaction() {
    let b = Broker::start().await;
    b.push_to("two", "a", &[json!("a0"), json!("a1")]).await;
    b.push_to("two", "b", &[json!("b0")]).await;
    let first = b.pop("/api/v1/pop/queue/two/partition/a").await.body.unwrap();
    let second = b.pop("/api/v1/pop/queue/two/partition/b").await.body.unwrap();
    let mut items = Vec::new();
    for body in [&first, &second] {
        for m in body["messages"].as_array().unwrap() {
            items.push(json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed", "error": null, "leaseId": body["leaseId"]}));
        }
    }
    let (_, r) = b.post("/api/v1/ack/batch", json!({"acknowledgments": items, "consumerGroup": null})).await;
    assert!(r.as_array().unwrap().iter().all(|x| x["success"] == true && x["leaseReleased"] == true), "{r}");
    assert_eq!(b.cursor(first["partitionId"].as_str().unwrap(), "__QUEUE_MODE__").await.0, 1);
    assert_eq!(b.cursor(second["partitionId"].as_str().unwrap(), "__QUEUE_MODE__").await.0, 0);
    // Both cursors moved in one transaction (one commit for the request).
    let pids: Vec<i64> = [&first, &second].iter().map(|x| x["partitionId"].as_str().unwrap().parse().unwrap()).collect();
    let writers: i64 = b
        .sql()
        .await
        .query_one("SELECT count(DISTINCT xmin::text) FROM queen.consumers WHERE partition_id = ANY ($1)", &[&pids])
        .await
        .unwrap()
        .get(0);
    assert_eq!(writers, 1, "one transaction wrote both cursor rows");
}

#[tokio::test]
async fn lease_extension_renews_never_shortens_and_never_revives() {
    let b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "&leaseSeconds=2").await;
    let expiry = || async {
        let p: i64 = pid.parse().unwrap();
        b.sql().await.query_one("SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM queen.consumers WHERE partition_id = $1", &[&p]).await.unwrap().get::<_, f64>(0)
    };
    // No body: 60 seconds.
    let r = b.http.post(format!("{}/api/v1/lease/{lease}/extend", b.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!((body["success"].as_bool(), body["renewed"].as_i64()), (Some(true), Some(1)));
    assert_eq!(body["newExpiresAt"], body["expiresAt"]);
    assert_eq!(body["expiresAt"], body["lease_expires_at"]);
    assert!(body["expiresAt"].as_str().unwrap().ends_with('Z'));
    assert!((expiry().await - 60.0).abs() < 2.0);
    let (_, body) = b.post(&format!("/api/v1/lease/{lease}/extend"), json!({"seconds": 5})).await;
    assert_eq!(body["renewed"], 1);
    assert!(expiry().await > 55.0, "never shortens");
    let (_, body) = b.post(&format!("/api/v1/lease/{lease}/extend"), json!({"seconds": 120})).await;
    assert!(expiry().await > 115.0);
    assert_eq!(body["success"], true);
    // Released leases are not revived; unknown ones answer 200 all the same.
    b.ack_batch(None, &[("t4", &pid, "completed", Some(&lease))]).await;
    let (status, body) = b.post(&format!("/api/v1/lease/{lease}/extend"), json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({"leaseId": lease, "success": false, "renewed": 0, "newExpiresAt": null, "expiresAt": null, "lease_expires_at": null}));
}

/// A small deterministic generator for the load test's coin flips.
struct XorShift(u64);
impl XorShift {
    fn chance(&mut self, percent: u64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % 100 < percent
    }
}

/// Per transactionId: how many acks advanced the cursor, and the (partition,
/// offset-order) in which they did.
#[derive(Default)]
struct Ledger {
    advanced: HashMap<String, u32>,
    order: HashMap<String, Vec<String>>,
}

async fn consume_all(b: &Broker, group: &str, consumers: usize, expected: usize, seed: u64) -> Ledger {
    let ledger = std::sync::Arc::new(tokio::sync::Mutex::new(Ledger::default()));
    let failed_once = std::sync::Arc::new(tokio::sync::Mutex::new(std::collections::HashSet::<String>::new()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut tasks = Vec::new();
    for c in 0..consumers {
        let (http, url, ledger, failed_once) = (b.http.clone(), b.url.clone(), ledger.clone(), failed_once.clone());
        let group = group.to_string();
        tasks.push(tokio::spawn(async move {
            let mut rng = XorShift(seed + c as u64 * 7919 + 1);
            loop {
                if ledger.lock().await.advanced.len() >= expected || tokio::time::Instant::now() > deadline {
                    return;
                }
                let r = http
                    .get(format!("{url}/api/v1/pop/queue/load?batch=50&partitions=2&consumerGroup={group}&leaseSeconds=2&wait=true&timeout=500"))
                    .send()
                    .await
                    .unwrap();
                if r.status().as_u16() != 200 {
                    continue;
                }
                let body: Value = r.json().await.unwrap();
                if rng.chance(2) {
                    continue; // a crashed consumer: no ack, the lease expires
                }
                let lease = body["leaseId"].as_str().unwrap().to_string();
                let mut acks = Vec::new();
                let mut stopped: std::collections::HashSet<String> = Default::default();
                for m in body["messages"].as_array().unwrap() {
                    let (txn, pid) = (m["transactionId"].as_str().unwrap().to_string(), m["partitionId"].as_str().unwrap().to_string());
                    if stopped.contains(&pid) {
                        continue; // after a nack, the rest of that partition redelivers
                    }
                    let fail = rng.chance(5) && failed_once.lock().await.insert(txn.clone());
                    acks.push(json!({"transactionId": txn, "partitionId": pid, "status": if fail { "failed" } else { "completed" }, "error": null, "leaseId": lease}));
                    if fail {
                        stopped.insert(pid);
                    }
                }
                // Held across the ack, so the ledger's order is the commit
                // order: a consumer woken by this ack's lease release may
                // otherwise ack the next batch and record it first.
                let mut l = ledger.lock().await;
                let res: Value = http
                    .post(format!("{url}/api/v1/ack/batch"))
                    .json(&json!({"acknowledgments": acks, "consumerGroup": group}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                for (a, r) in acks.iter().zip(res.as_array().unwrap()) {
                    if a["status"] == "completed" && r["success"] == true && r["noop"] == false {
                        let txn = a["transactionId"].as_str().unwrap().to_string();
                        *l.advanced.entry(txn.clone()).or_default() += 1;
                        l.order.entry(a["partitionId"].as_str().unwrap().to_string()).or_default().push(txn);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    std::sync::Arc::try_unwrap(ledger).ok().unwrap().into_inner()
}

async fn produce(b: &Broker, total: usize) {
    let mut tasks = Vec::new();
    for producer in 0..4 {
        let (http, url) = (b.http.clone(), b.url.clone());
        tasks.push(tokio::spawn(async move {
            for chunk in 0..(total / 4 / 50) {
                let items: Vec<Value> = (0..50)
                    .map(|i| {
                        let n = chunk * 50 + i;
                        // txn "<partition>:<producer>:<seq>" so the offset order is checkable.
                        let p = n % 20;
                        json!({"queue": "load", "partition": format!("p{p}"), "payload": n, "transactionId": format!("{p}:{producer}:{n:06}")})
                    })
                    .collect();
                let r = http.post(format!("{url}/api/v1/push")).json(&json!({ "items": items })).send().await.unwrap();
                assert_eq!(r.status().as_u16(), 201);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn check_ledger(name: &str, ledger: &Ledger, total: usize) {
    assert_eq!(ledger.advanced.len(), total, "{name}: every message acked once (none dead-lettered with limit 3 and one failure each)");
    let twice: Vec<_> = ledger.advanced.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "{name}: acked more than once: {twice:?}");
    for (pid, txns) in &ledger.order {
        // Within a partition, each producer's sequence advances in order.
        let mut last: HashMap<&str, &str> = HashMap::new();
        for t in txns {
            let mut parts = t.split(':');
            let (_, producer, seq) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
            if let Some(prev) = last.insert(producer, seq) {
                assert!(prev < seq, "{name}: partition {pid} committed {seq} after {prev}");
            }
        }
    }
}

#[tokio::test]
async fn under_load_every_message_is_committed_exactly_once_in_order() {
    let b = Broker::start().await;
    const TOTAL: usize = 20_000;
    let (_, ledger) = tokio::join!(produce(&b, TOTAL), consume_all(&b, "workers", 8, TOTAL, 42));
    check_ledger("one group", &ledger, TOTAL);
    let dlq: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.dead_letters", &[]).await.unwrap().get(0);
    assert_eq!(dlq, 0);
}

#[tokio::test]
async fn two_groups_under_load_each_see_everything() {
    let b = Broker::start().await;
    const TOTAL: usize = 8_000;
    let (_, a, c) = tokio::join!(produce(&b, TOTAL), consume_all(&b, "alpha", 4, TOTAL, 7), consume_all(&b, "beta", 4, TOTAL, 99));
    check_ledger("alpha", &a, TOTAL);
    check_ledger("beta", &c, TOTAL);
}

#[tokio::test]
async fn a_batch_over_several_partitions_answers_every_group_by_the_full_rules() {
    // Plain groups (a live lease, all completed, inside the span) commit in
    // one bulk statement; the rest fall back to the per-group rules.
    let b = Broker::start().await;
    let mut lease = HashMap::new();
    let mut pid = HashMap::new();
    for p in ["a", "b", "c", "d"] {
        let txns: Vec<Value> = (0..3).map(|i| json!({"queue": "mix", "partition": p, "payload": i, "transactionId": format!("{p}{i}")})).collect();
        assert_eq!(b.post("/api/v1/push", json!({ "items": txns })).await.0, 201);
        let popped = b.pop(&format!("/api/v1/pop/queue/mix/partition/{p}?batch=3")).await.body.expect("a batch");
        lease.insert(p, popped["leaseId"].as_str().unwrap().to_string());
        pid.insert(p, popped["partitionId"].as_str().unwrap().to_string());
    }
    let ack = |t: &'static str, p: &'static str, status: &'static str, l: &str| {
        json!({"transactionId": t, "partitionId": pid[p], "status": status, "error": null, "leaseId": l})
    };
    let batch = vec![
        ack("a0", "a", "completed", &lease["a"]),
        ack("b0", "b", "completed", &lease["b"]),
        ack("a2", "a", "completed", &lease["a"]),
        ack("c0", "c", "completed", &lease["c"]),
        ack("c1", "c", "failed", &lease["c"]),
        ack("d0", "d", "completed", "not-the-lease"),
    ];
    let (_, r) = b.post("/api/v1/ack/batch", json!({"acknowledgments": batch, "consumerGroup": null})).await;
    let got: Vec<(bool, Option<&str>, bool)> =
        r.as_array().unwrap().iter().map(|x| (x["success"].as_bool().unwrap(), x["error"].as_str(), x["leaseReleased"].as_bool().unwrap())).collect();
    assert_eq!(
        got,
        vec![
            (true, None, true),
            (true, None, false),
            (true, None, true),
            (true, None, true),
            (true, None, true),
            (false, Some("invalid or expired lease"), false),
        ],
        "{r}"
    );
    let q = "__QUEUE_MODE__";
    assert_eq!(b.cursor(&pid["a"], q).await, (2, None, 0), "a: whole batch, released");
    assert_eq!(b.cursor(&pid["b"], q).await, (0, Some(lease["b"].clone()), 0), "b: a prefix, lease kept");
    assert_eq!(b.cursor(&pid["c"], q).await, (0, None, 1), "c: the nack released and charged");
    assert_eq!(b.cursor(&pid["d"], q).await, (-1, Some(lease["d"].clone()), 0), "d: nothing moved");

    // A retried ack below the cursor is a noop; the rest of b commits.
    let batch = vec![ack("a1", "a", "completed", &lease["a"]), ack("b1", "b", "completed", &lease["b"]), ack("b2", "b", "completed", &lease["b"])];
    let (_, r) = b.post("/api/v1/ack/batch", json!({"acknowledgments": batch, "consumerGroup": null})).await;
    let got: Vec<(bool, bool, bool)> =
        r.as_array().unwrap().iter().map(|x| (x["success"].as_bool().unwrap(), x["noop"].as_bool().unwrap(), x["leaseReleased"].as_bool().unwrap())).collect();
    assert_eq!(got, vec![(true, true, false), (true, false, true), (true, false, true)], "{r}");
    assert_eq!(b.cursor(&pid["b"], q).await, (2, None, 0));

    // In bulk: a and b, then b's rest. One by one: c (a nack), d (its lease
    // did not match, so the bulk call left it), then a's noop.
    assert_eq!(ack_groups_by_path(&b).await, (3.0, 3.0));
}

/// Ack groups applied so far (bulk, one by one), from the broker's metrics.
async fn ack_groups_by_path(b: &Broker) -> (f64, f64) {
    let text = b.prometheus().await;
    let groups = |path: &str| common::sample(&text, &format!("queen_ack_groups_total{{path=\"{path}\"}}")).unwrap_or(0.0);
    (groups("bulk"), groups("each"))
}

#[tokio::test]
async fn one_partitions_plain_batch_commits_in_bulk_and_a_nack_by_the_full_rules() {
    // ack_v1 answers item by item in PL/pgSQL; a plain group is one update
    // even alone (docs/PERFORMANCE.md, stop 13).
    let b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "").await;
    let acks: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
    let items: Vec<(&str, &str, &str, Option<&str>)> =
        acks.iter().map(|t| (t.as_str(), pid.as_str(), "completed", Some(lease.as_str()))).collect();
    let r = b.ack_batch(None, &items[..3]).await;
    assert!(r.iter().all(|x| outcome(x) == (true, None) && x["leaseReleased"] == false), "{r:?}");
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await, (2, Some(lease.clone()), 0));
    let r = b.ack_batch(None, &items[3..]).await;
    assert!(r.iter().all(|x| outcome(x) == (true, None) && x["leaseReleased"] == true), "{r:?}");
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await, (4, None, 0));
    assert_eq!(ack_groups_by_path(&b).await, (2.0, 0.0));

    // A retried ack (now below the cursor) is not plain: the full rules call
    // it a noop. So is a stale lease, which the bulk statement leaves alone.
    let r = b.ack_batch(None, &items[4..]).await;
    assert_eq!((outcome(&r[0]), &r[0]["noop"]), ((true, None), &json!(true)), "{r:?}");
    let t5 = json!({"items": [{"queue": "q", "partition": "p", "payload": 5, "transactionId": "t5"}]});
    assert_eq!(b.post("/api/v1/push", t5).await.0, 201);
    let popped = b.pop("/api/v1/pop/queue/q?batch=5").await.body.expect("t5");
    let lease = popped["leaseId"].as_str().unwrap().to_string();
    let r = b.ack_batch(None, &[("t5", &pid, "completed", Some("stale"))]).await;
    assert_eq!(outcome(&r[0]), (false, Some("invalid or expired lease")));
    let r = b.ack_batch(None, &[("t5", &pid, "failed", Some(&lease))]).await;
    assert_eq!(outcome(&r[0]), (true, None));
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await, (4, None, 1));
    assert_eq!(ack_groups_by_path(&b).await, (2.0, 3.0));
}

#[tokio::test]
async fn without_index_or_registry_an_ack_resolves_within_a_thousand_offsets_of_the_cursor() {
    // The bound of queen.ack_span_v1 (docs/DECISIONS.md): from the segment
    // covering committed + 1 - 1000 to committed + 1000 (or the batch end).
    let b = broker_resolving(Resolution::Span).await;
    let txns = |r: std::ops::Range<usize>| -> Vec<Value> {
        r.map(|i| json!({"queue": "q", "partition": "p", "payload": i, "transactionId": format!("t{i}")})).collect()
    };
    for range in [0..200, 200..1500] {
        assert_eq!(b.post("/api/v1/push", json!({ "items": txns(range) })).await.0, 201);
    }
    let popped = b.pop("/api/v1/pop/queue/q?batch=1").await.body.expect("a message");
    let pid = popped["partitionId"].as_str().unwrap().to_string();
    b.commit_cursor(pid.parse().unwrap(), "__QUEUE_MODE__", 1199).await;
    let r = b.ack_batch(None, &[("t199", &pid, "completed", None), ("t200", &pid, "completed", None), ("t1499", &pid, "completed", None)]).await;
    assert_eq!(outcome(&r[0]), (false, Some(UNRESOLVABLE)), "t199: its segment ends below the span");
    assert_eq!((outcome(&r[1]), r[1]["noop"].as_bool()), ((true, None), Some(true)), "t200: below the cursor, inside the span");
    assert_eq!(outcome(&r[2]), (true, None), "t1499: a lease-less ack past the cursor");
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await.0, 1499);
}

/// A plain ack batch names each group's queue: from the ack registry when
/// the pop was this broker's, from the partition row otherwise
/// (`queen.ack_completed_many_v1`). Both count the acks under the right queue and release the leases.
#[tokio::test]
async fn a_plain_ack_batch_names_each_queue_with_or_without_the_registry() {
    for registry_mb in [None, Some("0")] {
        let b = match registry_mb {
            None => Broker::start().await,
            Some(mb) => Broker::start_with(&[("QUEEN_ACK_REGISTRY_MB", mb)]).await,
        };
        let mut items = Vec::new();
        for (queue, n) in [("qa", 2), ("qb", 3)] {
            let payloads: Vec<Value> = (0..n).map(|i| json!({"queue": queue, "partition": "p", "payload": i, "transactionId": format!("{queue}-{i}")})).collect();
            assert_eq!(b.post("/api/v1/push", json!({ "items": payloads })).await.0, 201);
            let body = b.pop(&format!("/api/v1/pop/queue/{queue}?batch=10")).await.body.expect("a batch");
            let lease = body["leaseId"].as_str().unwrap().to_string();
            for m in body["messages"].as_array().unwrap() {
                items.push((m["transactionId"].as_str().unwrap().to_string(), m["partitionId"].as_str().unwrap().to_string(), lease.clone()));
            }
        }
        let acks: Vec<(&str, &str, &str, Option<&str>)> =
            items.iter().map(|(t, p, l)| (t.as_str(), p.as_str(), "completed", Some(l.as_str()))).collect();
        let r = b.ack_batch(None, &acks).await;
        assert!(r.iter().all(|x| outcome(x) == (true, None) && x["leaseReleased"] == true), "{registry_mb:?}: {r:?}");
        assert_eq!(ack_groups_by_path(&b).await, (2.0, 0.0), "{registry_mb:?}: both groups in bulk");
        let text = b.prometheus().await;
        let acked = |queue: &str| common::sample(&text, &format!("queen_ack_messages_total{{queue=\"{queue}\"}}"));
        assert_eq!((acked("qa"), acked("qb")), (Some(2.0), Some(3.0)), "{registry_mb:?}:\n{text}");
    }
}

/// The same ack batch sent twice at once, its items in opposite partition
/// orders (a client retrying while the first try is in flight). The cursor
/// rows are locked in partition order whatever the request's order (and a
/// deadlock, should a plan ever lock otherwise, is retried), so the second
/// waits for the first, then finds its acks below the cursor: every item
/// answers success, and each cursor moves and counts its messages once.
#[tokio::test]
async fn the_same_batch_acked_twice_at_once_in_opposite_orders_succeeds_once() {
    let b = Broker::start().await;
    let parts = ["a", "b", "c", "d"];
    for round in 0..10 {
        for p in parts {
            b.push_to("twice", p, &[json!({"round": round, "p": p}), json!({"round": round, "p": p, "k": 1})]).await;
        }
        let mut items: Vec<Value> = Vec::new();
        for p in parts {
            let body = b.pop(&format!("/api/v1/pop/queue/twice/partition/{p}?batch=2")).await.body.expect("a batch");
            for m in body["messages"].as_array().unwrap() {
                items.push(json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed", "error": null, "leaseId": body["leaseId"]}));
            }
        }
        let reversed: Vec<Value> = items.iter().rev().cloned().collect();
        let ((s1, r1), (s2, r2)) = tokio::join!(
            b.post("/api/v1/ack/batch", json!({"acknowledgments": items, "consumerGroup": null})),
            b.post("/api/v1/ack/batch", json!({"acknowledgments": reversed, "consumerGroup": null})),
        );
        assert_eq!((s1, s2), (200, 200), "round {round}: {r1} {r2}");
        for r in [&r1, &r2] {
            assert!(r.as_array().unwrap().iter().all(|x| x["success"] == true), "round {round}: {r}");
        }
        for p in parts {
            let row = b
                .sql()
                .await
                .query_one(
                    "SELECT c.committed, c.worker_id, c.total_consumed FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id WHERE p.name = $1",
                    &[&p],
                )
                .await
                .unwrap();
            let expected = (2 * round + 1) as i64;
            assert_eq!(
                (row.get::<_, i64>(0), row.get::<_, Option<String>>(1), row.get::<_, i64>(2)),
                (expected, None, expected + 1),
                "round {round}, partition {p}: committed, lease, consumed once"
            );
        }
    }
}

#[tokio::test]
async fn an_auto_ack_delivery_gives_the_next_message_a_fresh_retry_budget() {
    let b = Broker::start().await;
    assert_eq!(b.post("/api/v1/configure", json!({"queue": "q", "options": {"retryLimit": 1}})).await.0, 200);
    let (lease, pid) = leased_five(&b, "").await;
    let r = b.ack_batch(None, &[("t0", &pid, "failed", Some(&lease))]).await;
    assert_eq!(r[0]["dlq"], false);
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await.2, 1, "t0 spent one retry");
    let r = b.pop("/api/v1/pop/queue/q?batch=1&autoAck=true").await;
    assert_eq!(r.messages()[0]["transactionId"], "t0", "autoAck delivers and commits t0");
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await, (0, None, 0), "the next message starts with its own budget");
    let body = b.pop("/api/v1/pop/queue/q?batch=1").await.body.unwrap();
    let r = b.ack_batch(None, &[("t1", &pid, "failed", Some(body["leaseId"].as_str().unwrap()))]).await;
    assert_eq!((r[0]["success"].as_bool(), r[0]["dlq"].as_bool()), (Some(true), Some(false)), "t1's first failure is a retry, not t0's second: {r:?}");
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await.2, 1);
}

/// Concurrent ack requests share commits (`ack::share`), and each is
/// answered with its own outcome: a request naming a wrong lease among good
/// ones fails alone, every good one moves its own partition's cursor, and
/// the fenced message's cursor stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_acks_share_a_commit_and_each_gets_its_own_outcome() {
    // One writer: whatever arrives while it writes waits and goes together.
    let b = Broker::start_with(&[("QUEEN_ACK_GROUP_WRITERS", "1")]).await;
    const PARTITIONS: usize = 12;
    assert_eq!(b.post("/api/v1/push", json!({"items": [{"queue": "q", "partition": "fenced", "payload": 0, "transactionId": "f0"}]})).await.0, 201);
    let fenced = b.pop("/api/v1/pop/queue/q/partition/fenced?batch=1").await.body.expect("the fenced message");
    let fenced_pid = fenced["partitionId"].as_str().unwrap().to_string();
    let shared = || async { common::sample(&b.prometheus().await, "queen_ack_shared_requests_total").unwrap_or(0.0) };
    let mut rounds = 0;
    while shared().await == 0.0 {
        assert!(rounds < 20, "twenty rounds of {PARTITIONS} concurrent acks never shared a commit");
        let items: Vec<Value> = (0..PARTITIONS)
            .map(|k| json!({"queue": "q", "partition": format!("p{k}"), "payload": k, "transactionId": format!("r{rounds}-{k}")}))
            .collect();
        assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
        let mut leased = Vec::new();
        for k in 0..PARTITIONS {
            let body = b.pop(&format!("/api/v1/pop/queue/q/partition/p{k}?batch=1")).await.body.expect("one message");
            leased.push((body["leaseId"].as_str().unwrap().to_string(), body["partitionId"].as_str().unwrap().to_string()));
        }
        let txns: Vec<String> = (0..PARTITIONS).map(|k| format!("r{rounds}-{k}")).collect();
        let b = &b;
        let good = leased.iter().zip(&txns).map(|((lease, pid), txn)| async move {
            b.ack_batch(None, &[(txn.as_str(), pid.as_str(), "completed", Some(lease.as_str()))]).await
        });
        let bad = async { b.ack_batch(None, &[("f0", &fenced_pid, "completed", Some("not-the-lease"))]).await };
        let (answers, bad) = tokio::join!(futures_util::future::join_all(good), bad);
        assert_eq!(bad.len(), 1);
        assert_eq!((outcome(&bad[0]), bad[0]["transactionId"].as_str()), ((false, Some("invalid or expired lease")), Some("f0")));
        for ((answer, txn), (_, pid)) in answers.iter().zip(&txns).zip(&leased) {
            assert_eq!(answer.len(), 1, "{answer:?}");
            assert_eq!((outcome(&answer[0]), answer[0]["transactionId"].as_str(), answer[0]["index"].as_u64()), ((true, None), Some(txn.as_str()), Some(0)));
            assert_eq!(b.cursor(pid, "__QUEUE_MODE__").await.0, rounds as i64, "{txn}");
        }
        rounds += 1;
    }
    assert_eq!(b.cursor(&fenced_pid, "__QUEUE_MODE__").await.0, -1, "the fenced ack moved nothing");
}

/// A nack's error text with a NUL character (which PostgreSQL's text cannot
/// hold) is refused at the edge, naming the field, and moves nothing.
#[tokio::test]
async fn a_nack_whose_error_holds_a_nul_is_refused_and_changes_nothing() {
    let b = Broker::start().await;
    let (lease, pid) = leased_five(&b, "").await;
    let nack = json!({"acknowledgments": [{"transactionId": "t0", "partitionId": pid, "leaseId": lease, "status": "failed", "error": "bad\u{0}byte"}]});
    let (status, body) = b.post("/api/v1/ack/batch", nack).await;
    // The batch route refuses the item alone, inside its 200.
    assert_eq!(status, 200, "{body}");
    assert_eq!(body[0]["success"], false, "{body}");
    assert!(body[0]["error"].as_str().unwrap().starts_with("error: must not contain a NUL character"), "{body}");
    let (status, body) = b.post("/api/v1/ack", json!({"transactionId": "t0", "partitionId": pid, "leaseId": lease, "status": "failed", "error": "bad\u{0}byte"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().starts_with("error: must not contain a NUL character"), "{body}");
    let (status, body) = b.post("/api/v1/ack", json!({"transactionId": "t0", "partitionId": pid, "leaseId": lease, "consumerGroup": "g\u{0}"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().starts_with("consumerGroup: must not contain"), "{body}");
    let (status, body) = b.post(&format!("/api/v1/lease/{}%00/extend", lease), json!({})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().starts_with("leaseId: must not contain"), "{body}");
    // Nothing moved, nothing counted against the retry budget.
    let (committed, _, retries) = b.cursor(&pid, "__QUEUE_MODE__").await;
    assert_eq!((committed, retries), (-1, 0));
}

/// `n` messages t0.. in q/p, and t0 popped alone under a lease: (lease, partitionId).
async fn t0_leased_of(b: &Broker, n: usize) -> (String, String) {
    let items: Vec<Value> = (0..n).map(|i| json!({"queue": "q", "partition": "p", "payload": i, "transactionId": format!("t{i}")})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    let first = b.pop("/api/v1/pop/queue/q?batch=1").await.body.expect("t0");
    assert_eq!(first["messages"][0]["transactionId"], "t0");
    (first["leaseId"].as_str().unwrap().to_string(), first["partitionId"].as_str().unwrap().to_string())
}

/// The lease handover (`pop::handover`, migration 0028): an ack that ends a
/// lease while a pop of the group is parked on the broker leases the next
/// message to that pop in its own update. The parked pop is answered with
/// the next message under a lease of its own, the old lease is fenced off,
/// the other parked pops are not woken to race for it, and the new lease
/// commits like any other.
#[tokio::test]
async fn an_ack_hands_the_partition_to_a_parked_pop_under_its_own_lease() {
    let b = Broker::start().await;
    let (l0, pid) = t0_leased_of(&b, 3).await;
    let handovers = || async { common::sample(&b.prometheus().await, "queen_pop_handovers_total").unwrap_or(0.0) };
    assert_eq!(handovers().await, 0.0);
    // Two pops park: the partition is leased. One of them is served.
    let parked = |b: &Broker| {
        let (http, url) = (b.http.clone(), format!("{}/api/v1/pop/queue/q?batch=1&wait=true&timeout=4000", b.url));
        tokio::spawn(async move {
            let bytes = http.get(url).send().await.unwrap().bytes().await.unwrap();
            common::Popped { status: 200, body: (!bytes.is_empty()).then(|| serde_json::from_slice(&bytes).unwrap()), content_length: None }
        })
    };
    let waiting = parked(&b);
    b.until_parked(1).await;
    let second = parked(&b);
    b.until_parked(2).await;
    let started = std::time::Instant::now();
    let r = b.ack_batch(None, &[("t0", &pid, "completed", Some(&l0))]).await;
    assert_eq!((outcome(&r[0]), r[0]["leaseReleased"].as_bool()), ((true, None), Some(true)), "{r:?}");
    let (handed, second) = match futures_util::future::select(waiting, second).await {
        futures_util::future::Either::Left((handed, other)) => (handed, other),
        futures_util::future::Either::Right((handed, other)) => (handed, other),
    };
    let handed = handed.unwrap().body.expect("a parked pop is answered with t1");
    assert!(started.elapsed() < Duration::from_secs(3), "answered by the ack, not at its deadline");
    assert_eq!(handed["messages"].as_array().unwrap().len(), 1);
    assert_eq!(handed["messages"][0]["transactionId"], "t1");
    assert_eq!(handed["messages"][0]["data"], 1);
    let l1 = handed["leaseId"].as_str().unwrap().to_string();
    assert_ne!(l1, l0);
    assert_eq!(handovers().await, 1.0);
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await, (0, Some(l1.clone()), 0), "t0 committed, t1 leased to the parked pop");
    // The old lease is over; the second pop still waits (not woken to race).
    let r = b.ack_batch(None, &[("t1", &pid, "completed", Some(&l0))]).await;
    assert_eq!(outcome(&r[0]), (false, Some("invalid or expired lease")), "{r:?}");
    assert!(!second.is_finished(), "the other pop still waits");
    // The new lease commits; it hands t2 on to the second pop.
    let r = b.ack_batch(None, &[("t1", &pid, "completed", Some(&l1))]).await;
    assert_eq!(outcome(&r[0]), (true, None), "{r:?}");
    let last = second.await.unwrap().body.expect("t2 for the other pop");
    assert_eq!(last["messages"][0]["transactionId"], "t2");
    let l2 = last["leaseId"].as_str().unwrap().to_string();
    assert_eq!(handovers().await, 2.0);
    // With nothing after t2 the ack releases as it always did.
    let r = b.ack_batch(None, &[("t2", &pid, "completed", Some(&l2))]).await;
    assert_eq!((outcome(&r[0]), r[0]["leaseReleased"].as_bool()), ((true, None), Some(true)), "{r:?}");
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await, (2, None, 0));
    assert_eq!(handovers().await, 2.0);
}

/// A lone ack request over several partitions, every item completed under
/// its lease, commits without a transaction of its own (`AckService::ack_now`):
/// its plain groups are one statement, which also hands a partition to a pop
/// parked on the queue, as a single partition's ack does. Each ack is
/// answered, both cursors move, and the parked pop gets the next message of
/// one of the two partitions under its own lease.
#[tokio::test]
async fn a_lone_ack_of_several_partitions_hands_one_to_a_parked_pop() {
    let b = Broker::start().await;
    b.push_to("two", "a", &[json!("a0"), json!("a1")]).await;
    b.push_to("two", "b", &[json!("b0"), json!("b1")]).await;
    let first = b.pop("/api/v1/pop/queue/two/partition/a?batch=1").await.body.unwrap();
    let second = b.pop("/api/v1/pop/queue/two/partition/b?batch=1").await.body.unwrap();
    let handovers = || async { common::sample(&b.prometheus().await, "queen_pop_handovers_total").unwrap_or(0.0) };
    let (http, url) = (b.http.clone(), format!("{}/api/v1/pop/queue/two?batch=1&wait=true&timeout=4000", b.url));
    let parked = tokio::spawn(async move { http.get(url).send().await.unwrap().json::<Value>().await.unwrap() });
    b.until_parked(1).await;
    let mut items = Vec::new();
    for body in [&first, &second] {
        let m = &body["messages"][0];
        items.push(json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed", "leaseId": body["leaseId"]}));
    }
    let started = std::time::Instant::now();
    let (status, r) = b.post("/api/v1/ack/batch", json!({ "acknowledgments": items })).await;
    assert_eq!(status, 200);
    assert!(r.as_array().unwrap().iter().all(|x| x["success"] == true && x["noop"] == false && x["leaseReleased"] == true), "{r}");
    let handed = parked.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "answered by the ack, not at its deadline");
    assert_eq!(handovers().await, 1.0);
    let next = handed["messages"][0]["data"].as_str().unwrap().to_string();
    assert!(next == "a1" || next == "b1", "{handed}");
    let (pa, pb) = (first["partitionId"].as_str().unwrap(), second["partitionId"].as_str().unwrap());
    let (ca, cb) = (b.cursor(pa, "__QUEUE_MODE__").await, b.cursor(pb, "__QUEUE_MODE__").await);
    assert_eq!((ca.0, cb.0), (0, 0), "both acks committed");
    let lease = handed["leaseId"].as_str().map(str::to_string);
    let (held, free) = if next == "a1" { (ca, cb) } else { (cb, ca) };
    assert_eq!((held.1, free.1), (lease, None), "the handed partition is leased to the parked pop, the other released");
}

/// A queue whose messages a visibility option holds back is never handed
/// over: the ack releases the lease and the parked pop claims by the rules
/// (delayedProcessing: t1, pushed an hour "ago", is visible and claimed; t2,
/// just pushed, stays hidden).
#[tokio::test]
async fn a_delayed_queue_is_not_handed_over() {
    let b = Broker::start().await;
    assert_eq!(b.post("/api/v1/configure", json!({"queue": "q", "options": {"delayedProcessing": 30}})).await.0, 200);
    let items: Vec<Value> = (0..2).map(|i| json!({"queue": "q", "partition": "p", "payload": i, "transactionId": format!("t{i}")})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    b.sql().await.execute("UPDATE queen.segments SET created_at = created_at - interval '1 hour'", &[]).await.unwrap();
    assert_eq!(b.post("/api/v1/push", json!({"items": [{"queue": "q", "partition": "p", "payload": 2, "transactionId": "t2"}]})).await.0, 201);
    let first = b.pop("/api/v1/pop/queue/q?batch=1").await.body.expect("t0");
    assert_eq!(first["messages"][0]["transactionId"], "t0");
    let (l0, pid) = (first["leaseId"].as_str().unwrap().to_string(), first["partitionId"].as_str().unwrap().to_string());
    let parked = b.pop("/api/v1/pop/queue/q?batch=1&wait=true&timeout=4000");
    let ack = async {
        b.until_parked(1).await;
        b.ack_batch(None, &[("t0", &pid, "completed", Some(&l0))]).await
    };
    let (popped, r) = tokio::join!(parked, ack);
    assert_eq!(outcome(&r[0]), (true, None));
    let body = popped.body.expect("t1, claimed after the release");
    assert_eq!(body["messages"][0]["transactionId"], "t1");
    assert_eq!(body["messages"].as_array().unwrap().len(), 1);
    assert_eq!(common::sample(&b.prometheus().await, "queen_pop_handovers_total").unwrap_or(0.0), 0.0, "released, not handed over");
    let r = b.ack_batch(None, &[("t1", &pid, "completed", Some(body["leaseId"].as_str().unwrap()))]).await;
    assert_eq!(outcome(&r[0]), (true, None));
    assert_eq!(b.pop("/api/v1/pop/queue/q?batch=1").await.body, None, "t2 is still delayed");
}

/// A `QPF1` pop ships stored segments as they are, so a handover to one
/// carries the blob even when the broker holds that segment decompressed
/// (the JSON pop before it left it in `pop::frames`): the answer holds a
/// zstd frame, not an empty one.
#[tokio::test]
async fn a_framed_pop_handed_over_gets_the_stored_segment() {
    let b = Broker::start().await;
    let (l0, pid) = t0_leased_of(&b, 3).await;
    let framed = b.http.get(format!("{}/api/v1/pop/queue/q?batch=1&wait=true&timeout=4000&frames=true", b.url)).send();
    let ack = async {
        b.until_parked(1).await;
        b.ack_batch(None, &[("t0", &pid, "completed", Some(&l0))]).await
    };
    let (framed, r) = tokio::join!(framed, ack);
    assert_eq!(outcome(&r[0]), (true, None));
    let framed = framed.unwrap();
    assert_eq!(framed.status().as_u16(), 200);
    let body = framed.bytes().await.unwrap();
    const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    assert!(body.windows(4).any(|w| w == ZSTD_MAGIC), "the handed QPF1 answer carries the stored segment ({} bytes)", body.len());
    assert_eq!(common::sample(&b.prometheus().await, "queen_pop_handovers_total").unwrap_or(0.0), 1.0);
}

/// Under pop maintenance every pop answers empty, so an ack hands nothing
/// to a pop parked before it was switched on: the lease is released and the
/// parked pop answers 204.
#[tokio::test]
async fn nothing_is_handed_over_under_pop_maintenance() {
    let b = Broker::start().await;
    let (l0, pid) = t0_leased_of(&b, 2).await;
    let parked = b.pop("/api/v1/pop/queue/q?batch=1&wait=true&timeout=3000");
    let ack = async {
        b.until_parked(1).await;
        assert_eq!(b.post("/api/v1/system/maintenance/pop", json!({"enabled": true})).await.0, 200);
        b.ack_batch(None, &[("t0", &pid, "completed", Some(&l0))]).await
    };
    let (popped, r) = tokio::join!(parked, ack);
    assert_eq!(outcome(&r[0]), (true, None));
    assert_eq!(popped.body, None, "the parked pop answers empty");
    assert_eq!(b.cursor(&pid, "__QUEUE_MODE__").await, (0, None, 0), "released, not handed over");
    assert_eq!(common::sample(&b.prometheus().await, "queen_pop_handovers_total").unwrap_or(0.0), 0.0);
    assert_eq!(b.post("/api/v1/system/maintenance/pop", json!({"enabled": false})).await.0, 200);
    assert_eq!(b.pop("/api/v1/pop/queue/q?batch=1").await.messages()[0]["transactionId"], "t1");
}
