//! Brokers that know about each other (issue 32 §1), with several broker
//! processes on one database: a push through one wakes a long-poll parked on
//! another at once; with the hints dropped the long-poll still gets the
//! message, at its hot-list's next reseed; the brokers list each other;
//! switches hold everywhere within a second; and three brokers under load
//! deliver everything once and in order through a `kill -9` of one of them
//! and its rejoin (issue 32 §2).

mod common;

use std::time::{Duration, Instant};

use common::{cluster, eventually, Broker};
use serde_json::{json, Value};

/// A broker on `db` with `env` besides the database URL.
async fn broker_on(db: &str, env: &[(&str, &str)]) -> Broker {
    let mut all = vec![("QUEEN_DATABASE_URL".to_string(), cluster().url(db))];
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Broker::spawn(db.to_string(), all).await
}

/// Parks a pop of `queue` on `b` (up to 20 s), pushes one message through
/// `a` once it is parked, and answers how long after the push's answer the
/// pop answered, with what it got.
async fn wake_across(a: &Broker, b: &Broker, queue: &str) -> (Duration, Value) {
    let pop = {
        let (http, url) = (b.http.clone(), b.url.clone());
        let path = format!("{url}/api/v1/pop/queue/{queue}?wait=true&timeout=20000&autoAck=true");
        tokio::spawn(async move {
            let r = http.get(&path).send().await.unwrap();
            let answered = Instant::now();
            (answered, r.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    // Parked (its first re-check is seconds away in these tests).
    b.until_parked(1).await;
    let (status, _) = a.post("/api/v1/push", json!({"items": [{"queue": queue, "partition": "p", "payload": {"n": 1}}]})).await;
    assert_eq!(status, 201);
    let pushed = Instant::now();
    let (answered, body) = pop.await.unwrap();
    (answered.saturating_duration_since(pushed), body)
}

#[tokio::test]
async fn a_push_through_one_broker_wakes_a_long_poll_parked_on_another_at_once() {
    let db = cluster().create_db().await;
    // B re-checks its parked pops only every 5 s: only a hint wakes it sooner.
    let slow = [("POP_WAIT_INITIAL_INTERVAL_MS", "5000"), ("POP_WAIT_MAX_INTERVAL_MS", "5000")];
    let a = broker_on(&db, &[]).await;
    let b = broker_on(&db, &slow).await;
    // Both have joined the channel.
    eventually("two live brokers", Duration::from_secs(10), || async { a.get("/api/v1/system/brokers").await.1["live"] == 2 }).await;
    // First contact creates the queue on both sides.
    a.post("/api/v1/push", json!({"items": [{"queue": "q", "partition": "p", "payload": {"n": 0}}]})).await;
    b.get("/api/v1/pop/queue/q?autoAck=true").await;
    let (took, body) = wake_across(&a, &b, "q").await;
    assert_eq!(body["messages"][0]["data"]["n"], 1);
    assert!(took < Duration::from_millis(4000), "woken by the hint, not by the 5 s backoff ({took:?})");
}

/// The notifications on the brokers' channel, as a plain listener hears
/// them (a listener is no broker: it is not in `queen.brokers`).
async fn listen(db: &str) -> (tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let (client, mut conn) = tokio_postgres::connect(&cluster().url(db), tokio_postgres::NoTls).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = futures_util::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(serde_json::from_str(n.payload()).unwrap_or(Value::Null));
            }
        }
    });
    client.batch_execute("LISTEN queen_pushes").await.unwrap();
    (client, rx)
}

