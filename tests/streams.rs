//! The streams runtime's server half (issue 30): registration, state reads,
//! and the cycle that commits state, pushes and the ack all or nothing.

mod common;

use std::time::Duration;

use common::{eventually, stored_messages, Broker};
use serde_json::{json, Value};

async fn register(b: &Broker, name: &str, hash: &str, reset: bool) -> (u16, Value) {
    b.post("/streams/v1/queries", json!({"name": name, "source_queue": "src", "sink_queue": "sink", "config_hash": hash, "reset": reset})).await
}

/// Pops up to `n` leased messages of `src/p` for the stream's group: (partitionId, leaseId, transactionIds).
async fn leased(b: &Broker, group: &str, n: usize) -> (String, String, Vec<String>) {
    let body = b.pop(&format!("/api/v1/pop/queue/src/partition/p?consumerGroup={group}&batch={n}&wait=false")).await.body.expect("messages");
    let m = body["messages"].as_array().unwrap();
    (m[0]["partitionId"].as_str().unwrap().into(), body["leaseId"].as_str().unwrap().into(),
     m.iter().map(|x| x["transactionId"].as_str().unwrap().to_string()).collect())
}

async fn state(b: &Broker, q: &str, pid: &str, extra: Value) -> Vec<(String, Value)> {
    let mut body = json!({"query_id": q, "partition_id": pid, "keys": []});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, r) = b.post("/streams/v1/state/get", body).await;
    assert_eq!((status, r["success"].clone()), (200, json!(true)), "{r}");
    r["rows"].as_array().unwrap().iter().map(|r| (r["key"].as_str().unwrap().to_string(), r["value"].clone())).collect()
}

#[tokio::test]
async fn a_query_registers_once_per_name_and_a_new_hash_needs_a_reset() {
    let b = Broker::start().await;
    let (status, r) = register(&b, "totals", "h1", false).await;
    assert_eq!((status, r["success"].clone(), r["fresh"].clone(), r["reset"].clone()), (200, json!(true), json!(true), json!(false)));
    let id = r["query_id"].as_str().unwrap().to_string();
    let (_, again) = register(&b, "totals", "h1", false).await;
    assert_eq!((again["fresh"].clone(), again["query_id"].clone()), (json!(false), json!(id)), "the id is stable for the name");
    let (status, other) = register(&b, "totals", "h2", false).await;
    assert_eq!((status, other["success"].clone()), (409, json!(false)));
    // The clients match on "config_hash mismatch" (issue 44 §3); both hashes are named.
    let error = other["error"].as_str().unwrap();
    assert!(error.starts_with("config_hash mismatch") && error.contains("\"h1\"") && error.contains("\"h2\""), "{other}");

    // Some progress: a cursor and a state row.
    b.push_to("src", "p", &[json!(1), json!(2)]).await;
    let (pid, lease, txns) = leased(&b, "streams.totals", 1).await;
    let (_, c) = b
        .post("/streams/v1/cycle", json!({"query_id": id, "partition_id": pid, "consumer_group": "streams.totals",
            "state_ops": [{"type": "upsert", "key": "sum", "value": 1}], "push_items": [],
            "ack": {"transactionId": txns[0], "leaseId": lease, "status": "completed", "count": 1}, "release_lease": true}))
        .await;
    assert_eq!(c["success"], true, "{c}");
    assert_eq!(b.cursor(&pid, "streams.totals").await.0, 0);
    // A reset with the new hash: state and the default group's cursors go.
    let (status, reset) = register(&b, "totals", "h2", true).await;
    assert_eq!((status, reset["reset"].clone(), reset["query_id"].clone(), reset["config_hash"].clone()), (200, json!(true), json!(id), json!("h2")));
    assert!(state(&b, &id, &pid, json!({})).await.is_empty());
    let (_, _, again) = leased(&b, "streams.totals", 2).await;
    assert_eq!(again.len(), 2, "the stream reads its source from the start again");
    let (status, bad) = b.post("/streams/v1/queries", json!({"name": "x", "config_hash": "h"})).await;
    assert_eq!((status, bad["error"].clone()), (400, json!("source_queue: required, a non-empty string")));
}

