//! `queen-bench kv | locks | timers`: the coordination families of issue 29
//! under load. Each prints a human line and one JSON line; every loop is
//! bounded by its duration (timers: by a deadline past the last due time).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

/// What `kv` sends per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvMode {
    /// One `put` (forever) per call, on 1,000 keys per client
    Put,
    /// One `get` per call, of keys written before the clock starts
    Get,
    /// 100 `put`s per call
    Batch,
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    let r = client.post(url).json(body).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// Whether a POST of `body` to `path` answered 2xx with `"success": true`.
async fn succeeded(client: &mut crate::lean::Lean, path: &str, body: String) -> bool {
    #[derive(serde::Deserialize)]
    struct Answer {
        success: bool,
    }
    match client.post(path, "application/json", body, None).await {
        Some((200..=299, b)) => serde_json::from_slice::<Answer>(&b).is_ok_and(|a| a.success),
        _ => false,
    }
}

/// KV calls per second with `concurrency` clients for `limit`.
pub async fn kv(url: &str, mode: KvMode, concurrency: usize, limit: Duration) {
    let ns = format!("bench-{}", uuid::Uuid::now_v7().simple());
    let endpoint = format!("{url}/api/v1/kv");
    if mode == KvMode::Get {
        let client = reqwest::Client::new();
        for c in 0..concurrency {
            let ops: Vec<Value> = (0..100).map(|k| json!({"op": "put", "ns": ns, "key": format!("c{c}-k{k}"), "value": {"n": k}, "forever": true})).collect();
            post(&client, &endpoint, &json!({ "operations": ops })).await.expect("prefill");
        }
    }
    let (calls, ops, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let (calls, ops, errors, ns) = (calls.clone(), ops.clone(), errors.clone(), ns.clone());
        let mut client = crate::lean::Lean::new(url);
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while started.elapsed() < limit {
                // The body as text, only the answer's `success` read, and a
                // lean client (`lean.rs`): the load generator shares the
                // machine with what it measures, so it spends as little per
                // call as it can (the namespace and keys are plain ASCII).
                let body = match mode {
                    KvMode::Put => format!(r#"{{"operations":[{{"op":"put","ns":"{ns}","key":"c{c}-k{}","value":{{"n":{i}}},"forever":true}}]}}"#, i % 1000),
                    KvMode::Get => format!(r#"{{"operations":[{{"op":"get","ns":"{ns}","key":"c{c}-k{}"}}]}}"#, i % 100),
                    KvMode::Batch => json!({"operations": (0..100).map(|k| json!({"op": "put", "ns": ns, "key": format!("c{c}-k{k}"), "value": {"n": i}, "forever": true})).collect::<Vec<_>>()}).to_string(),
                };
                let n = if mode == KvMode::Batch { 100 } else { 1 };
                if succeeded(&mut client, "/api/v1/kv", body).await {
                    calls.fetch_add(1, Ordering::Relaxed);
                    ops.fetch_add(n, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let secs = started.elapsed().as_secs_f64();
    let (calls, ops, errors) = (calls.load(Ordering::Relaxed), ops.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
    println!("kv {mode:?}: {concurrency} clients, {secs:.1} s, {:.0} calls/s, {:.0} ops/s, {errors} errors", calls as f64 / secs, ops as f64 / secs);
    println!("{}", json!({"scenario": "kv", "mode": format!("{mode:?}").to_lowercase(), "clients": concurrency, "seconds": secs,
                          "calls": calls, "calls_per_s": calls as f64 / secs, "ops_per_s": ops as f64 / secs, "errors": errors}));
}

/// Acquire/release cycles per second: `contenders` clients over `locks`
/// locks. A refused contender waits `retry` (±25 %) before trying again, as
/// a client's acquire loop does (the Python client: 100 ms growing to 1 s);
/// without a pause, refusals spin and the measure is of the spinning.
pub async fn locks(url: &str, contenders: usize, locks: usize, retry: Duration, limit: Duration) {
    let prefix = format!("bench-{}", uuid::Uuid::now_v7().simple());
    let endpoint = format!("{url}/api/v1/locks");
    let (cycles, refused, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..contenders {
        let (cycles, refused, errors, endpoint, prefix) = (cycles.clone(), refused.clone(), errors.clone(), endpoint.clone(), prefix.clone());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = c;
            while started.elapsed() < limit {
                let name = format!("{prefix}-{}", i % locks);
                i += contenders;
                let acquire = json!([{"op": "acquire", "name": name, "ttlSeconds": 30, "owner": format!("c{c}")}]);
                let Some(r) = post(&client, &endpoint, &acquire).await else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let got = &r["results"][0];
                if got["acquired"] != true {
                    refused.fetch_add(1, Ordering::Relaxed);
                    let jitter = 0.75 + 0.5 * (uuid::Uuid::now_v7().as_u128() % 1000) as f64 / 1000.0;
                    tokio::time::sleep(retry.mul_f64(jitter)).await;
                    continue;
                }
                let release = json!([{"op": "release", "name": name, "token": got["token"], "slot": got["slot"]}]);
                match post(&client, &endpoint, &release).await {
                    Some(r) if r["results"][0]["released"] == true => cycles.fetch_add(1, Ordering::Relaxed),
                    _ => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for t in tasks {
        t.await.expect("contender");
    }
    let secs = started.elapsed().as_secs_f64();
    let (cycles, refused, errors) = (cycles.load(Ordering::Relaxed), refused.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
    println!("locks: {contenders} contenders on {locks} locks, retry {retry:?}, {secs:.1} s, {:.0} cycles/s, {refused} refused acquires, {errors} errors", cycles as f64 / secs);
    println!("{}", json!({"scenario": "locks", "contenders": contenders, "locks": locks, "retry_ms": retry.as_millis() as u64, "seconds": secs,
                          "cycles_per_s": cycles as f64 / secs, "refused": refused, "errors": errors}));
}

/// Schedules `count` timers due `start` to `start + spread` from now, drains
/// their queue as they fire, and reports how late each fired (the fire's
/// clock against its due time, both PostgreSQL's) and arrived (the
/// consumer's receipt against its due time, one machine's clock), and
/// whether any arrived twice.
pub async fn timers(url: &str, count: usize, start: Duration, spread: Duration, concurrency: usize) {
    let queue = format!("bench.timers.{}", uuid::Uuid::now_v7().simple());
    let endpoint = format!("{url}/api/v1/timers");
    let payload = base64::engine::general_purpose::STANDARD.encode(b"{\"t\":1}");
    let due: Arc<std::sync::Mutex<std::collections::HashMap<String, chrono::DateTime<chrono::Utc>>>> = Default::default();
    let scheduling = Instant::now();
    let per = count.div_ceil(concurrency);
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let (endpoint, queue, payload, due) = (endpoint.clone(), queue.clone(), payload.clone(), due.clone());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mine: Vec<usize> = (c * per..((c + 1) * per).min(count)).collect();
            for chunk in mine.chunks(1000) {
                let ops: Vec<Value> = chunk
                    .iter()
                    .map(|n| {
                        // Due times spread evenly, measured from when the run began.
                        let at = start + spread.mul_f64(*n as f64 / count as f64);
                        let delay = at.saturating_sub(scheduling.elapsed()).as_millis() as i64;
                        json!({"op": "schedule", "queue": queue, "timerKey": format!("k{n}"), "payload": payload, "delayMs": delay, "txn": format!("t{n}")})
                    })
                    .collect();
                let r = post(&client, &endpoint, &json!({ "operations": ops })).await.expect("schedule answered");
                let mut due = due.lock().unwrap();
                for res in r["results"].as_array().expect("results") {
                    let at = chrono::DateTime::parse_from_rfc3339(res["deliverAt"].as_str().expect("deliverAt")).expect("a time");
                    due.insert(res["txn"].as_str().expect("txn").to_string(), at.with_timezone(&chrono::Utc));
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("scheduler");
    }
    let scheduled_in = scheduling.elapsed();
    let due = Arc::new(std::mem::take(&mut *due.lock().unwrap()));
    // Drain as they fire.
    let deadline = Instant::now() + start + spread + Duration::from_secs(30);
    let seen: Arc<std::sync::Mutex<Vec<(String, f64, f64)>>> = Default::default();
    let mut drains = Vec::new();
    for _ in 0..4 {
        let (url, queue, seen, due) = (url.to_string(), queue.clone(), seen.clone(), due.clone());
        drains.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let pop = format!("{url}/api/v1/pop/queue/{queue}?batch=1000&autoAck=true&wait=true&timeout=1000&partitions=1");
            while Instant::now() < deadline && seen.lock().unwrap().len() < due.len() {
                let Ok(r) = client.get(&pop).send().await else { continue };
                if r.status().as_u16() != 200 {
                    continue;
                }
                let received = chrono::Utc::now();
                let body: Value = r.json().await.expect("pop answer");
                let mut seen = seen.lock().unwrap();
                for m in body["messages"].as_array().into_iter().flatten() {
                    let txn = m["transactionId"].as_str().unwrap_or_default().to_string();
                    let Some(at) = due.get(&txn) else { continue };
                    let created = chrono::DateTime::parse_from_rfc3339(m["createdAt"].as_str().unwrap_or_default())
                        .map(|c| c.with_timezone(&chrono::Utc))
                        .unwrap_or(received);
                    seen.push((txn, (created - *at).num_microseconds().unwrap_or(0) as f64 / 1000.0, (received - *at).num_microseconds().unwrap_or(0) as f64 / 1000.0));
                }
            }
        }));
    }
    for d in drains {
        d.await.expect("drain");
    }
    let seen = seen.lock().unwrap();
    let distinct: std::collections::HashSet<&str> = seen.iter().map(|s| s.0.as_str()).collect();
    let pct = |mut v: Vec<f64>, p: f64| -> f64 {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(((v.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN)
    };
    let fired: Vec<f64> = seen.iter().map(|s| s.1).collect();
    let arrived: Vec<f64> = seen.iter().map(|s| s.2).collect();
    let (f50, f99, fmax) = (pct(fired.clone(), 0.5), pct(fired.clone(), 0.99), pct(fired, 1.0));
    let (a50, a99, amax) = (pct(arrived.clone(), 0.5), pct(arrived.clone(), 0.99), pct(arrived, 1.0));
    println!(
        "timers: {count} scheduled in {:.1} s, due over {:.0} s; {} arrived ({} distinct); fire lateness p50 {f50:.1} p99 {f99:.1} max {fmax:.1} ms; arrival p50 {a50:.1} p99 {a99:.1} max {amax:.1} ms",
        scheduled_in.as_secs_f64(), spread.as_secs_f64(), seen.len(), distinct.len()
    );
    println!("{}", json!({"scenario": "timers", "count": count, "scheduled_seconds": scheduled_in.as_secs_f64(), "spread_seconds": spread.as_secs_f64(),
                          "arrived": seen.len(), "distinct": distinct.len(), "twice": seen.len() - distinct.len(),
                          "fire_late_ms": {"p50": f50, "p99": f99, "max": fmax}, "arrival_late_ms": {"p50": a50, "p99": a99, "max": amax}}));
}