/// Each notification is a PostgreSQL transaction, and at batch 1 they were
/// most of a push run's commits (issue 46): a broker alone on its database
/// sends none, and starts as soon as another broker says hello.
#[tokio::test]
async fn a_broker_alone_sends_no_hints_and_starts_when_another_joins() {
    let db = cluster().create_db().await;
    let a = broker_on(&db, &[]).await;
    let (_client, mut heard) = listen(&db).await;
    let push = |n: i32| a.post("/api/v1/push", json!({"items": [{"queue": "q", "partition": "p", "payload": {"n": n}}]}));
    for n in 0..20 {
        assert_eq!(push(n).await.0, 201);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await; // a heartbeat and more: time for a hint to leave
    let mut alone = Vec::new();
    while let Ok(v) = heard.try_recv() {
        alone.push(v);
    }
    assert!(alone.iter().all(|v| v["h"].as_array().is_none_or(Vec::is_empty)), "a lone broker hinted its pushes: {alone:?}");
    let b = broker_on(&db, &[]).await;
    let hello = tokio::time::timeout(Duration::from_secs(10), heard.recv()).await.expect("the newcomer says hello").unwrap();
    assert_eq!(hello["h"], json!([]), "{hello}");
    // From now on a's pushes are hinted (b is heard at once; at the latest
    // at a's next heartbeat).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut hinted = false;
    for n in 100.. {
        assert_eq!(push(n).await.0, 201);
        tokio::time::sleep(Duration::from_millis(100)).await;
        while let Ok(v) = heard.try_recv() {
            hinted |= v["b"] != hello["b"] && v["h"].as_array().is_some_and(|h| !h.is_empty());
        }
        if hinted || Instant::now() > deadline {
            break;
        }
    }
    assert!(hinted, "a hinted nothing with b live");
    // b stopped gracefully takes its row with it, so a is alone again at
    // its next heartbeat (not LIVE_WITHIN_SECONDS later) and goes quiet.
    let mut b = b;
    assert_eq!(b.terminate().await, Some(0));
    let sql = a.sql().await;
    let rows: i64 = sql.query_one("SELECT count(*) FROM queen.brokers", &[]).await.unwrap().get(0);
    assert_eq!(rows, 1, "a stopped broker leaves no row behind");
    tokio::time::sleep(Duration::from_millis(1500)).await; // a's next heartbeat
    while heard.try_recv().is_ok() {}
    for n in 1000..1020 {
        assert_eq!(push(n).await.0, 201);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut after = Vec::new();
    while let Ok(v) = heard.try_recv() {
        after.push(v);
    }
    assert!(after.iter().all(|v| v["h"].as_array().is_none_or(Vec::is_empty)), "a hinted after b left: {after:?}");
}

#[tokio::test]
async fn with_the_hints_dropped_a_long_poll_still_gets_the_message_at_its_next_reseed() {
    let db = cluster().create_db().await;
    // What B cannot see itself it learns at its rings' reseed (1 s here).
    let off = [("QUEEN_PEER_HINTS", "false"), ("QUEEN_HOTLIST_RESEED_MS", "1000")];
    let a = broker_on(&db, &off).await;
    let b = broker_on(&db, &off).await;
    a.post("/api/v1/push", json!({"items": [{"queue": "q", "partition": "p", "payload": {"n": 0}}]})).await;
    b.get("/api/v1/pop/queue/q?autoAck=true").await;
    let (took, body) = wake_across(&a, &b, "q").await;
    assert_eq!(body["messages"][0]["data"]["n"], 1);
    assert!(took < Duration::from_secs(10), "by a reseed (1 s here), not the 20 s timeout ({took:?})");
}

#[tokio::test]
async fn the_brokers_list_each_other_and_one_that_stops_leaves_the_list() {
    let db = cluster().create_db().await;
    let a = broker_on(&db, &[("QUEEN_SERVER_ID", "same-host")]).await;
    let mut b = broker_on(&db, &[("QUEEN_SERVER_ID", "same-host")]).await;
    eventually("two live brokers", Duration::from_secs(10), || async { a.get("/api/v1/system/brokers").await.1["live"] == 2 }).await;
    let (status, list) = b.get("/api/v1/system/brokers").await;
    assert_eq!(status, 200);
    let brokers = list["brokers"].as_array().unwrap();
    assert_eq!(brokers.len(), 2);
    assert!(brokers.iter().all(|x| x["serverId"] == "same-host" && x["live"] == true && x["version"].is_string()));
    assert_eq!(brokers.iter().filter(|x| x["self"] == true).count(), 1, "two brokers on one host are still two");
    assert_ne!(brokers[0]["instance"], brokers[1]["instance"]);
    // A broker that stops beating is no longer live (and its row goes after a day).
    b.kill();
    eventually("one live broker", Duration::from_secs(15), || async { a.get("/api/v1/system/brokers").await.1["live"] == 1 }).await;
    let list = a.get("/api/v1/system/brokers").await.1;
    let alive: Vec<&Value> = list["brokers"].as_array().unwrap().iter().filter(|x| x["live"] == true).collect();
    assert_eq!((alive.len(), alive[0]["self"].clone()), (1, json!(true)));
}

#[tokio::test]
async fn a_switch_or_a_queue_setting_changed_through_one_broker_holds_on_the_others_within_a_second() {
    let db = cluster().create_db().await;
    let a = broker_on(&db, &[]).await;
    let b = broker_on(&db, &[]).await;
    eventually("two live brokers", Duration::from_secs(10), || async { a.get("/api/v1/system/brokers").await.1["live"] == 2 }).await;
    let push = |broker: &Broker| {
        let (http, url) = (broker.http.clone(), broker.url.clone());
        async move {
            let r = http.post(format!("{url}/api/v1/push")).json(&json!({"items": [{"queue": "q", "partition": "p", "payload": 1}]})).send().await.unwrap();
            r.json::<Value>().await.unwrap()[0]["status"].as_str().unwrap_or("").to_string()
        }
    };
    assert_eq!(push(&b).await, "queued");
    // Push maintenance through A: B spools.
    let switched = Instant::now();
    assert_eq!(a.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    eventually("B in push maintenance", Duration::from_secs(1), || async { push(&b).await == "buffered" }).await;
    assert!(switched.elapsed() < Duration::from_secs(1));
    a.post("/api/v1/system/maintenance", json!({"enabled": false})).await;
    eventually("B out of push maintenance", Duration::from_secs(1), || async { push(&b).await == "queued" }).await;
    // Pop maintenance through A: B answers 204 with messages waiting.
    a.post("/api/v1/system/maintenance/pop", json!({"enabled": true})).await;
    eventually("B in pop maintenance", Duration::from_secs(1), || async { b.get("/api/v1/system/maintenance/pop").await.1["enabled"] == true }).await;
    assert_eq!(b.pop("/api/v1/pop/queue/q?consumerGroup=g").await.status, 204);
    a.post("/api/v1/system/maintenance/pop", json!({"enabled": false})).await;
    eventually("B out of pop maintenance", Duration::from_secs(1), || async { b.pop("/api/v1/pop/queue/q?consumerGroup=g&autoAck=true").await.status == 200 }).await;
    // The KV switch through A.
    a.post("/api/v1/system/kv-timers", json!({"kv": false})).await;
    eventually("B's KV off", Duration::from_secs(1), || async { b.post("/api/v1/kv", json!({"operations": [{"op": "get", "ns": "n", "key": "k"}]})).await.0 == 503 }).await;
    a.post("/api/v1/system/kv-timers", json!({"kv": true})).await;
    // A queue's settings through A: B delays a new message as configured.
    a.post("/api/v1/configure", json!({"queue": "q", "options": {"delayedProcessing": 30}})).await;
    eventually("B's delayedProcessing", Duration::from_secs(1), || async {
        a.post("/api/v1/push", json!({"items": [{"queue": "q", "partition": "p", "payload": "late"}]})).await;
        b.pop("/api/v1/pop/queue/q?consumerGroup=h&autoAck=true&batch=100").await.data().iter().all(|d| d != "late")
    })
    .await;
}

#[tokio::test]
async fn an_ack_on_one_broker_wakes_a_long_poll_the_lease_held_back_on_another() {
    let db = cluster().create_db().await;
    let a = broker_on(&db, &[]).await;
    let b = broker_on(&db, &[("POP_WAIT_INITIAL_INTERVAL_MS", "5000"), ("POP_WAIT_MAX_INTERVAL_MS", "5000")]).await;
    eventually("two live brokers", Duration::from_secs(10), || async { a.get("/api/v1/system/brokers").await.1["live"] == 2 }).await;
    a.post("/api/v1/push", json!({"items": [{"queue": "q", "partition": "p", "payload": 1}, {"queue": "q", "partition": "p", "payload": 2}]})).await;
    // A consumer on A leases the partition's first message.
    let held = a.pop("/api/v1/pop/queue/q?consumerGroup=g&batch=1").await.body.unwrap();
    // A pop of the same group parks on B: the partition is leased.
    let parked = {
        let (http, url) = (b.http.clone(), format!("{}/api/v1/pop/queue/q?consumerGroup=g&wait=true&timeout=20000&autoAck=true", b.url));
        tokio::spawn(async move {
            let r = http.get(&url).send().await.unwrap();
            (Instant::now(), r.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    b.until_parked(1).await;
    let m = &held["messages"][0];
    let (status, _) = a
        .post("/api/v1/ack", json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": held["leaseId"], "status": "completed", "consumerGroup": "g"}))
        .await;
    assert_eq!(status, 200);
    let acked = Instant::now();
    let (answered, body) = parked.await.unwrap();
    assert_eq!(body["messages"][0]["data"], 2);
    let took = answered.saturating_duration_since(acked);
    assert!(took < Duration::from_millis(4000), "woken by the release hint, not B's 5 s backoff ({took:?})");
}

/// What the consumers of the fault test saw: every delivery, and every
/// batch whose ack the broker confirmed (ticket, partition, payloads in
/// order).
///
/// A batch's ticket is drawn just before its ack is sent. The next batch of
/// a partition can only be popped once this one is committed, so its ack is
/// sent, and its ticket drawn, later: tickets order a partition's batches by
/// commit. The order in which consumers *record* confirmations does not: a
/// consumer woken by another's ack can pop, ack and record before the first
/// one has read its own ack's answer.
#[derive(Default)]
struct Seen {
    delivered: std::collections::HashSet<i64>,
    tickets: u64,
    confirmed: Vec<(u64, String, Vec<i64>)>,
}

#[tokio::test]
async fn three_brokers_deliver_everything_in_order_once_through_a_kill_and_a_rejoin() {
    use std::sync::{Arc, Mutex};
    let db = cluster().create_db().await;
    let a = broker_on(&db, &[]).await;
    let b = broker_on(&db, &[]).await;
    let mut c = broker_on(&db, &[]).await;
    // Short leases: what the killed broker's consumer held comes back soon.
    assert_eq!(a.post("/api/v1/configure", json!({"queue": "work", "options": {"leaseTime": 2}})).await.0, 200);
    // 3,000 messages over 10 partitions, pushed through the three in turn:
    // a third before the consumers start, the rest by two producers (five
    // partitions each) while they run and while C is killed. A producer
    // whose broker fails sends the same request, same transactionIds, to
    // the next one, as the official client fails over between its URLs.
    let (parts, total) = (10i64, 3000i64);
    let body = |ns: &[i64]| {
        let items: Vec<Value> =
            ns.iter().map(|n| json!({"queue": "work", "partition": format!("p{}", n % parts), "payload": n, "transactionId": format!("w{n}")})).collect();
        json!({ "items": items })
    };
    let lane = |k: i64| (0..total).filter(move |n| (n % parts < parts / 2) == (k == 0));
    let early = total / 3;
    for chunk in 0..(early / 50) {
        let ns: Vec<i64> = (chunk * 50..chunk * 50 + 50).collect();
        let via = [&a, &b, &c][(chunk % 3) as usize];
        assert_eq!(via.post("/api/v1/push", body(&ns)).await.0, 201);
    }
    let urls = Arc::new(Mutex::new([a.url.clone(), b.url.clone(), c.url.clone()]));
    let mut producers = Vec::new();
    for k in 0..2 {
        let later: Vec<i64> = lane(k).filter(|n| *n >= early).collect();
        let (urls, bodies) = (urls.clone(), later.chunks(25).map(body).collect::<Vec<_>>());
        producers.push(tokio::spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
            let started = Instant::now();
            for (i, body) in bodies.iter().enumerate() {
                let mut via = i + k as usize;
                loop {
                    assert!(started.elapsed() < Duration::from_secs(60), "a push found no broker");
                    let url = urls.lock().unwrap()[via % 3].clone();
                    match http.post(format!("{url}/api/v1/push")).json(body).send().await {
                        Ok(r) if r.status().as_u16() == 201 => break,
                        _ => via += 1,
                    }
                }
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
        }));
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let c_url = Arc::new(Mutex::new(c.url.clone()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    let mut consumers = Vec::new();
    for url in [Arc::new(Mutex::new(a.url.clone())), Arc::new(Mutex::new(b.url.clone())), c_url.clone()] {
        let (seen, done) = (seen.clone(), done.clone());
        consumers.push(tokio::spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
            while !done.load(std::sync::atomic::Ordering::SeqCst) && started.elapsed() < Duration::from_secs(60) {
                let base = url.lock().unwrap().clone();
                let Ok(r) = http.get(format!("{base}/api/v1/pop/queue/work?consumerGroup=g&batch=25&wait=true&timeout=500")).send().await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                if r.status().as_u16() != 200 {
                    continue;
                }
                let Ok(body) = r.json::<Value>().await else { continue };
                let messages = body["messages"].as_array().cloned().unwrap_or_default();
                let ns: Vec<i64> = messages.iter().map(|m| m["data"].as_i64().unwrap()).collect();
                seen.lock().unwrap().delivered.extend(&ns);
                let acks: Vec<Value> = messages
                    .iter()
                    .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": body["leaseId"], "status": "completed"}))
                    .collect();
                let ticket = {
                    let mut s = seen.lock().unwrap();
                    s.tickets += 1;
                    s.tickets
                };
                let Ok(r) = http.post(format!("{base}/api/v1/ack/batch")).json(&json!({"acknowledgments": acks, "consumerGroup": "g"})).send().await else { continue };
                let Ok(results) = r.json::<Value>().await else { continue };
                if results.as_array().is_some_and(|rs| !rs.is_empty() && rs.iter().all(|x| x["success"] == true)) {
                    let partition = messages[0]["partition"].as_str().unwrap().to_string();
                    seen.lock().unwrap().confirmed.push((ticket, partition, ns));
                }
            }
        }));
    }
    // Under load, producers still pushing, kill C (no shutdown of any
    // kind), then bring it back.
    eventually("a third consumed", Duration::from_secs(30), || async { seen.lock().unwrap().delivered.len() >= 800 }).await;
    assert!(producers.iter().all(|p| !p.is_finished()), "the producers still push when C dies");
    c.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.restart().await;
    *c_url.lock().unwrap() = c.url.clone();
    urls.lock().unwrap()[2] = c.url.clone();
    for p in producers {
        p.await.unwrap();
    }
    // Until the group has committed everything: what the killed broker's
    // consumer held comes back when its lease ends.
    let group_lag = || async {
        let cursors = a.get("/api/v1/consumer-groups/g").await.1;
        cursors["work"]["partitions"].as_array().map(|ps| ps.iter().map(|p| p["offsetLag"].as_i64().unwrap()).sum::<i64>())
    };
    eventually("the group to commit everything", Duration::from_secs(45), || async { group_lag().await == Some(0) }).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in consumers {
        t.await.unwrap();
    }
    // The restarted broker rejoined without a manual step: a push through A
    // reaches a long-poll parked on it.
    let (took, body) = wake_across(&a, &c, "rejoin").await;
    assert_eq!(body["messages"][0]["data"]["n"], 1);
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Stored once each: a push retried on another broker after its first
    // broker died was caught by its transactionId.
    let stored: i64 = a.sql().await.query_one("SELECT sum(p.last_offset + 1)::bigint FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'work'", &[]).await.unwrap().get(0);
    assert_eq!(stored, total, "every message stored once");
    let mut s = seen.lock().unwrap();
    assert_eq!(s.delivered.len(), total as usize, "every message delivered");
    s.confirmed.sort_by_key(|(ticket, _, _)| *ticket);
    // Nothing committed twice: no message in two confirmed acks.
    let mut committed = std::collections::HashSet::new();
    for (_, _, ns) in &s.confirmed {
        for n in ns {
            assert!(committed.insert(*n), "message {n} was committed twice");
        }
    }
    // In order per partition: each confirmed batch is ascending, and a
    // partition's confirmed batches, in commit order, follow each other.
    let mut last: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for (_, p, ns) in &s.confirmed {
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "a batch out of order: {ns:?}");
        let prev = last.insert(p.as_str(), *ns.last().unwrap()).unwrap_or(-1);
        assert!(ns[0] > prev, "partition {p}: a batch starting at {} after one ending at {prev}", ns[0]);
    }
}
