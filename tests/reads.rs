//! The lease-free reads of the log (issue 28 §2): partition discovery by
//! last write, as the Python client's `changed_since` walks it.

mod common;

use common::Broker;
use serde_json::{json, Value};

async fn changed(b: &Broker, entries: Value) -> (u16, Value) {
    b.post("/api/v1/partitions/changed", json!({ "entries": entries })).await
}

#[tokio::test]
async fn partitions_changed_pages_in_creation_order_from_since_and_safe_time_covers_what_it_saw() {
    let b = Broker::start().await;
    for p in ["a", "b", "c"] {
        b.push_to("disc", p, &[json!(p)]).await;
    }
    // Everything, two per page: a, b, then c, and the walk ends.
    let (status, first) = changed(&b, json!([{"queue": "disc", "limit": 2}])).await;
    assert_eq!(status, 200, "{first}");
    let names = |v: &Value| -> Vec<String> {
        v["entries"][0]["partitions"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&first), ["a", "b"]);
    let next = first["entries"][0]["next"].as_str().unwrap().to_string();
    let (_, second) = changed(&b, json!([{"queue": "disc", "limit": 2, "after": next}])).await;
    assert_eq!(names(&second), ["c"]);
    assert_eq!(second["entries"][0]["next"], Value::Null, "a short page ends the walk");
    let p = &first["entries"][0]["partitions"][0];
    assert_eq!((p["lastOffset"].clone(), p["logStart"].clone()), (json!(0), json!(0)));
    assert!(p["id"].as_str().unwrap().parse::<i64>().is_ok());
    assert!(p["lastWriteAt"].as_str().unwrap().ends_with('Z'));

    // Since the first answer's safeTime: only what was written after it.
    let safe = first["safeTime"].as_str().unwrap().to_string();
    b.push_to("disc", "b", &[json!("again")]).await;
    b.push_to("disc", "d", &[json!("new")]).await;
    let (_, since) = changed(&b, json!([{"queue": "disc", "since": safe}])).await;
    assert_eq!(names(&since), ["b", "d"], "a and c were not written since");
    assert_eq!(since["entries"][0]["partitions"][0]["lastOffset"], 1);
    assert!(since["safeTime"].as_str().unwrap() >= safe.as_str(), "safeTime moves forward and compares as a string");
}

