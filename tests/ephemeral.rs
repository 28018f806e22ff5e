//! Ephemeral queues (issue 33), black-box: every route and verdict, groups
//! (queue mode, fan-out, competing consumers), leases, redelivery and the
//! retry limit, every budget and policy, TTL, the long-poll and its window
//! buffer, ids fenced across a restart, the kill switch, the gauges, bad
//! input, and that none of it reaches PostgreSQL.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, sample, Broker};
use serde_json::{json, Value};

async fn push(b: &Broker, queue: &str, partition: Option<&str>, payloads: &[Value]) -> (u16, Value) {
    let mut body = json!({"queue": queue, "messages": payloads.iter().map(|p| json!({"payload": p})).collect::<Vec<_>>()});
    if let Some(p) = partition {
        body["partition"] = json!(p);
    }
    b.post("/api/v1/ephemeral/push", body).await
}

async fn pop(b: &Broker, query: &str) -> Vec<Value> {
    let (status, r) = b.get(&format!("/api/v1/ephemeral/pop?{query}")).await;
    assert_eq!(status, 200, "{r}");
    r["messages"].as_array().unwrap().clone()
}

fn payloads(ms: &[Value]) -> Vec<Value> {
    ms.iter().map(|m| m["payload"].clone()).collect()
}

async fn ack(b: &Broker, queue: &str, group: Option<&str>, acks: Value) -> Vec<String> {
    let mut body = json!({"queue": queue, "acks": acks});
    if let Some(g) = group {
        body["group"] = json!(g);
    }
    let (status, r) = b.post("/api/v1/ephemeral/ack", body).await;
    assert_eq!(status, 200, "{r}");
    r["results"].as_array().unwrap().iter().map(|x| x["outcome"].as_str().unwrap().to_string()).collect()
}

fn ids(ms: &[Value]) -> Value {
    Value::Array(ms.iter().map(|m| json!({"id": m["id"]})).collect())
}

