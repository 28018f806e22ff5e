//! A PostgreSQL outage under load (issue 8, item 2): the broker stays up,
//! `/health` goes 503 then 200, pops answer promptly (503 JSON or 204, never
//! hanging past their timeout), pushes are spooled (`buffered`) and replayed
//! in order once the database is back, and the broker reconnects by itself.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, Broker};
use queen::embedded_pg::EmbeddedCluster;
use serde_json::{json, Value};

/// A cluster this test owns (the shared one cannot be stopped).
struct OwnCluster {
    dir: std::path::PathBuf,
    cluster: Option<EmbeddedCluster>,
}

impl OwnCluster {
    fn start() -> OwnCluster {
        let dir = tempfile::Builder::new().prefix("queen-outage-").tempdir_in("/tmp").unwrap().keep();
        let cluster = EmbeddedCluster::start(&dir).unwrap();
        OwnCluster { dir, cluster: Some(cluster) }
    }
    fn url(&self) -> String {
        format!("host={} port=5432 user=postgres dbname=postgres", self.dir.join("run").display())
    }
    fn stop(&mut self) {
        if let Some(c) = self.cluster.take() {
            c.stop().unwrap();
        }
    }
    fn restart(&mut self) {
        self.cluster = Some(EmbeddedCluster::start(&self.dir).unwrap());
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ten_second_outage_spools_pushes_and_recovers_without_a_restart() {
    let mut pg = OwnCluster::start();
    let env = vec![
        ("QUEEN_DATABASE_URL".to_string(), pg.url()),
        ("DB_CONNECTION_TIMEOUT".to_string(), "300".to_string()),
    ];
    let b = Broker::spawn("postgres".into(), env).await;
    let stop = Arc::new(AtomicBool::new(false));
    // (sequence number, answer status) of every push that got a 201.
    let answered: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let slow_pops: Arc<Mutex<Vec<String>>> = Arc::default();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let producer = {
        let (stop, answered, http, url) = (stop.clone(), answered.clone(), http.clone(), b.url.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) && n < 5000 {
                let body = json!({"items": [{"queue": "out", "partition": "p", "payload": n, "transactionId": format!("m{n}")}]});
                if let Ok(r) = http.post(format!("{url}/api/v1/push")).json(&body).send().await {
                    if r.status().as_u16() == 201 {
                        let v: Value = r.json().await.unwrap();
                        answered.lock().unwrap().push((n, v[0]["status"].as_str().unwrap().to_string()));
                        n += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let popper = {
        let (stop, slow, http, url) = (stop.clone(), slow_pops.clone(), http.clone(), b.url.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let r = http.get(format!("{url}/api/v1/pop/queue/other?wait=true&timeout=1000")).send().await;
                let took = started.elapsed();
                let status = r.as_ref().map(|r| r.status().as_u16()).unwrap_or(0);
                // An outage is a retryable 503 naming it, never a 500.
                let ok_status = matches!(status, 200 | 204 | 503);
                if took > Duration::from_millis(2500) || !ok_status {
                    slow.lock().unwrap().push(format!("status {status} after {took:?}"));
                }
                if status == 503 {
                    let r = r.unwrap();
                    let retry_after = r.headers().get("retry-after").is_some();
                    let body: Value = r.json().await.unwrap_or(Value::Null);
                    if !body["error"].is_string() || body["code"] != "database_unavailable" || !retry_after {
                        slow.lock().unwrap().push(format!("503 without its code or Retry-After: {body}"));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(b.get("/health").await.0, 200);

    pg.stop();
    let health = || async { b.get("/health").await.0 };
    eventually("/health to answer 503", Duration::from_secs(5), || async { health().await == 503 }).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let buffered = answered.lock().unwrap().iter().filter(|(_, s)| s == "buffered").count();
    assert!(buffered > 50, "pushes during the outage were spooled: {buffered}");

    pg.restart();
    eventually("/health to answer 200 again", Duration::from_secs(15), || async { health().await == 200 }).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    popper.await.unwrap();
    eventually("the spool to drain", Duration::from_secs(20), || async {
        b.get("/api/v1/system/maintenance").await.1["spoolPending"] == false
    })
    .await;

    let answered = answered.lock().unwrap().clone();
    let mut got = Vec::new();
    for _ in 0..100 {
        let r = b.pop("/api/v1/pop/queue/out/partition/p?batch=1000&autoAck=true").await;
        if r.status != 200 {
            break;
        }
        got.extend(r.data().iter().map(|d| d.as_u64().unwrap()));
    }
    let expected: Vec<u64> = answered.iter().map(|(n, _)| *n).collect();
    assert_eq!(got, expected, "every answered push, once, in push order");
    assert!(slow_pops.lock().unwrap().is_empty(), "pops misbehaved: {:?}", slow_pops.lock().unwrap());
}

/// Sessions cut by the server (`pg_terminate_backend`, what a fast shutdown
/// or a failover tool does: `FATAL 57P01`) in the middle of pushes and pops:
/// every push is answered 201 (written or spooled) and stored once, a pop
/// answers 200, 204 or a retryable 503, never a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_terminated_under_load_lose_no_push_and_answer_no_500() {
    let b = Broker::start().await;
    let sql = b.sql().await;
    let stop = Arc::new(AtomicBool::new(false));
    let answered: Arc<Mutex<Vec<u64>>> = Arc::default();
    let bad: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for lane in 0..4u64 {
        let (stop, answered, bad, url) = (stop.clone(), answered.clone(), bad.clone(), b.url.clone());
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut n = lane * 1_000_000;
            while !stop.load(Ordering::SeqCst) {
                let items: Vec<Value> = (n..n + 5).map(|k| json!({"queue": "cut", "partition": format!("p{lane}"), "payload": k, "transactionId": format!("t{k}")})).collect();
                let r = http.post(format!("{url}/api/v1/push")).json(&json!({ "items": items })).send().await.unwrap();
                match r.status().as_u16() {
                    201 => answered.lock().unwrap().extend(n..n + 5),
                    s => {
                        let text = r.text().await.unwrap_or_default();
                        bad.lock().unwrap().push(format!("push {s}: {text}"));
                    }
                }
                n += 5;
                let r = http.get(format!("{url}/api/v1/pop/queue/cut?consumerGroup=g&batch=5")).send().await.unwrap();
                let s = r.status().as_u16();
                if !matches!(s, 200 | 204 | 503) {
                    let text = r.text().await.unwrap_or_default();
                    bad.lock().unwrap().push(format!("pop {s}: {text}"));
                }
            }
        }));
    }
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        sql.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(bad.lock().unwrap().is_empty(), "{:?}", bad.lock().unwrap());
    eventually("the spool to drain", Duration::from_secs(20), || async { b.get("/health").await.1["spoolPending"] == false }).await;
    let answered = answered.lock().unwrap().clone();
    let mut stored = Vec::new();
    for lane in 0..4 {
        let ms = common::stored_messages(&sql, "cut", &format!("p{lane}")).await;
        let ns: Vec<u64> = ms.iter().map(|m| m.payload.parse().unwrap()).collect();
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "p{lane} in push order, once each");
        stored.extend(ns);
    }
    stored.sort();
    let mut expected = answered;
    expected.sort();
    assert!(expected.len() > 100, "{} pushes answered", expected.len());
    assert_eq!(stored, expected, "every answered push stored once, nothing else");
}
