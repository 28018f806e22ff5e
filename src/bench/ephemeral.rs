//! `queen-bench ephemeral`: an ephemeral queue beside a durable one in the
//! same run, with the same clients and request shapes (issue 33):
//! push of `messages` at `batch` per request from `clients` clients over
//! `partitions` partitions; the broker's RSS growth while those messages
//! sit in the ephemeral queue (MB per million); a drain of each with pops of
//! `batch` and one ack request per pop; and the wake of a parked ephemeral
//! pop by a push (from the push's answer to the pop's).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Which kind of queue a phase drives.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Ephemeral,
    Durable,
}

async fn rss(client: &reqwest::Client, url: &str) -> u64 {
    let m: Value = client.get(format!("{url}/metrics")).send().await.expect("broker reachable").json().await.expect("metrics JSON");
    m["memory"]["rss"].as_u64().unwrap_or(0)
}

/// Pushes `messages` to `queue` in batches; messages per second.
async fn push_all(url: &str, kind: Kind, queue: &str, messages: usize, partitions: usize, clients: usize, batch: usize) -> f64 {
    let payload = "x".repeat(98); // 100 bytes as JSON text
    let batches = Arc::new(AtomicUsize::new(messages.div_ceil(batch)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (url, queue, payload, batches) = (url.to_string(), queue.to_string(), payload.clone(), batches.clone());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("http client builds");
            let mut round = c;
            while batches.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1)).is_ok() {
                let partition = format!("p{}", round % partitions);
                round += clients;
                let (endpoint, body, ok) = match kind {
                    Kind::Ephemeral => (
                        format!("{url}/api/v1/ephemeral/push"),
                        json!({"queue": queue, "partition": partition, "messages": (0..batch).map(|_| json!({"payload": payload})).collect::<Vec<_>>()}),
                        200,
                    ),
                    Kind::Durable => (
                        format!("{url}/api/v1/push"),
                        json!({"items": (0..batch).map(|_| json!({"queue": queue, "partition": partition, "payload": payload})).collect::<Vec<_>>()}),
                        201,
                    ),
                };
                for _ in 0..100 {
                    match client.post(&endpoint).json(&body).send().await {
                        Ok(r) if r.status().as_u16() == ok => {
                            let _ = r.bytes().await;
                            break;
                        }
                        _ => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("pusher");
    }
    messages as f64 / started.elapsed().as_secs_f64()
}

/// Drains `messages` from `queue` with pops of `batch` and one ack request
/// per pop (or stops after `limit`); messages per second.
async fn drain(url: &str, kind: Kind, queue: &str, messages: usize, clients: usize, batch: usize, limit: Duration) -> f64 {
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, queue, done) = (url.to_string(), queue.to_string(), done.clone());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("http client builds");
            while done.load(Ordering::Relaxed) < messages && started.elapsed() < limit {
                match kind {
                    Kind::Ephemeral => {
                        let pop = format!("{url}/api/v1/ephemeral/pop?queue={queue}&group=bench&batch={batch}");
                        let Ok(r) = client.get(&pop).send().await else { continue };
                        let Ok(body) = r.bytes().await else { continue };
                        #[derive(serde::Deserialize)]
                        struct Answer<'a> {
                            #[serde(borrow)]
                            messages: Vec<Id<'a>>,
                        }
                        #[derive(serde::Deserialize, serde::Serialize)]
                        struct Id<'a> {
                            #[serde(borrow)]
                            id: std::borrow::Cow<'a, str>,
                        }
                        let Ok(answer) = serde_json::from_slice::<Answer>(&body) else { continue };
                        if answer.messages.is_empty() {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        }
                        #[derive(serde::Serialize)]
                        struct Acks<'a> {
                            queue: &'a str,
                            group: &'a str,
                            acks: &'a [Id<'a>],
                        }
                        let body = serde_json::to_vec(&Acks { queue: &queue, group: "bench", acks: &answer.messages }).expect("serializable");
                        let r = client.post(format!("{url}/api/v1/ephemeral/ack")).header("content-type", "application/json").body(body).send().await;
                        if matches!(r, Ok(ref r) if r.status().is_success()) {
                            done.fetch_add(answer.messages.len(), Ordering::Relaxed);
                        }
                    }
                    Kind::Durable => {
                        let pop = format!("{url}/api/v1/pop/queue/{queue}?batch={batch}&consumerGroup=bench");
                        let Ok(r) = client.get(&pop).send().await else { continue };
                        if r.status().as_u16() != 200 {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        }
                        let Ok(body) = r.bytes().await else { continue };
                        let Ok(answer) = serde_json::from_slice::<crate::PopAnswer>(&body) else { continue };
                        let r = client
                            .post(format!("{url}/api/v1/ack/batch"))
                            .header("content-type", "application/json")
                            .body(crate::ack_body(&answer, "bench"))
                            .send()
                            .await;
                        if matches!(r, Ok(ref r) if r.status().is_success()) {
                            done.fetch_add(answer.messages.len(), Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("drainer");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// `trials` parked ephemeral pops, each woken by one push; the times from
/// the push's answer to the pop's, sorted.
async fn wake(url: &str, trials: usize) -> (Vec<Duration>, usize) {
    let client = reqwest::Client::new();
    let queue = format!("bench.eph.wake.{}", uuid::Uuid::now_v7().simple());
    let pop = format!("{url}/api/v1/ephemeral/pop?queue={queue}&autoAck=true&wait=true&timeout=10000");
    let mut samples = Vec::new();
    let mut missed = 0;
    for i in 0..trials {
        let popper = {
            let (client, pop) = (client.clone(), pop.clone());
            tokio::spawn(async move {
                let r = client.get(&pop).send().await.ok()?;
                let body: Value = r.json().await.ok()?;
                (!body["messages"].as_array()?.is_empty()).then(Instant::now)
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let r = client.post(format!("{url}/api/v1/ephemeral/push")).json(&json!({"queue": queue, "messages": [{"payload": i}]})).send().await;
        let answered = Instant::now();
        match (r, popper.await.ok().flatten()) {
            (Ok(r), Some(woke)) if r.status().is_success() => samples.push(woke.saturating_duration_since(answered)),
            _ => missed += 1,
        }
    }
    samples.sort();
    (samples, missed)
}

/// The whole scenario; prints one JSON line.
pub async fn run(url: &str, messages: usize, partitions: usize, clients: usize, batch: usize, trials: usize) {
    let client = reqwest::Client::new();
    let tag = uuid::Uuid::now_v7().simple().to_string();
    let (eph, durable) = (format!("bench.eph.{tag}"), format!("bench.durable.{tag}"));
    // Room for the whole run in the ephemeral queue.
    let r = client
        .post(format!("{url}/api/v1/ephemeral/configure"))
        .json(&json!({"queue": eph, "options": {"maxLength": messages, "maxBytes": (messages as u64) * 400}}))
        .send()
        .await
        .expect("broker reachable");
    assert!(r.status().is_success(), "configure answered {} (QUEEN_EPHEMERAL_MAX_MB too small?)", r.status());
    let rss_before = rss(&client, url).await;
    let eph_push = push_all(url, Kind::Ephemeral, &eph, messages, partitions, clients, batch).await;
    let rss_queued = rss(&client, url).await;
    let durable_push = push_all(url, Kind::Durable, &durable, messages, partitions, clients, batch).await;
    let limit = Duration::from_secs(300);
    let eph_drain = drain(url, Kind::Ephemeral, &eph, messages, clients, batch, limit).await;
    let durable_drain = drain(url, Kind::Durable, &durable, messages, clients, batch, limit).await;
    let (wakes, missed) = wake(url, trials).await;
    let pct = |p: f64| crate::percentile_ms(&wakes, p);
    let mb_per_million = rss_queued.saturating_sub(rss_before) as f64 / 1048576.0 / (messages as f64 / 1e6);
    println!(
        "ephemeral: push {eph_push:.0} vs durable {durable_push:.0} msg/s ({:.1}x); pop+ack {eph_drain:.0} vs {durable_drain:.0} msg/s ({:.1}x); wake p50 {:.2} p99 {:.2} ms; {mb_per_million:.0} MB RSS per million queued",
        eph_push / durable_push,
        eph_drain / durable_drain,
        pct(0.5),
        pct(0.99)
    );
    println!(
        "{}",
        json!({"scenario": "ephemeral", "messages": messages, "partitions": partitions, "clients": clients, "batch": batch,
               "push_msg_per_s": {"ephemeral": eph_push, "durable": durable_push, "ratio": eph_push / durable_push},
               "pop_ack_msg_per_s": {"ephemeral": eph_drain, "durable": durable_drain, "ratio": eph_drain / durable_drain},
               "wake_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0), "trials": trials, "missed": missed},
               "rss_mb_per_million_queued": mb_per_million})
    );
}
