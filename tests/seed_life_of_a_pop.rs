//! seeds/life-of-a-pop.md, statement by statement (issue 35 §4): each test
//! is named after the sentence it holds, quoted in its doc comment, and runs
//! in both candidate modes (the hot-list and `QUEEN_HOTLIST=false`). Hold
//! this file against the page.

mod common;

use std::time::{Duration, Instant};

use common::{brokers_in_both_modes, Broker};
use serde_json::{json, Value};

async fn configure(b: &Broker, queue: &str, options: Value) {
    let (status, body) = b.post("/api/v1/configure", json!({"queue": queue, "options": options})).await;
    assert_eq!(status, 200, "{body}");
}

/// Parks a pop on `query` now; the handle answers its body and when it came.
fn parked(b: &Broker, query: &str) -> tokio::task::JoinHandle<(Option<Value>, Instant)> {
    let url = format!("{}{query}", b.url);
    tokio::spawn(async move {
        let r = reqwest::get(url).await.unwrap();
        let status = r.status().as_u16();
        let body = r.bytes().await.unwrap();
        let at = Instant::now();
        ((status == 200).then(|| serde_json::from_slice(&body).unwrap()), at)
    })
}

/// "`delayedProcessing` (seconds) makes only segments at least `D` seconds
/// old visible. It is never bypassed: it stays SQL-enforced, and the wheel
/// only schedules revisits for it." A parked pop gets the message at its
/// visibility time, not at its next backoff re-check (which would come at
/// 1.7 s of parking), and never before it.
#[tokio::test]
async fn delayed_processing_is_sql_enforced_and_the_wheel_wakes_a_parked_pop_at_the_visibility_time() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        configure(&b, "dly", json!({"delayedProcessing": 1})).await;
        assert_eq!(b.pop("/api/v1/pop/queue/dly").await.status, 204);
        let waiter = parked(&b, "/api/v1/pop/queue/dly?wait=true&timeout=10000&autoAck=true");
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.push_to("dly", "p", &[json!("later")]).await;
        let pushed = Instant::now();
        // Not visible yet: a pop that does not wait finds nothing.
        assert_eq!(b.pop("/api/v1/pop/queue/dly?consumerGroup=peek").await.status, 204, "{mode}");
        let (body, at) = waiter.await.unwrap();
        let took = at.duration_since(pushed);
        assert_eq!(body.expect("delivered")["messages"][0]["data"], "later", "{mode}");
        assert!(took >= Duration::from_millis(950), "{mode}: delivered {took:?} after the push, before its delay");
        assert!(took < Duration::from_millis(1300), "{mode}: delivered {took:?} after the push: the backoff's time, not the wheel's");
    }
}

/// "With the default broker-side candidate ring the hold is timed in the
/// broker, ending at the earlier of the window elapsing and the batch
/// filling" (seeds/consuming.md), and "the SQL debounce remains the safe
/// floor whenever the broker does not know the queue's config": on the SQL
/// path the partition is held for a quiet window after its last write.
#[tokio::test]
async fn a_window_buffer_hold_ends_at_the_window_or_the_full_batch_on_the_hot_list_and_is_the_sql_debounce_otherwise() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        configure(&b, "win", json!({"windowBuffer": 2})).await;
        assert_eq!(b.pop("/api/v1/pop/queue/win").await.status, 204);
        let items: Vec<Value> = (0..10).map(|n| json!({"queue": "win", "partition": "p", "payload": n})).collect();
        assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
        let pushed = Instant::now();
        let (body, at) = parked(&b, "/api/v1/pop/queue/win?wait=true&batch=10&timeout=10000&autoAck=true").await.unwrap();
        let took = at.duration_since(pushed);
        assert_eq!(body.expect("delivered")["messages"].as_array().unwrap().len(), 10, "{mode}");
        if mode == "hot-list" {
            assert!(took < Duration::from_millis(1000), "{mode}: the batch was full at once, yet held {took:?}");
        } else {
            assert!(took >= Duration::from_millis(1900), "{mode}: the SQL debounce holds a quiet window: {took:?}");
        }
        // An under-full batch waits for the window, counted from the first write.
        b.push_to("win", "p", &[json!("a")]).await;
        let pushed = Instant::now();
        let waiter = parked(&b, "/api/v1/pop/queue/win?wait=true&batch=10&timeout=10000&autoAck=true");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        b.push_to("win", "p", &[json!("b")]).await;
        let (body, at) = waiter.await.unwrap();
        let took = at.duration_since(pushed);
        let data: Vec<Value> = body.expect("delivered")["messages"].as_array().unwrap().iter().map(|m| m["data"].clone()).collect();
        assert_eq!(data, [json!("a"), json!("b")], "{mode}");
        if mode == "hot-list" {
            assert!(took >= Duration::from_millis(1900) && took < Duration::from_millis(2600), "{mode}: the window from the first write: {took:?}");
        } else {
            assert!(took >= Duration::from_millis(2900), "{mode}: a quiet window after the last write: {took:?}");
        }
    }
}