#[tokio::test]
async fn a_cycle_commits_state_pushes_and_ack_together_and_state_reads_filter() {
    let b = Broker::start().await;
    let (_, r) = register(&b, "win", "h", false).await;
    let q = r["query_id"].as_str().unwrap().to_string();
    b.push_to("src", "p", &[json!({"v": 1}), json!({"v": 2}), json!({"v": 3})]).await;
    let (pid, lease, txns) = leased(&b, "streams.win", 3).await;
    let (status, c) = b
        .post("/streams/v1/cycle", json!({"query_id": q, "partition_id": pid, "consumer_group": "streams.win",
            "state_ops": [
                {"type": "upsert", "key": "tumb:10\u{1f}a\u{1f}w1", "value": {"acc": 3, "windowStart": 0, "windowEnd": 10_000}},
                {"type": "upsert", "key": "tumb:10\u{1f}a\u{1f}w2", "value": {"acc": 4, "windowStart": 10_000, "windowEnd": 20_000}},
                {"type": "upsert", "key": "other", "value": {"n": 1}},
                {"type": "upsert", "key": "gone", "value": 1},
                {"type": "delete", "key": "gone"}],
            "push_items": [{"queue": "sink", "partition": "p", "payload": {"sum": 6}}],
            "ack": {"transactionId": txns[2], "leaseId": lease, "status": "completed", "count": 3}, "release_lease": true}))
        .await;
    assert_eq!((status, c["success"].clone(), c["state_ops_applied"].clone()), (200, json!(true), json!(5)), "{c}");
    assert_eq!(c["push_results"][0]["queueName"], "sink");
    assert_eq!(c["ack_result"]["leaseReleased"], true);
    assert_eq!(b.cursor(&pid, "streams.win").await, (2, None, 0), "the ack of the last message commits the batch");
    let sink = stored_messages(&b.sql().await, "sink", "p").await;
    assert_eq!((sink.len(), sink[0].payload.as_str()), (1, "{\"sum\":6}"));
    let keys = |rows: Vec<(String, Value)>| rows.into_iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(keys(state(&b, &q, &pid, json!({})).await), ["other", "tumb:10\u{1f}a\u{1f}w1", "tumb:10\u{1f}a\u{1f}w2"], "the later delete won");
    assert_eq!(keys(state(&b, &q, &pid, json!({"keys": ["other", "nope"]})).await), ["other"]);
    assert_eq!(keys(state(&b, &q, &pid, json!({"key_prefix": "tumb:10\u{1f}", "ripe_at_or_before": 15_000})).await), ["tumb:10\u{1f}a\u{1f}w1"]);
    let w2 = state(&b, &q, &pid, json!({"key_prefix": "tumb:10\u{1f}", "ripe_at_or_before": 20_000})).await;
    assert_eq!(w2[1].1, json!({"acc": 4, "windowStart": 10_000, "windowEnd": 20_000}));
    // A flush cycle: no ack, the window's row deleted, its result pushed.
    let (_, f) = b
        .post("/streams/v1/cycle", json!({"query_id": q, "partition_id": pid, "consumer_group": "streams.win",
            "state_ops": [{"type": "delete", "key": "tumb:10\u{1f}a\u{1f}w1"}],
            "push_items": [{"queue": "sink", "partition": "p", "payload": {"window": 1}}], "ack": null}))
        .await;
    assert_eq!(f["success"], true, "{f}");
    assert_eq!(state(&b, &q, &pid, json!({"ripe_at_or_before": 15_000})).await.len(), 0);
}

