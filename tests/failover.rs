//! A PostgreSQL failover under load (issue 32 §3): a primary and a streaming
//! standby built on this machine (`initdb`, `pg_basebackup -R`), a broker
//! given both hosts, producers and consumers running, the primary killed
//! with `kill -9` (its postmaster and every backend, as a crashed machine
//! would), the standby promoted. With a synchronous standby nothing answered
//! 201 is lost and nothing is stored twice; with an asynchronous one the test
//! counts what the replication lag cost. Both print the time from the kill to
//! the first push written to the new primary.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, stored_messages, Broker};
use queen::embedded_pg::{as_postgres, find_bindir, hand_to_postgres, initdb, run};
use serde_json::{json, Value};

/// One PostgreSQL server of the pair, on a unix socket in its own directory.
struct Node {
    dir: PathBuf,
    bindir: PathBuf,
}

impl Node {
    fn new(prefix: &str) -> Node {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp").unwrap().keep();
        std::fs::create_dir_all(dir.join("run")).unwrap();
        hand_to_postgres(&dir).unwrap();
        Node { dir, bindir: find_bindir().unwrap() }
    }

    /// A fresh primary, started.
    fn primary() -> Node {
        let n = Node::new("qf-p-");
        initdb(&n.bindir, &n.pgdata(), &["--no-sync"]).unwrap();
        n.start();
        n
    }

    /// A streaming standby of `primary` (`pg_basebackup -R` writes its
    /// `primary_conninfo` and `standby.signal`), started.
    fn standby_of(primary: &Node) -> Node {
        let n = Node::new("qf-s-");
        run(as_postgres(&n.bindir.join("pg_basebackup"))
            .arg("-D")
            .arg(n.pgdata())
            .arg("-h")
            .arg(primary.socket())
            .args(["-p", "5432", "-U", "postgres", "-R", "-X", "stream", "--no-sync", "-c", "fast"]))
        .unwrap();
        n.start();
        n
    }

    fn pgdata(&self) -> PathBuf {
        self.dir.join("pgdata")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("run")
    }

    fn start(&self) {
        let options = format!("-c listen_addresses='' -k {} -p 5432 -c max_connections=200 -c TimeZone=UTC", self.socket().display());
        run(as_postgres(&self.bindir.join("pg_ctl"))
            .arg("start")
            .arg("-D")
            .arg(self.pgdata())
            .args(["-w", "-t", "60", "-s", "-l"])
            .arg(self.dir.join("pg.log"))
            .arg("-o")
            .arg(options))
        .unwrap();
    }

    /// The machine dies: the postmaster is frozen so it cannot clean up,
    /// every backend is killed, then the postmaster.
    fn kill9(&self) {
        let pid_file = std::fs::read_to_string(self.pgdata().join("postmaster.pid")).unwrap();
        let pid = pid_file.lines().next().unwrap().trim().to_string();
        run(std::process::Command::new("kill").args(["-STOP", &pid])).unwrap();
        let _ = std::process::Command::new("pkill").args(["-9", "-P", &pid]).status();
        run(std::process::Command::new("kill").args(["-9", &pid])).unwrap();
    }

    fn promote(&self) {
        run(as_postgres(&self.bindir.join("pg_ctl")).arg("promote").arg("-D").arg(self.pgdata()).args(["-w", "-s"])).unwrap();
    }

