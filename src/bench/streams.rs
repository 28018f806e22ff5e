//! `queen-bench streams`: a tumbling-window sum driven the way the clients'
//! stream processor drives the broker (a leased pop per partition, a state
//! read of the window's row, one `/streams/v1/cycle` committing the new sum
//! and the ack), messages per second through it, beside a plain leased
//! consume (pop + `ack/batch`) of the same number of messages in the same
//! run. The window is processing-time and spans the run, so every cycle
//! reads and rewrites one state row per partition, as an open window does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    let r = client.post(url).json(body).send().await.ok()?;
    r.json().await.ok()
}

/// Drains `queue` with `workers` stream workers; messages per second.
pub async fn run_stream(url: &str, queue: &str, messages: usize, workers: usize, batch: usize, limit: Duration) -> f64 {
    let client = reqwest::Client::new();
    let name = format!("bench-{}", uuid::Uuid::now_v7().simple());
    let reg = post(&client, &format!("{url}/streams/v1/queries"), &json!({"name": name, "source_queue": queue, "config_hash": "bench", "reset": false}))
        .await
        .expect("registered");
    let query = reg["query_id"].as_str().expect("query_id").to_string();
    let group = format!("streams.{name}");
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (client, url, queue, query, group, done) = (client.clone(), url.to_string(), queue.to_string(), query.clone(), group.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let pop = format!("{url}/api/v1/pop/queue/{queue}?batch={batch}&partitions=1&consumerGroup={group}&wait=true&timeout=200");
            while (done.load(Ordering::Relaxed) as usize) < messages && started.elapsed() < limit {
                let Ok(r) = client.get(&pop).send().await else { continue };
                if r.status().as_u16() != 200 {
                    continue;
                }
                let Ok(body) = r.json::<Value>().await else { continue };
                let Some(ms) = body["messages"].as_array().filter(|m| !m.is_empty()) else { continue };
                let pid = ms[0]["partitionId"].clone();
                let state = post(&client, &format!("{url}/streams/v1/state/get"), &json!({"query_id": query, "partition_id": pid, "keys": ["tumb:bench"]}))
                    .await
                    .unwrap_or(Value::Null);
                let before = state["rows"][0]["value"]["acc"]["sum"].as_f64().unwrap_or(0.0);
                let sum: f64 = ms.iter().map(|m| m["data"].as_str().map_or(1.0, |s| s.len() as f64)).sum();
                let last = ms.last().expect("a message");
                let cycle = json!({"query_id": query, "partition_id": pid, "consumer_group": group,
                    "state_ops": [{"type": "upsert", "key": "tumb:bench", "value": {"acc": {"sum": before + sum, "count": ms.len()}, "windowStart": 0, "windowEnd": 4_000_000_000_000u64}}],
                    "push_items": [],
                    "ack": {"transactionId": last["transactionId"], "leaseId": body["leaseId"], "status": "completed", "count": ms.len()},
                    "release_lease": true});
                if post(&client, &format!("{url}/streams/v1/cycle"), &cycle).await.is_some_and(|c| c["success"] == true) {
                    done.fetch_add(ms.len() as u64, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("stream worker");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