#[tokio::test]
async fn a_refused_cycle_changes_nothing() {
    let b = Broker::start().await;
    let (_, r) = register(&b, "safe", "h", false).await;
    let q = r["query_id"].as_str().unwrap().to_string();
    b.push_to("src", "p", &[json!(1)]).await;
    b.post("/api/v1/push", json!({"items": [{"queue": "sink", "partition": "p", "payload": "taken", "transactionId": "dup"}]})).await;
    let (pid, lease, txns) = leased(&b, "streams.safe", 1).await;
    let cycle = |lease: &str, txn: Option<&str>| {
        json!({"query_id": q, "partition_id": pid, "consumer_group": "streams.safe",
               "state_ops": [{"type": "upsert", "key": "k", "value": 1}],
               "push_items": [{"queue": "sink", "partition": "p", "payload": "out", "transactionId": txn}],
               "ack": {"transactionId": txns[0], "leaseId": lease, "status": "completed", "count": 1}})
    };
    // A lease that is not the batch's (expired, taken over): refused whole.
    let (status, stale) = b.post("/streams/v1/cycle", cycle("not-the-lease", None)).await;
    assert_eq!((status, stale["success"].clone()), (200, json!(false)), "{stale}");
    assert!(stale["error"].as_str().unwrap().contains("nothing was applied"));
    // A push that fails (its transactionId is already in the sink): refused whole.
    let (_, dup) = b.post("/streams/v1/cycle", cycle(&lease, Some("dup"))).await;
    assert_eq!(dup["success"], false, "{dup}");
    assert!(dup["error"].as_str().unwrap().contains("QDUP"));
    assert_eq!(b.cursor(&pid, "streams.safe").await.0, -1, "the cursor did not move");
    assert!(state(&b, &q, &pid, json!({})).await.is_empty(), "no state was written");
    assert_eq!(stored_messages(&b.sql().await, "sink", "p").await.len(), 1, "nothing was pushed");
    // An unknown query, bad bodies.
    let (_, unknown) = b.post("/streams/v1/cycle", json!({"query_id": uuid::Uuid::now_v7(), "partition_id": pid, "consumer_group": "g"})).await;
    assert_eq!(unknown["success"], false);
    for (body, error) in [
        (json!({"query_id": "x", "partition_id": pid, "consumer_group": "g"}), "query_id: must be the id the registration answered"),
        (json!({"query_id": q, "partition_id": "abc", "consumer_group": "g"}), "partition_id: required, a partition id as the pop answered it"),
        (json!({"query_id": q, "partition_id": pid, "consumer_group": "g", "state_ops": [{"type": "merge", "key": "k"}]}), "state_ops[0].type: must be upsert or delete"),
        (json!({"query_id": q, "partition_id": pid, "consumer_group": "g", "push_items": [{"partition": "p", "payload": 1}]}), "push_items[0].queue: required, a string"),
        // A transactionId ends in a frame: push's 1024-byte bound holds here too (issue 45).
        (json!({"query_id": q, "partition_id": pid, "consumer_group": "g", "push_items": [{"queue": "sink", "payload": 1, "transactionId": "t".repeat(70_000)}]}),
         "push_items[0].transactionId: longer than 1024 bytes"),
        (json!({"query_id": q, "partition_id": pid, "consumer_group": "g", "push_items": [{"queue": "sink", "payload": 1, "transactionId": "t".repeat(1025)}]}),
         "push_items[0].transactionId: longer than 1024 bytes"),
        (json!({"query_id": q, "partition_id": pid, "consumer_group": "g", "push_items": [{"queue": "sink", "payload": 1, "transactionId": 7}]}),
         "push_items[0].transactionId: must be a string"),
    ] {
        let (status, r) = b.post("/streams/v1/cycle", body).await;
        assert_eq!((status, r["error"].as_str().unwrap()), (400, error));
    }
    // The right lease and a fresh push: committed.
    let (_, ok) = b.post("/streams/v1/cycle", cycle(&lease, None)).await;
    assert_eq!(ok["success"], true, "{ok}");
}