    async fn sql(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&format!("host={} port=5432 user=postgres dbname=postgres", self.socket().display()), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bindir.join("pg_ctl")).arg("stop").arg("-D").arg(self.pgdata()).args(["-m", "immediate", "-s"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the producers and consumers saw.
#[derive(Default)]
struct Seen {
    /// Every transactionId answered 201, with the answer's status and when
    /// the request that got that answer was sent (a commit it reports
    /// happened after that; the answer itself can arrive late on a loaded
    /// machine, so it says nothing about when the commit was).
    answered: Vec<(String, String, Instant)>,
    /// The first push written to PostgreSQL (`queued`) after the promotion.
    first_written_after_promotion: Option<Instant>,
    /// transactionIds a consumer's ack was confirmed for, and when.
    acked: Vec<(String, Instant)>,
    /// (transactionId, when) of every delivery.
    delivered: Vec<(String, Instant)>,
    /// Every pop or ack answer that was neither a success nor a 204:
    /// (status, the JSON `code`).
    refusals: Vec<(u16, Value)>,
}

const PARTITIONS: usize = 4;

/// The scenario; returns what was seen and the two nodes' roles' timings.
struct Run {
    seen: Seen,
    killed_at: Instant,
    promoted_at: Instant,
    cursors_before: HashMap<String, i64>,
    new_primary: tokio_postgres::Client,
    broker: Broker,
    _nodes: (Node, Node),
}

async fn fail_over(synchronous: bool) -> Run {
    let primary = Node::primary();
    let standby = Node::standby_of(&primary);
    let p = primary.sql().await;
    eventually("the standby streams", Duration::from_secs(30), || async {
        p.query_one("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'", &[]).await.unwrap().get::<_, i64>(0) == 1
    })
    .await;
    if synchronous {
        p.batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'").await.unwrap();
        p.batch_execute("SELECT pg_reload_conf()").await.unwrap();
        eventually("the standby is synchronous", Duration::from_secs(30), || async {
            p.query_one("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'", &[]).await.unwrap().get::<_, i64>(0) == 1
        })
        .await;
    }
    // Both hosts, no target_session_attrs: the broker implies read-write.
    let url = format!("host={},{} port=5432 user=postgres dbname=postgres", primary.socket().display(), standby.socket().display());
    let broker = Broker::spawn("postgres".into(), vec![
        ("QUEEN_DATABASE_URL".into(), url),
        ("DB_CONNECTION_TIMEOUT".into(), "500".into()),
    ])
    .await;
    assert_eq!(broker.get("/health").await.0, 200);
    // A broker given the standby alone reports it: reachable, read-only.
    let watcher = Broker::spawn("postgres".into(), vec![
        ("QUEEN_DATABASE_URL".into(), format!("host={} port=5432 user=postgres dbname=postgres", standby.socket().display())),
        ("QUEEN_APPLY_SCHEMA".into(), "false".into()),
    ])
    .await;
    let (status, body) = watcher.get("/health").await;
    assert_eq!((status, &body["database"]), (503, &json!("read-only")), "{body}");

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop_producing = Arc::new(AtomicBool::new(false));
    let stop_consuming = Arc::new(AtomicBool::new(false));
    let promoted: Arc<Mutex<Option<Instant>>> = Arc::default();
    let started = Instant::now();
    let mut producers = Vec::new();
    for part in 0..PARTITIONS {
        let (seen, stop, promoted, url) = (seen.clone(), stop_producing.clone(), promoted.clone(), broker.url.clone());
        producers.push(tokio::spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(90) {
                // Ids minted here, as every client does: a retry sends the same.
                let items: Vec<Value> = (0..10)
                    .map(|i| json!({"queue": "orders", "partition": format!("p{part}"), "payload": {"n": n + i},
                                    "transactionId": uuid::Uuid::new_v4().to_string()}))
                    .collect();
                n += 10;
                loop {
                    assert!(started.elapsed() < Duration::from_secs(90), "a push kept failing");
                    let sent = Instant::now();
                    let answer = http.post(format!("{url}/api/v1/push")).json(&json!({ "items": items })).send().await;
                    let Ok(r) = answer else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    if r.status().as_u16() != 201 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    let body: Value = r.json().await.unwrap();
                    let now = Instant::now();
                    let mut s = seen.lock().unwrap();
                    for (item, result) in items.iter().zip(body.as_array().unwrap()) {
                        let status = result["status"].as_str().unwrap().to_string();
                        if status == "queued" && promoted.lock().unwrap().is_some() && s.first_written_after_promotion.is_none() {
                            s.first_written_after_promotion = Some(now);
                        }
                        s.answered.push((item["transactionId"].as_str().unwrap().to_string(), status, sent));
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let (seen, stop, url) = (seen.clone(), stop_consuming.clone(), broker.url.clone());
        consumers.push(tokio::spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
            while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
                // A short lease: with an asynchronous standby an ack can be
                // lost with the lag, and its partition then waits out the
                // lease before it redelivers (the queue's default is a minute,
                // as long as the waits below).
                let r = http.get(format!("{url}/api/v1/pop/queue/orders?consumerGroup=g&batch=20&wait=true&timeout=300&leaseSeconds=10")).send().await;
                let Ok(r) = r else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let status = r.status().as_u16();
                if status != 200 {
                    // 204 (nothing), or 503 while no primary answers.
                    if status != 204 {
                        let code = r.json::<Value>().await.map(|b| b["code"].clone()).unwrap_or(Value::Null);
                        seen.lock().unwrap().refusals.push((status, code));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let body: Value = r.json().await.unwrap();
                let messages = body["messages"].as_array().cloned().unwrap_or_default();
                let now = Instant::now();
                seen.lock().unwrap().delivered.extend(messages.iter().map(|m| (m["transactionId"].as_str().unwrap().to_string(), now)));
                let acks: Vec<Value> = messages
                    .iter()
                    .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": body["leaseId"], "status": "completed"}))
                    .collect();
                // An ack that meets the gap is sent again, as the clients do
                // (5xx and network errors are retried): the lease it names
                // is on the standby too.
                let mut results = Value::Null;
                for _ in 0..100 {
                    let r = http.post(format!("{url}/api/v1/ack/batch")).json(&json!({"acknowledgments": acks, "consumerGroup": "g"})).send().await;
                    match r {
                        Ok(r) if r.status().as_u16() == 200 => {
                            results = r.json().await.unwrap();
                            break;
                        }
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let code = r.json::<Value>().await.map(|b| b["code"].clone()).unwrap_or(Value::Null);
                            seen.lock().unwrap().refusals.push((status, code));
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
                if results.as_array().is_some_and(|rs| rs.len() == messages.len() && rs.iter().all(|x| x["success"] == true)) {
                    let now = Instant::now();
                    seen.lock().unwrap().acked.extend(messages.iter().map(|m| (m["transactionId"].as_str().unwrap().to_string(), now)));
                }
            }
        }));
    }

    // Under load: wait for traffic both ways, note the cursors, kill.
    eventually("traffic before the kill", Duration::from_secs(30), || async {
        let s = seen.lock().unwrap();
        s.answered.len() >= 400 && s.acked.len() >= 100
    })
    .await;
    let cursors_before = cursors(&p).await;
    drop(p);
    primary.kill9();
    // Taken once every process of the old primary is gone: its backends
    // outlive the stopped postmaster by the moments `pkill` takes, and can
    // commit then, so only what is sent after this cannot be there.
    let killed_at = Instant::now();
    // The gap an operator (or a failover manager) takes to decide.
    tokio::time::sleep(Duration::from_secs(1)).await;
    standby.promote();
    let promoted_at = Instant::now();
    *promoted.lock().unwrap() = Some(promoted_at);
    eventually("a push written to the new primary", Duration::from_secs(60), || async {
        seen.lock().unwrap().first_written_after_promotion.is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop_producing.store(true, Ordering::SeqCst);
    for t in producers {
        t.await.unwrap();
    }
    // The spool drains and the group catches up with everything.
    eventually("the spool to drain", Duration::from_secs(60), || async {
        let (status, body) = broker.get("/health").await;
        status == 200 && body["spoolPending"] == false
    })
    .await;
    let new_primary = standby.sql().await;
    eventually("the group to consume everything", Duration::from_secs(60), || async {
        let lag: i64 = new_primary
            .query_one(
                "SELECT coalesce(sum(p.last_offset - coalesce(c.committed, -1)), -1)::bigint FROM queen.partitions p
                 LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = 'g'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        lag == 0
    })
    .await;
    stop_consuming.store(true, Ordering::SeqCst);
    for t in consumers {
        t.await.unwrap();
    }
    // The standby-only broker sees the same host become a primary.
    let (status, body) = watcher.get("/health").await;
    assert_eq!((status, &body["database"]), (200, &json!("connected")), "{body}");
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    Run { seen, killed_at, promoted_at, cursors_before, new_primary, broker, _nodes: (primary, standby) }
}

/// Group g's committed offset per partition name.
async fn cursors(sql: &tokio_postgres::Client) -> HashMap<String, i64> {
    sql.query("SELECT p.name, c.committed FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id WHERE c.consumer_group = 'g'", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// transactionId → how many times it is stored on the new primary.
async fn stored_counts(sql: &tokio_postgres::Client) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for part in 0..PARTITIONS {
        for m in stored_messages(sql, "orders", &format!("p{part}")).await {
            *counts.entry(m.transaction_id).or_insert(0) += 1;
        }
    }
    counts
}

fn report(mode: &str, r: &Run, lost: usize) {
    let first = r.seen.first_written_after_promotion.unwrap();
    let buffered = r.seen.answered.iter().filter(|(_, s, _)| s == "buffered").count();
    println!(
        "FAILOVER {mode}: kill->promote {:?}, promote->first push written {:?}, kill->first push written {:?}; \
         {} pushes answered ({buffered} from the spool), {} acked, {lost} answered-but-lost",
        r.promoted_at - r.killed_at,
        first - r.promoted_at,
        first - r.killed_at,
        r.seen.answered.len(),
        r.seen.acked.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synchronous_standby_takes_over_without_losing_or_doubling_an_answered_push() {
    let r = fail_over(true).await;
    let stored = stored_counts(&r.new_primary).await;
    // Every push answered 201, before, during and after, is stored exactly once.
    for (txn, status, _) in &r.seen.answered {
        assert_eq!(stored.get(txn), Some(&1), "{txn} (answered {status}) is stored once");
    }
    assert!(stored.values().all(|&n| n == 1), "no message stored twice");
    assert_eq!(stored.len(), r.seen.answered.len(), "nothing stored that was not answered");
    assert!(r.seen.answered.iter().any(|(_, s, _)| s == "buffered"), "pushes during the gap were spooled");
    // Consumers resumed on the new primary and consumed everything.
    assert!(r.seen.delivered.iter().any(|(_, at)| *at > r.promoted_at), "deliveries after the promotion");
    let delivered: HashSet<&str> = r.seen.delivered.iter().map(|(t, _)| t.as_str()).collect();
    assert!(r.seen.answered.iter().all(|(t, _, _)| delivered.contains(t.as_str())), "every answered push delivered");
    // Cursors never moved backwards: none is behind where it was before the
    // kill, and nothing acked before the kill was delivered again after it.
    let after = cursors(&r.new_primary).await;
    for (part, before) in &r.cursors_before {
        assert!(after[part] >= *before, "{part}: cursor {before} before the kill, {} after", after[part]);
    }
    let acked_before: HashSet<&str> = r.seen.acked.iter().filter(|(_, at)| *at < r.killed_at).map(|(t, _)| t.as_str()).collect();
    let redelivered: Vec<&str> =
        r.seen.delivered.iter().filter(|(t, at)| *at > r.killed_at && acked_before.contains(t.as_str())).map(|(t, _)| t.as_str()).collect();
    assert!(redelivered.is_empty(), "acked before the kill, delivered again after: {redelivered:?}");
    // What met the gap was told to come back: a 503 naming the outage.
    assert!(!r.seen.refusals.is_empty(), "requests met the gap");
    assert!(r.seen.refusals.iter().all(|(s, c)| *s == 503 && c == "database_unavailable"), "{:?}", r.seen.refusals);
    // The broker reports a primary again, and it is the promoted standby.
    let (status, body) = r.broker.get("/health").await;
    assert_eq!((status, &body["database"]), (200, &json!("connected")));
    report("synchronous", &r, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_asynchronous_standby_takes_over_and_loses_at_most_the_replication_lag() {
    let r = fail_over(false).await;
    let stored = stored_counts(&r.new_primary).await;
    assert!(stored.values().all(|&n| n == 1), "no message stored twice");
    let answered: HashSet<&str> = r.seen.answered.iter().map(|(t, _, _)| t.as_str()).collect();
    assert!(stored.keys().all(|t| answered.contains(t.as_str())), "nothing stored that was not pushed");
    // What the lag can cost: only pushes written (`queued`) on the old
    // primary, so sent before it was dead. Everything sent after it,
    // spooled or written to the new primary, is there.
    let mut lost = 0;
    for (txn, status, sent) in &r.seen.answered {
        if !stored.contains_key(txn) {
            assert!(*sent < r.killed_at && status == "queued", "{txn} sent {:?} after the kill, answered {status}, and lost", sent.saturating_duration_since(r.killed_at));
            lost += 1;
        }
    }
    assert!(r.seen.delivered.iter().any(|(_, at)| *at > r.promoted_at), "deliveries after the promotion");
    report("asynchronous", &r, lost);
}

/// A connection that reached a standby is never lent out again (issue 50):
/// behind a proxy or a single host name the broker cannot choose the
/// primary, so once PostgreSQL answers read-only, every pooled connection
/// opened before that answer is closed at its next checkout and a new one is
/// made (which, after a failover, reaches the new primary).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_that_met_a_standby_is_closed_not_lent_again() {
    let primary = Node::primary();
    let standby = Node::standby_of(&primary);
    // The schema, applied on the primary and replayed by the standby.
    let url = |n: &Node| format!("host={} port=5432 user=postgres dbname=postgres", n.socket().display());
    let writer = Broker::spawn("postgres".into(), vec![("QUEEN_DATABASE_URL".into(), url(&primary))]).await;
    assert_eq!(writer.post("/api/v1/configure", json!({"queue": "q"})).await.0, 200);
    let s = standby.sql().await;
    eventually("the standby replays the queue", Duration::from_secs(30), || async {
        s.query_one("SELECT count(*) FROM queen.queues WHERE name = 'q'", &[]).await.map(|r| r.get::<_, i64>(0) == 1).unwrap_or(false)
    })
    .await;
    // One host, the standby: nothing tells the broker it is not a primary.
    let broker = Broker::spawn("postgres".into(), vec![
        ("QUEEN_DATABASE_URL".into(), url(&standby)),
        ("QUEEN_APPLY_SCHEMA".into(), "false".into()),
    ])
    .await;
    let sessions = || async {
        s.query("SELECT pid FROM pg_stat_activity WHERE application_name = 'queen'", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i32>(0))
            .collect::<HashSet<i32>>()
    };
    // Ten writes one after another: each meets the standby's read-only
    // answer (503, nothing written), and each is served by a new session,
    // the one before it having been closed, not reused.
    let mut seen = HashSet::new();
    for i in 0..10 {
        let (status, body) = broker.post("/api/v1/configure", json!({"queue": format!("r{i}")})).await;
        assert_eq!(status, 503, "{body}");
        seen.extend(sessions().await);
    }
    assert!(seen.len() >= 10, "sessions were reused after a read-only answer: {} distinct", seen.len());
    let discards = common::sample(&broker.prometheus().await, "queen_db_read_only_discards_total").unwrap_or(0.0);
    assert!(discards >= 9.0, "{discards}");
    // The standby promoted: the broker writes there, with no restart.
    standby.promote();
    eventually("a write after the promotion", Duration::from_secs(30), || async {
        broker.post("/api/v1/configure", json!({"queue": "after"})).await.0 == 200
    })
    .await;
}