#[tokio::test]
async fn groups_read_one_ring_each_with_its_own_cursor_and_order_holds_per_partition() {
    let b = Broker::start().await;
    let (status, r) = push(&b, "feed", Some("p1"), &(0..6).map(|i| json!(i)).collect::<Vec<_>>()).await;
    assert_eq!((status, r["pushed"].clone()), (200, json!(6)));
    // Queue mode (no group), leased: a partition goes to one consumer at a time.
    let first = pop(&b, "queue=feed&batch=4").await;
    assert_eq!(payloads(&first), [json!(0), json!(1), json!(2), json!(3)]);
    assert_eq!(first[0]["partition"], "p1");
    assert_eq!(first[0]["attempts"], 1);
    assert!(pop(&b, "queue=feed&batch=4").await.is_empty(), "the partition is leased");
    assert_eq!(ack(&b, "feed", None, ids(&first)).await, ["acked"; 4]);
    assert_eq!(payloads(&pop(&b, "queue=feed&batch=10").await), [json!(4), json!(5)]);
    // A named group is a fan-out subscriber: it sees what is still in the ring.
    let tail = pop(&b, "queue=feed&batch=10&group=tail&autoAck=true").await;
    assert_eq!(payloads(&tail), [json!(4), json!(5)]);
    // Competing consumers of one group share the partitions.
    push(&b, "work", Some("a"), &[json!("a1"), json!("a2")]).await;
    push(&b, "work", Some("b"), &[json!("b1")]).await;
    let w1 = pop(&b, "queue=work&group=workers&batch=1").await;
    let w2 = pop(&b, "queue=work&group=workers&batch=1").await;
    let mut got = vec![w1[0]["payload"].clone(), w2[0]["payload"].clone()];
    got.sort_by_key(|v| v.to_string());
    assert_eq!(got, [json!("a1"), json!("b1")], "one message of each partition, never a2 before a1");
    // The depth gauges.
    let (status, d) = b.get("/api/v1/ephemeral/queues/work/depth").await;
    assert_eq!(status, 200);
    assert_eq!(d["depth"], 3);
    assert_eq!(d["groups"][0]["group"], "workers");
    assert_eq!(d["groups"][0]["inFlight"], 2);
    assert_eq!(d["groups"][0]["pending"], 3);
    let (status, list) = b.get("/api/v1/ephemeral/queues").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = list["queues"].as_array().unwrap().iter().map(|q| q["queue"].as_str().unwrap()).collect();
    assert_eq!(names, ["feed", "work"]);
    // None of it is in PostgreSQL.
    let rows: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.queues", &[]).await.unwrap().get(0);
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn a_nack_or_an_ended_lease_redelivers_with_attempts_until_the_retry_limit_drops_it() {
    let b = Broker::start().await;
    let (status, r) = b.post("/api/v1/ephemeral/configure", json!({"queue": "jobs", "options": {"leaseSeconds": 0.3, "retryLimit": 1}})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["options"]["retryLimit"], 1);
    push(&b, "jobs", None, &[json!("x"), json!("y")]).await;
    let m = pop(&b, "queue=jobs&group=g").await;
    assert_eq!((m[0]["payload"].clone(), m[0]["attempts"].clone()), (json!("x"), json!(1)));
    assert_eq!(ack(&b, "jobs", Some("g"), json!([{"id": m[0]["id"], "status": "retry"}])).await, ["redelivered"]);
    // The lease of the second delivery ends unacked: a third delivery would
    // pass the retry limit, so x is dropped and y comes next.
    let again = pop(&b, "queue=jobs&group=g").await;
    assert_eq!((again[0]["payload"].clone(), again[0]["attempts"].clone()), (json!("x"), json!(2)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let next = pop(&b, "queue=jobs&group=g").await;
    assert_eq!(payloads(&next), [json!("y")]);
    // A late ack of the dropped x: settled already, it will not come back.
    assert_eq!(ack(&b, "jobs", Some("g"), ids(&again)).await, ["acked"]);
    // A failed ack past the limit is settled and said to be dropped.
    assert_eq!(ack(&b, "jobs", Some("g"), json!([{"id": next[0]["id"], "status": "failed"}])).await, ["redelivered"]);
    let last = pop(&b, "queue=jobs&group=g").await;
    let (status, r) = b.post("/api/v1/ephemeral/ack", json!({"queue": "jobs", "group": "g", "acks": [{"id": last[0]["id"], "status": false}]})).await;
    assert_eq!(status, 200);
    assert_eq!((r["results"][0]["outcome"].clone(), r["results"][0]["dropped"].clone()), (json!("acked"), json!(true)));
    let (_, d) = b.get("/api/v1/ephemeral/queues/jobs/depth").await;
    assert_eq!(d["depth"], 0);
    assert_eq!(d["counters"]["dropped"]["retries"], 2);
}

#[tokio::test]
async fn bounds_refuse_whole_or_drop_the_oldest_and_the_broker_wide_budget_holds() {
    let b = Broker::start_with(&[("QUEEN_EPHEMERAL_MAX_MB", "1")]).await;
    b.post("/api/v1/ephemeral/configure", json!({"queue": "small", "options": {"maxLength": 3}})).await;
    push(&b, "small", None, &[json!(1), json!(2)]).await;
    let r = b.http.post(format!("{}/api/v1/ephemeral/push", b.url)).json(&json!({"queue": "small", "messages": [{"payload": 3}, {"payload": 4}]})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "ephemeral_queue_full");
    let (_, d) = b.get("/api/v1/ephemeral/queues/small/depth").await;
    assert_eq!((d["depth"].clone(), d["counters"]["refused"].clone()), (json!(2), json!(1)), "a refused push queues nothing");
    let (status, r) = push(&b, "small", None, &[json!(1), json!(2), json!(3), json!(4)]).await;
    assert_eq!((status, r["error"].clone()), (413, json!("ephemeral_request_too_large")));
    // Drop-oldest: a feed keeps the newest.
    b.post("/api/v1/ephemeral/configure", json!({"queue": "small", "options": {"policy": "drop_oldest"}})).await;
    let (status, _) = push(&b, "small", None, &[json!(3), json!(4)]).await;
    assert_eq!(status, 200);
    assert_eq!(payloads(&pop(&b, "queue=small&batch=10&autoAck=true").await), [json!(2), json!(3), json!(4)]);
    // maxBytes bounds the bytes (payload + 96 a message).
    let (status, r) = b.post("/api/v1/ephemeral/configure", json!({"queue": "bytes", "options": {"maxBytes": 300}})).await;
    assert_eq!(status, 200, "{r}");
    let big = json!("x".repeat(100));
    assert_eq!(push(&b, "bytes", None, std::slice::from_ref(&big)).await.0, 200);
    assert_eq!(push(&b, "bytes", None, std::slice::from_ref(&big)).await.0, 429);
    // No queue may be configured past the broker-wide budget, and together
    // they cannot pass it: 1 MiB here.
    let (status, r) = b.post("/api/v1/ephemeral/configure", json!({"queue": "huge", "options": {"maxBytes": 2 << 20}})).await;
    assert_eq!((status, r["field"].clone()), (400, json!("options.maxBytes")));
    let chunk: Vec<Value> = (0..100).map(|_| json!("y".repeat(2000))).collect();
    let mut refused = None;
    for i in 0..20 {
        let (status, r) = push(&b, &format!("q{i}"), None, &chunk).await;
        if status != 200 {
            refused = Some((status, r["error"].clone()));
            break;
        }
    }
    assert_eq!(refused, Some((503, json!("ephemeral_memory_full"))));
    let (_, list) = b.get("/api/v1/ephemeral/queues").await;
    assert!(list["usedBytes"].as_u64().unwrap() <= 1 << 20, "{list}");
    // A reset gives the memory back.
    let (status, r) = b.post("/api/v1/ephemeral/reset", json!({"queue": "q0"})).await;
    assert_eq!((status, r["dropped"].clone()), (200, json!(100)));
    assert_eq!(push(&b, "q-after-reset", None, &chunk).await.0, 200);
}

/// Partitions and cursors are memory too (issue 45): a client writing one
/// message to each of ever more partition names, consumed at once, used to
/// grow the broker without bound while the budget read zero. Their
/// bookkeeping now counts against QUEEN_EPHEMERAL_MAX_BYTES (503 when it is
/// spent), and an empty partition idle past QUEEN_EPHEMERAL_IMPLICIT_IDLE_S
/// goes, giving it back.
#[tokio::test]
async fn partitions_count_against_the_budget_and_empty_idle_ones_go() {
    let b = Broker::start_with(&[("QUEEN_EPHEMERAL_MAX_BYTES", "16384"), ("QUEEN_EPHEMERAL_IMPLICIT_IDLE_S", "1")]).await;
    // Declared, so the queue itself stays while its partitions go.
    assert_eq!(b.post("/api/v1/ephemeral/configure", json!({"queue": "many", "options": {}})).await.0, 200);
    let mut refused_at = None;
    for i in 0..1000 {
        let (status, r) = push(&b, "many", Some(&format!("part-{i:04}")), &[json!(i)]).await;
        if status != 200 {
            assert_eq!((status, r["error"].clone()), (503, json!("ephemeral_memory_full")), "{r}");
            refused_at = Some(i);
            break;
        }
        assert_eq!(pop(&b, &format!("queue=many&partition=part-{i:04}&autoAck=true")).await.len(), 1);
    }
    let refused_at = refused_at.expect("the budget ran out: partitions cost memory");
    assert!(refused_at > 10, "a partition costs bytes, not kilobytes: refused at {refused_at}");
    let (_, list) = b.get("/api/v1/ephemeral/queues").await;
    assert!(list["usedBytes"].as_u64().unwrap() <= 16384, "{list}");
    assert_eq!(list["queues"][0]["depth"], json!(0), "every message was consumed: only bookkeeping is held");
    // Empty and idle: the sweeper removes them and the budget comes back.
    eventually("the empty partitions and the idle group to go", Duration::from_secs(10), || async {
        let (_, list) = b.get("/api/v1/ephemeral/queues").await;
        list["queues"][0]["partitions"] == json!(0) && list["usedBytes"] == json!(0)
    })
    .await;
    let (status, _) = push(&b, "many", Some("after"), &[json!("back")]).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn messages_older_than_the_ttl_go_and_the_gauges_say_so() {
    let b = Broker::start().await;
    b.post("/api/v1/ephemeral/configure", json!({"queue": "presence", "options": {"ttlSeconds": 2.5}})).await;
    let pushed = Instant::now();
    push(&b, "presence", Some("room-1"), &[json!({"user": "ann"}), json!({"user": "bob"})]).await;
    eventually("the gauges to show two", Duration::from_secs(5), || async {
        sample(&b.prometheus().await, r#"queen_ephemeral_depth{queue="presence"}"#) == Some(2.0)
    })
    .await;
    assert!(pushed.elapsed() < Duration::from_millis(2500), "the gauges took too long to tell anything about the TTL");
    tokio::time::sleep(Duration::from_millis(2600).saturating_sub(pushed.elapsed())).await;
    assert!(pop(&b, "queue=presence&batch=10").await.is_empty());
    eventually("the gauges to show the drops", Duration::from_secs(5), || async {
        let text = b.prometheus().await;
        sample(&text, r#"queen_ephemeral_depth{queue="presence"}"#) == Some(0.0)
            && sample(&text, r#"queen_ephemeral_dropped_total{queue="presence",reason="ttl"}"#) == Some(2.0)
    })
    .await;
}

#[tokio::test]
async fn a_waiting_pop_is_woken_by_a_push_and_a_window_buffer_fattens_its_batch() {
    let b = Broker::start().await;
    let waiter = {
        let (http, url) = (b.http.clone(), b.url.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let r: Value = http.get(format!("{url}/api/v1/ephemeral/pop?queue=inbox&wait=true&timeout=20000")).send().await.unwrap().json().await.unwrap();
            (r, started.elapsed())
        })
    };
    eventually("the pop to wait", Duration::from_secs(10), || async { b.get("/api/v1/ephemeral/queues").await.1["parkedPops"] == 1 }).await;
    push(&b, "inbox", None, &[json!("ping")]).await;
    let (r, took) = waiter.await.unwrap();
    assert_eq!(r["messages"][0]["payload"], "ping");
    assert!(took < Duration::from_secs(10), "woken by the push, not by the 20 s timeout ({took:?})");
    // A window buffer of 5 messages or 2 s: a trickle is answered at once
    // when it reaches five.
    b.post("/api/v1/ephemeral/configure", json!({"queue": "trickle", "options": {"windowBuffer": {"ms": 2000, "count": 5}}})).await;
    let waiter = {
        let (http, url) = (b.http.clone(), b.url.clone());
        tokio::spawn(async move {
            let r: Value = http.get(format!("{url}/api/v1/ephemeral/pop?queue=trickle&batch=10&wait=true&timeout=10000&autoAck=true")).send().await.unwrap().json().await.unwrap();
            r
        })
    };
    for i in 0..5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        push(&b, "trickle", None, &[json!(i)]).await;
    }
    let r = waiter.await.unwrap();
    assert_eq!(payloads(r["messages"].as_array().unwrap()), (0..5).map(|i| json!(i)).collect::<Vec<_>>());
    // Without enough for the window, the pop answers what there is when it ends.
    push(&b, "trickle", None, &[json!("lonely")]).await;
    let started = Instant::now();
    let got = pop(&b, "queue=trickle&batch=10&wait=true&timeout=10000&autoAck=true").await;
    assert_eq!(payloads(&got), [json!("lonely")]);
    assert!(started.elapsed() >= Duration::from_millis(1900), "held for the window");
}

#[tokio::test]
async fn ids_from_before_a_restart_or_a_reset_are_stale_and_nothing_survives_a_restart() {
    let mut b = Broker::start().await;
    push(&b, "q", None, &[json!(1), json!(2)]).await;
    let m = pop(&b, "queue=q&batch=1").await;
    b.post("/api/v1/ephemeral/reset", json!({"queue": "q"})).await;
    assert_eq!(ack(&b, "q", None, ids(&m)).await, ["stale"]);
    push(&b, "q", None, &[json!(3)]).await;
    let m = pop(&b, "queue=q&batch=1").await;
    b.restart().await;
    assert_eq!(ack(&b, "q", None, ids(&m)).await, ["stale"]);
    assert_eq!(ack(&b, "q", None, json!([{"id": "not-an-id"}])).await, ["stale"], "no such queue any more");
    let (status, r) = b.get("/api/v1/ephemeral/queues/q/depth").await;
    assert_eq!((status, r["error"].clone()), (404, json!("ephemeral_queue_not_found")));
    // Delete says whether there was something to delete.
    push(&b, "q", None, &[json!(4)]).await;
    assert_eq!(ack(&b, "q", None, json!([{"id": "not-an-id"}])).await, ["unknown"]);
    let r: Value = b.http.delete(format!("{}/api/v1/ephemeral/queue/q", b.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(r["deleted"], true);
    let r: Value = b.http.delete(format!("{}/api/v1/ephemeral/queue/q", b.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(r["deleted"], false);
    let (status, r) = b.post("/api/v1/ephemeral/reset", json!({"queue": "never"})).await;
    assert_eq!((status, r["dropped"].clone()), (200, json!(0)));
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field_and_the_switch_turns_the_family_off() {
    let b = Broker::start().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/api/v1/ephemeral/push", json!({"messages": [{"payload": 1}]}), "queue"),
        ("/api/v1/ephemeral/push", json!({"queue": "q"}), "messages"),
        ("/api/v1/ephemeral/push", json!({"queue": "q", "messages": [{"payload": 1}, {"nothing": 2}]}), "messages[1].payload"),
        ("/api/v1/ephemeral/push", json!({"queue": "q", "partition": "", "messages": []}), "partition"),
        ("/api/v1/ephemeral/ack", json!({"queue": "q"}), "acks"),
        ("/api/v1/ephemeral/ack", json!({"queue": "q", "acks": [{"status": "completed"}]}), "acks[0].id"),
        ("/api/v1/ephemeral/ack", json!({"queue": "q", "acks": [{"id": "x", "status": "maybe"}]}), "acks[0].status"),
        ("/api/v1/ephemeral/configure", json!({"queue": "q", "options": {"ttl_second": 1}}), "options.ttl_second"),
        ("/api/v1/ephemeral/configure", json!({"queue": "q", "options": {"policy": "lifo"}}), "options.policy"),
        ("/api/v1/ephemeral/configure", json!({"queue": "q", "options": 5}), "options"),
        ("/api/v1/ephemeral/reset", json!({}), "queue"),
        ("/api/v1/ephemeral/reset", json!([1]), "body"),
    ];
    for (path, body, field) in cases {
        let (status, r) = b.post(path, body.clone()).await;
        assert_eq!((status, r["error"].clone(), r["field"].clone()), (400, json!("ephemeral_bad_request"), json!(field)), "{path} {body}: {r}");
    }
    for (query, field) in [("batch=1", "queue"), ("queue=q&batch=0", "batch"), ("queue=q&wait=maybe", "wait"), ("queue=q&timeout=999999", "timeout")] {
        let (status, r) = b.get(&format!("/api/v1/ephemeral/pop?{query}")).await;
        assert_eq!((status, r["field"].clone()), (400, json!(field)), "{query}: {r}");
    }
    // A refused configure created nothing.
    assert_eq!(b.get("/api/v1/ephemeral/queues/q/depth").await.0, 404);
    // The kill switch: every verb answers 503 with Retry-After; reads stay.
    let (status, r) = b.post("/api/v1/system/ephemeral", json!({"enabled": false})).await;
    assert_eq!((status, r["enabled"].clone()), (200, json!(false)));
    let r = b.http.post(format!("{}/api/v1/ephemeral/push", b.url)).json(&json!({"queue": "q", "messages": [{"payload": 1}]})).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["retry-after"].to_str().unwrap().to_string()), (503, "1".to_string()));
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "ephemeral_disabled");
    assert_eq!(b.get("/api/v1/ephemeral/pop?queue=q").await.0, 503);
    let (status, list) = b.get("/api/v1/ephemeral/queues").await;
    assert_eq!((status, list["enabled"].clone()), (200, json!(false)));
    // Kept in the database: a peer broker honours it too.
    let peer = b.peer().await;
    assert_eq!(peer.get("/api/v1/system/ephemeral").await.1["enabled"], false);
    b.post("/api/v1/system/ephemeral", json!({"enabled": true})).await;
    assert_eq!(push(&b, "q", None, &[json!(1)]).await.0, 200);
}
