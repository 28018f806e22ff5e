//! Crash safety (issue 8, item 1): producers and consumers run while the
//! broker is killed with SIGKILL ten times and restarted. Nothing answered
//! 201 is lost, offsets stay gap-free, no cursor moves backwards, and no
//! partition stays leased once its lease has expired.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cluster, stored_messages, Broker};
use serde_json::{json, Value};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_kills_lose_nothing_that_was_acknowledged() {
    let c = cluster();
    let db = c.create_db().await;
    let port = free_port().to_string();
    let env = vec![("QUEEN_DATABASE_URL".to_string(), c.url(&db)), ("PORT".to_string(), port.clone())];
    let mut broker = Broker::spawn(db.clone(), env).await;
    let url = format!("http://127.0.0.1:{port}");
    assert_eq!(broker.url, url, "restarts keep the port, so clients keep their URL");

    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged: Arc<Mutex<HashSet<String>>> = Arc::default();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let mut tasks = Vec::new();
    for producer in 0..4 {
        let (stop, acknowledged, http, url) = (stop.clone(), acknowledged.clone(), http.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) && n < 100_000 {
                let items: Vec<Value> = (0..5)
                    .map(|i| json!({"queue": "crash", "partition": format!("p{}", (n + i) % 8), "payload": n + i,
                                    "transactionId": format!("{producer}-{}", n + i)}))
                    .collect();
                if let Ok(r) = http.post(format!("{url}/api/v1/push")).json(&json!({ "items": items })).send().await {
                    if r.status().as_u16() == 201 {
                        if let Ok(body) = r.json::<Value>().await {
                            let mut a = acknowledged.lock().unwrap();
                            for item in body.as_array().unwrap() {
                                a.insert(item["transactionId"].as_str().unwrap().to_string());
                            }
                        }
                    }
                }
                n += 5;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // Consumers: two take batches of 20 over two partitions, four take one
    // message at a time (the clients' default), so that acks of different
    // consumers share commits (ack::share) when the broker is killed, and
    // eight more long-poll one message at a time: with more workers than
    // partitions some are parked, and acks hand partitions to them
    // (pop::handover) while the broker is killed.
    let committed_acks: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    for consumer in 0..14 {
        let (stop, http, url, committed_acks) = (stop.clone(), http.clone(), url.clone(), committed_acks.clone());
        let pop = match consumer {
            0..2 => "batch=20&partitions=2",
            2..6 => "batch=1",
            _ => "batch=1&wait=true&timeout=300",
        };
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let Ok(r) = http.get(format!("{url}/api/v1/pop/queue/crash?{pop}&consumerGroup=workers&leaseSeconds=2")).send().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                if r.status().as_u16() != 200 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let Ok(body) = r.json::<Value>().await else { continue };
                let acks: Vec<Value> = body["messages"].as_array().unwrap().iter()
                    .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed", "leaseId": body["leaseId"]}))
                    .collect();
                let Ok(r) = http.post(format!("{url}/api/v1/ack/batch")).json(&json!({"acknowledgments": acks, "consumerGroup": "workers"})).send().await else {
                    continue;
                };
                // An ack answered success is committed: it survives the kill.
                if let (200, Ok(answers)) = (r.status().as_u16(), r.json::<Value>().await) {
                    let mut c = committed_acks.lock().unwrap();
                    for (ack, answer) in acks.iter().zip(answers.as_array().unwrap()) {
                        if answer["success"] == true {
                            c.push((ack["partitionId"].as_str().unwrap().to_string(), ack["transactionId"].as_str().unwrap().to_string()));
                        }
                    }
                }
            }
        }));
    }
    // Watches every cursor: committed never moves backwards.
    let backwards: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let (stop, backwards, db) = (stop.clone(), backwards.clone(), db.clone());
        tasks.push(tokio::spawn(async move {
            let sql = cluster().connect(&db).await;
            let mut last: HashMap<(i64, String), i64> = HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                if let Ok(rows) = sql.query("SELECT partition_id, consumer_group, committed FROM queen.consumers", &[]).await {
                    for r in rows {
                        let key = (r.get::<_, i64>(0), r.get::<_, String>(1));
                        let now: i64 = r.get(2);
                        if let Some(prev) = last.insert(key.clone(), now) {
                            if now < prev {
                                backwards.lock().unwrap().push(format!("{key:?}: {prev} -> {now}"));
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut handovers = 0.0;
    for _ in 0..10 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(300 + seed % 500)).await;
        handovers += common::sample(&broker.prometheus().await, "queen_pop_handovers_total").unwrap_or(0.0);
        broker.restart().await; // SIGKILL, then a fresh process on the same port and database
    }
    assert!(handovers > 0.0, "no ack handed a partition to a parked pop: the kills never met a handover");
    eprintln!("{handovers} handovers across 10 kills");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(backwards.lock().unwrap().is_empty(), "cursors moved backwards: {:?}", backwards.lock().unwrap());
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(acknowledged.len() > 100, "the run pushed too little to mean anything: {}", acknowledged.len());
    eprintln!("{} pushes acknowledged across 10 kills", acknowledged.len());

    // Offsets are gap-free and every acknowledged push is stored exactly once.
    let sql = broker.sql().await;
    let mut stored = HashSet::new();
    for p in 0..8 {
        let msgs = stored_messages(&sql, "crash", &format!("p{p}")).await;
        let offsets: Vec<i64> = msgs.iter().map(|m| m.offset).collect();
        assert_eq!(offsets, (0..msgs.len() as i64).collect::<Vec<_>>(), "p{p} has gaps");
        let last: i64 = sql
            .query_one("SELECT p.last_offset FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'crash' AND p.name = $1", &[&format!("p{p}")])
            .await
            .map(|r| r.get(0))
            .unwrap_or(-1);
        assert_eq!(last + 1, msgs.len() as i64, "p{p}: last_offset matches the stored messages");
        for m in msgs {
            assert!(stored.insert(m.transaction_id.clone()), "{} stored twice", m.transaction_id);
        }
    }
    let lost: Vec<&String> = acknowledged.difference(&stored).collect();
    assert!(lost.is_empty(), "answered 201 but not stored: {lost:?}");

    // Every ack answered success is in its cursor (before the drain below
    // moves them all).
    let committed_acks = committed_acks.lock().unwrap().clone();
    assert!(committed_acks.len() > 100, "the run acked too little to mean anything: {}", committed_acks.len());
    let mut offsets: HashMap<String, (String, i64)> = HashMap::new();
    for p in 0..8 {
        for m in stored_messages(&sql, "crash", &format!("p{p}")).await {
            offsets.insert(m.transaction_id, (format!("p{p}"), m.offset));
        }
    }
    for (pid, txn) in &committed_acks {
        let committed: i64 = sql
            .query_one("SELECT committed FROM queen.consumers WHERE partition_id = $1::text::bigint AND consumer_group = 'workers'", &[pid])
            .await
            .unwrap()
            .get(0);
        let (partition, offset) = &offsets[txn];
        assert!(committed >= *offset, "{txn} ({partition}, offset {offset}) acked with success, cursor at {committed}");
    }
    eprintln!("{} acks answered success across 10 kills", committed_acks.len());

    // Once the leases have expired, the workers can drain everything: nothing is stuck leased.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let mut drained = 0;
    for _ in 0..400 {
        let r = broker.pop("/api/v1/pop/queue/crash?batch=200&partitions=0&consumerGroup=workers&autoAck=true").await;
        if r.status == 204 {
            break;
        }
        drained += r.messages().len();
    }
    let (_, depth) = broker.get("/api/v1/resources/queues/crash/depth?group=workers").await;
    assert_eq!(depth["pending"], 0, "drained {drained}, still pending: {depth}");
    // And a fresh group sees every acknowledged message.
    let mut audit = HashSet::new();
    for _ in 0..400 {
        let r = broker.pop("/api/v1/pop/queue/crash?batch=500&partitions=0&consumerGroup=audit&autoAck=true").await;
        if r.status == 204 {
            break;
        }
        audit.extend(r.messages().iter().map(|m| m["transactionId"].as_str().unwrap().to_string()));
    }
    assert!(acknowledged.is_subset(&audit), "{} acknowledged messages not delivered", acknowledged.difference(&audit).count());
}