#[tokio::test]
async fn a_kill_mid_stream_leaves_no_half_cycle() {
    let mut b = Broker::start().await;
    let (_, r) = register(&b, "count", "h", false).await;
    let q = r["query_id"].as_str().unwrap().to_string();
    // Ten partitions of 40 messages; a worker per partition runs one cycle
    // per message: count += 1, one sink push, ack.
    for p in 0..10 {
        let payloads: Vec<Value> = (0..40).map(|i| json!(i)).collect();
        b.push_to("src", &format!("p{p}"), &payloads).await;
    }
    let mut workers = Vec::new();
    for p in 0..10 {
        let (http, url, q) = (b.http.clone(), b.url.clone(), q.clone());
        workers.push(tokio::spawn(async move {
            let mut count = 0;
            for _ in 0..40 {
                let Ok(r) = http.get(format!("{url}/api/v1/pop/queue/src/partition/p{p}?consumerGroup=streams.count&batch=1&wait=false")).send().await else { return };
                let Ok(body) = r.json::<Value>().await else { return };
                let Some(m) = body["messages"].as_array().and_then(|m| m.first()).cloned() else { return };
                let cycle = json!({"query_id": q, "partition_id": m["partitionId"], "consumer_group": "streams.count",
                    "state_ops": [{"type": "upsert", "key": "count", "value": count + 1}],
                    "push_items": [{"queue": "sink", "partition": format!("p{p}"), "payload": count}],
                    "ack": {"transactionId": m["transactionId"], "leaseId": body["leaseId"], "status": "completed", "count": 1}});
                let Ok(r) = http.post(format!("{url}/streams/v1/cycle")).json(&cycle).send().await else { return };
                match r.json::<Value>().await {
                    Ok(v) if v["success"] == true => count += 1,
                    _ => return,
                }
            }
        }));
    }
    let sql = b.sql().await;
    eventually("cycles are committing", Duration::from_secs(20), || async {
        sql.query_one("SELECT count(*) FROM queen.stream_state", &[]).await.unwrap().get::<_, i64>(0) >= 5
    })
    .await;
    b.kill();
    for w in workers {
        let _ = w.await;
    }
    // Per partition: state, sink and cursor all tell the same count.
    for p in 0..10 {
        let name = format!("p{p}");
        let row = sql
            .query_opt(
                "SELECT s.value::text, p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                 LEFT JOIN queen.stream_state s ON s.partition_id = p.id AND s.key = 'count'
                 WHERE q.name = 'src' AND p.name = $1",
                &[&name],
            )
            .await
            .unwrap()
            .unwrap();
        let count: i64 = row.get::<_, Option<String>>(0).map_or(0, |v| v.parse().unwrap());
        let pid: i64 = row.get(1);
        let sink = stored_messages(&sql, "sink", &name).await.len() as i64;
        let committed: i64 = sql
            .query_opt("SELECT committed FROM queen.consumers WHERE partition_id = $1 AND consumer_group = 'streams.count'", &[&pid])
            .await
            .unwrap()
            .map_or(-1, |r| r.get(0));
        assert_eq!((count, sink, committed + 1), (count, count, count), "partition {name}: state {count}, sink {sink}, cursor {committed}");
    }
}

#[tokio::test]
async fn a_sink_consumer_sees_every_cycle_push_as_it_lands() {
    let b = Broker::start().await;
    let (_, r) = register(&b, "feed", "h", false).await;
    let q = r["query_id"].as_str().unwrap().to_string();
    b.push_to("src", "p", &[json!(1)]).await;
    let (pid, _, _) = leased(&b, "streams.feed", 1).await;
    for n in 0..3 {
        let (_, c) = b
            .post("/streams/v1/cycle", json!({"query_id": q, "partition_id": pid, "consumer_group": "streams.feed",
                "push_items": [{"queue": "sink", "partition": "p", "payload": {"n": n}}], "ack": null}))
            .await;
        assert_eq!(c["success"], true, "{c}");
        let got = b.pop("/api/v1/pop/queue/sink?batch=100&wait=false&autoAck=true").await;
        assert_eq!(got.data(), [json!({"n": n})], "cycle {n}'s push is delivered to the sink's consumer");
    }
}

