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