#[tokio::test]
async fn partitions_changed_names_unknown_queues_bad_cursors_and_bad_fields() {
    let b = Broker::start().await;
    b.push_to("known", "p", &[json!(1)]).await;
    let (status, r) = changed(&b, json!([{"queue": "nope"}, {"queue": "known", "after": "garbage"}, {"queue": "known"}])).await;
    assert_eq!(status, 200);
    assert_eq!(r["entries"][0]["error"], "UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!(r["entries"][1]["error"], "BAD_CURSOR");
    assert_eq!(r["entries"][2]["partitions"].as_array().unwrap().len(), 1, "entries are index-aligned");
    for (entries, error) in [
        (json!([{"queue": "known", "since": "last tuesday"}]), "entries[0].since: an ISO 8601 timestamp with its zone"),
        (json!([{"queue": "known", "limit": 5000}]), "entries[0].limit: an integer from 1 to 1000"),
        (json!([]), "entries: from 1 to 64 entries, got 0"),
    ] {
        let (status, r) = changed(&b, entries).await;
        assert_eq!((status, r["error"].as_str().unwrap()), (400, error));
    }
    let many: Vec<Value> = (0..65).map(|_| json!({"queue": "known"})).collect();
    assert_eq!(changed(&b, json!(many)).await.0, 400);
}

async fn fetch(b: &Broker, body: Value) -> (u16, Value) {
    b.post("/api/v1/fetch", body).await
}

#[tokio::test]
async fn fetch_reads_by_offset_to_the_high_watermark_without_touching_any_cursor() {
    let b = Broker::start().await;
    b.push_to("log", "p", &[json!({"n": 0}), json!({"n": 1})]).await;
    b.push_to("log", "p", &[json!({"n": 2})]).await;
    let (status, r) = fetch(&b, json!({"entries": [{"queue": "log", "partition": "p", "offset": 1}]})).await;
    assert_eq!(status, 200, "{r}");
    let e = &r["entries"][0];
    assert_eq!((e["queue"].clone(), e["partition"].clone()), (json!("log"), json!("p")));
    assert_eq!((e["highWatermark"].clone(), e["logStartOffset"].clone(), e.get("error")), (json!(3), json!(0), None));
    let records = e["records"].as_array().unwrap();
    let got: Vec<(i64, Value)> = records.iter().map(|r| (r["offset"].as_i64().unwrap(), r["payload"].clone())).collect();
    assert_eq!(got, vec![(1, json!({"n": 1})), (2, json!({"n": 2}))], "across two segments, from the offset asked");
    assert!(records[0]["transactionId"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(records[0]["ts"].as_str().unwrap().ends_with('Z'));
    // At the watermark: nothing, and no error. Past it, or an unknown name: the error, index-aligned.
    let (_, r) = fetch(&b, json!({"entries": [
        {"queue": "log", "partition": "p", "offset": 3},
        {"queue": "log", "partition": "p", "offset": 9},
        {"queue": "log", "partition": "nope"},
        {"queue": "none"}]})).await;
    assert_eq!(r["entries"][0]["records"], json!([]));
    assert_eq!(r["entries"][0].get("error"), None);
    assert_eq!(r["entries"][1]["error"], "OFFSET_OUT_OF_RANGE");
    assert_eq!(r["entries"][1]["highWatermark"], 3);
    assert_eq!(r["entries"][2]["error"], "UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!((r["entries"][3]["error"].clone(), r["entries"][3]["partition"].clone()), (json!("UNKNOWN_TOPIC_OR_PARTITION"), json!("Default")));
    // No cursor, no lease: a consumer group still reads everything.
    let consumers: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.consumers", &[]).await.unwrap().get(0);
    assert_eq!(consumers, 0);
    assert_eq!(b.pop("/api/v1/pop/queue/log?batch=10").await.data().len(), 3);
}

#[tokio::test]
async fn fetch_budgets_bytes_yet_always_makes_progress_and_long_polls_until_a_push() {
    let b = Broker::start().await;
    let big = "x".repeat(1000);
    b.push_to("budget", "p", &[json!(big), json!(big), json!(big)]).await;
    // 1,002-byte payloads: a 1,500-byte entry budget takes one, a 10-byte one still takes one.
    let (_, r) = fetch(&b, json!({"entries": [{"queue": "budget", "partition": "p", "maxBytes": 1500}]})).await;
    assert_eq!(r["entries"][0]["records"].as_array().unwrap().len(), 1);
    let (_, r) = fetch(&b, json!({"entries": [{"queue": "budget", "partition": "p", "offset": 1, "maxBytes": 10}]})).await;
    assert_eq!(r["entries"][0]["records"][0]["offset"], 1, "an oversized record is still read");
    // The call's ceiling: the second entry finds it spent and answers nothing (the client asks again).
    let (_, r) = fetch(&b, json!({"maxBytes": 2500, "entries": [
        {"queue": "budget", "partition": "p"}, {"queue": "budget", "partition": "p", "offset": 2}]})).await;
    assert_eq!(r["entries"][0]["records"].as_array().unwrap().len(), 2);
    assert_eq!(r["entries"][1]["records"], json!([]));

    // At the watermark with maxWaitMs: answered by the next push, not by the deadline.
    let started = std::time::Instant::now();
    let waiter = {
        let (http, url) = (b.http.clone(), b.url.clone());
        tokio::spawn(async move {
            let r = http.post(format!("{url}/api/v1/fetch"))
                .json(&json!({"maxWaitMs": 10_000, "entries": [{"queue": "budget", "partition": "p", "offset": 3}]}))
                .send().await.unwrap();
            r.json::<Value>().await.unwrap()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    b.push_to("budget", "p", &[json!("late")]).await;
    let r = waiter.await.unwrap();
    assert_eq!(r["entries"][0]["records"][0]["payload"], "late");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "woken by the push: {:?}", started.elapsed());
    // With nothing coming, maxWaitMs ends it empty.
    let started = std::time::Instant::now();
    let (_, r) = fetch(&b, json!({"maxWaitMs": 400, "entries": [{"queue": "budget", "partition": "p", "offset": 4}]})).await;
    assert_eq!(r["entries"][0]["records"], json!([]));
    assert!(started.elapsed() >= std::time::Duration::from_millis(390));
    let (status, r) = fetch(&b, json!({"entries": [{"queue": "budget", "offset": -1}]})).await;
    assert_eq!((status, r["error"].clone()), (400, json!("entries[0].offset: a non-negative integer")));
}
