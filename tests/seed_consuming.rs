//! seeds/consuming.md, statement by statement (issue 35 §4): each test is
//! named after the sentence it holds, quoted in its doc comment, and runs in
//! both candidate modes (the hot-list and `QUEEN_HOTLIST=false`). Hold this
//! file against the page.

mod common;

use std::time::{Duration, Instant};

use common::{brokers_in_both_modes, Broker};
use serde_json::{json, Value};

/// Configures `queue`'s minPopWaitTime through `/configure`, as a user would.
async fn min_pop_wait(b: &Broker, queue: &str, ms: i64) {
    let (status, body) = b.post("/api/v1/configure", json!({"queue": queue, "options": {"minPopWaitTime": ms}})).await;
    assert_eq!(status, 200, "{body}");
}

/// A pop's answer and how long it took.
async fn timed_pop(b: &Broker, path: &str) -> (Vec<Value>, Duration) {
    let started = Instant::now();
    let r = b.pop(path).await;
    (r.data(), started.elapsed())
}

const WINDOW: Duration = Duration::from_millis(700);

/// "`minPopWaitTime`: Milliseconds a non-empty but under-full pop may wait
/// for more messages before claiming, so one commit carries more work. It
/// applies only to a pop that asked to block with a `batch` above 1". Every
/// such pop: the first and the later ones, leased and autoAck, on a new
/// partition, at batch 100, a new group's first pop; and a configure on this
/// broker takes effect at once.
#[tokio::test]
async fn min_pop_wait_holds_every_under_full_pop_that_asked_to_block() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.pop("/api/v1/pop/queue/mw").await; // the queue exists, as in the reproduction
        min_pop_wait(&b, "mw", WINDOW.as_millis() as i64).await;
        // (case, partition pushed to, query, messages it may deliver): a new
        // group reads one partition's whole log (one partition per pop):
        // p's 15 messages, or fresh's 3 (the SQL scan picks at random).
        let cases: [(&str, &str, &str, &[usize]); 7] = [
            ("the first pop", "p", "batch=10&autoAck=true", &[3]),
            ("a later pop", "p", "batch=10&autoAck=true", &[3]),
            ("a leased pop", "p", "batch=10", &[3]),
            ("a pop on a new partition", "fresh", "batch=10&autoAck=true", &[3]),
            ("a pop at batch 100", "p", "batch=100&autoAck=true", &[3]),
            ("a new group's first pop", "p", "batch=100&consumerGroup=newcomers", &[15, 3]),
            ("a later pop of that group", "p", "batch=10&consumerGroup=newcomers&autoAck=true", &[3]),
        ];
        for (what, partition, query, delivered) in cases {
            // Release whatever the previous case leased, so only the window holds this one.
            b.sql().await.execute("UPDATE queen.consumers SET worker_id = NULL, lease_expires_at = NULL", &[]).await.unwrap();
            b.sql().await.execute("UPDATE queen.consumers SET committed = (SELECT last_offset FROM queen.partitions p WHERE p.id = partition_id)", &[]).await.unwrap();
            b.push_to("mw", partition, &[json!(1), json!(2), json!(3)]).await;
            let (data, took) = timed_pop(&b, &format!("/api/v1/pop/queue/mw?wait=true&timeout=10000&{query}")).await;
            assert!(delivered.contains(&data.len()), "{mode}, {what}: {data:?}");
            assert!(took >= WINDOW - Duration::from_millis(50), "{mode}, {what}: held {took:?}, not the window");
            assert!(took < Duration::from_secs(5), "{mode}, {what}: {took:?}");
        }
    }
}

/// "... is clamped to 60000, is bounded further by that pop's own deadline,
/// and never delays a pop on an empty queue." — and it ends when the batch
/// fills (seeds/life-of-a-pop.md: "the first of batch full, window elapsed,
/// or the caller's deadline").
#[tokio::test]
async fn min_pop_wait_ends_at_the_first_of_batch_full_window_or_deadline_and_never_delays_an_empty_queue() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        min_pop_wait(&b, "mw", 10_000).await;
        // Empty: the long-poll's own timeout, not the window.
        let (data, took) = timed_pop(&b, "/api/v1/pop/queue/mw?wait=true&batch=10&timeout=300").await;
        assert!(data.is_empty() && took < Duration::from_secs(3), "{mode}: {took:?}");
        // The deadline bounds the hold, and the pop then delivers what is there.
        b.push_to("mw", "p", &[json!(1)]).await;
        let (data, took) = timed_pop(&b, "/api/v1/pop/queue/mw?wait=true&batch=10&timeout=500&autoAck=true").await;
        assert_eq!(data, [json!(1)], "{mode}");
        assert!(took >= Duration::from_millis(450) && took < Duration::from_secs(3), "{mode}: bounded by the deadline: {took:?}");
        // The batch filling ends it.
        b.push_to("mw", "p", &[json!(2), json!(3)]).await;
        let url = format!("{}/api/v1/pop/queue/mw?wait=true&batch=4&timeout=20000&autoAck=true", b.url);
        let started = Instant::now();
        let waiter = tokio::spawn(async move { reqwest::get(url).await.unwrap().json::<Value>().await.unwrap() });
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.push_to("mw", "p", &[json!(4), json!(5)]).await;
        let body = waiter.await.unwrap();
        assert_eq!(body["messages"].as_array().unwrap().len(), 4, "{mode}: {body}");
        assert!(started.elapsed() < Duration::from_secs(3), "{mode}: released by the full batch, not the window: {:?}", started.elapsed());
        // No hold without wait or at batch 1.
        for query in ["wait=false&batch=10", "wait=true&batch=1&timeout=5000"] {
            b.push_to("mw", "q", &[json!(6), json!(7)]).await;
            let (data, took) = timed_pop(&b, &format!("/api/v1/pop/queue/mw?{query}&autoAck=true")).await;
            assert!(!data.is_empty() && took < Duration::from_millis(500), "{mode} {query}: {took:?}");
        }
    }
}