/// Issue 44 §3: per-partition state is exactly isolated and every committed
/// cycle applies all of its state ops, with many partitions' cycles running
/// at once. Eight workers pop the source as the streams runtime does (leased
/// batches of up to four partitions under one lease), read each partition's
/// state, add their events to it and commit one cycle per partition (the
/// state upsert with the ack of that partition's last message). Each of 24
/// partitions ends with exactly its own 6 events counted and summed.
#[tokio::test]
async fn concurrent_cycles_of_many_partitions_keep_each_partitions_state_exact() {
    let b = Broker::start().await;
    let (_, r) = register(&b, "per-customer", "h", false).await;
    let id = r["query_id"].as_str().unwrap().to_string();
    let group = "streams.per-customer";
    let (parts, per) = (24usize, 6usize);
    let value = |p: usize, i: usize| (200 + i + 10 * p) as i64;
    for i in 0..per {
        for p in 0..parts {
            let item = json!({"queue": "src", "partition": format!("c{p}"), "payload": {"p": p, "v": value(p, i)}});
            assert_eq!(b.post("/api/v1/push", json!({"items": [item]})).await.0, 201);
        }
    }
    let worker = |w: usize| {
        let (b, id) = (&b, id.clone());
        async move {
            let mut idle = 0;
            let mut cycles = 0;
            while idle < 20 {
                let popped = b.pop(&format!("/api/v1/pop/queue/src?consumerGroup={group}&batch=2&partitions=4&wait=false")).await;
                let Some(body) = popped.body else {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                idle = 0;
                let mut by_partition: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
                for m in body["messages"].as_array().unwrap() {
                    by_partition.entry(m["partitionId"].as_str().unwrap().to_string()).or_default().push(m.clone());
                }
                for (pid, msgs) in by_partition {
                    let rows = state(b, &id, &pid, json!({"keys": ["agg"]})).await;
                    let (mut count, mut sum) = rows.first().map_or((0, 0), |(_, v)| (v["count"].as_i64().unwrap(), v["sum"].as_i64().unwrap()));
                    for m in &msgs {
                        count += 1;
                        sum += m["data"]["v"].as_i64().unwrap();
                    }
                    let last = msgs.last().unwrap();
                    let lease = last["leaseId"].as_str().or(body["leaseId"].as_str()).unwrap();
                    let (status, c) = b
                        .post("/streams/v1/cycle", json!({"query_id": id, "partition_id": pid, "consumer_group": group,
                            "state_ops": [{"type": "upsert", "key": "agg", "value": {"count": count, "sum": sum, "by": w}}],
                            "push_items": [], "ack": {"transactionId": last["transactionId"], "leaseId": lease, "status": "completed"},
                            "release_lease": true}))
                        .await;
                    assert_eq!((status, c["success"].clone()), (200, json!(true)), "worker {w}: {c}");
                    assert_eq!(c["state_ops_applied"], 1);
                    cycles += 1;
                }
            }
            cycles
        }
    };
    let cycles: usize = futures_util::future::join_all((0..8).map(worker)).await.into_iter().sum();
    assert!(cycles >= parts * per / 2, "{cycles} cycles for {} messages", parts * per);
    let sql = b.sql().await;
    let rows = sql
        .query(
            "SELECT p.name, s.value->>'count', s.value->>'sum' FROM queen.stream_state s JOIN queen.partitions p ON p.id = s.partition_id
             WHERE s.key = 'agg' ORDER BY p.name",
            &[],
        )
        .await
        .unwrap();
    let got: std::collections::BTreeMap<String, (i64, i64)> =
        rows.iter().map(|r| (r.get(0), (r.get::<_, String>(1).parse().unwrap(), r.get::<_, String>(2).parse().unwrap()))).collect();
    let want: std::collections::BTreeMap<String, (i64, i64)> =
        (0..parts).map(|p| (format!("c{p}"), (per as i64, (0..per).map(|i| value(p, i)).sum()))).collect();
    assert_eq!(got, want, "every partition's aggregate holds exactly its own events");
    let pending: i64 = sql
        .query_one("SELECT count(*) FROM queen.consumers WHERE consumer_group = $1 AND committed <> 5", &[&group])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pending, 0, "every cursor is past its partition's sixth event");
}
