//! `maxWaitTimeSeconds` (issue 27): a message that waited past its queue's
//! limit without being consumed by a group is dead-lettered for that group
//! with the reason `max_wait_time`, and the group's cursor moves past it;
//! never past a live lease.

mod common;

use std::time::Duration;

use common::{eventually, Broker};
use serde_json::{json, Value};

async fn evicting_broker() -> Broker {
    Broker::start_with(&[("EVICTION_INTERVAL", "200")]).await
}

async fn dead_letters(b: &Broker, group: &str) -> Vec<(i64, String, String)> {
    b.sql()
        .await
        .query(
            "SELECT msg_offset, transaction_id, error_message FROM queen.dead_letters WHERE consumer_group = $1 ORDER BY msg_offset",
            &[&group],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test]
async fn messages_waiting_past_the_limit_go_to_the_dlq_and_the_cursor_moves_past_them() {
    let b = evicting_broker().await;
    let (status, body) = b.post("/api/v1/configure", json!({"queue": "stale", "options": {"maxWaitTimeSeconds": 1}})).await;
    assert_eq!((status, body["options"]["maxWaitTimeSeconds"].clone()), (200, json!(1)));
    let items: Vec<Value> = (0..3).map(|i| json!({"queue": "stale", "partition": "p", "transactionId": format!("t{i}"), "payload": i})).collect();
    assert_eq!(b.post("/api/v1/push", json!({"items": items})).await.0, 201);
    // The group consumes the first message at once; the other two wait.
    let first = b.pop("/api/v1/pop/queue/stale?consumerGroup=g&batch=1&autoAck=true").await;
    assert_eq!(first.data(), vec![json!(0)]);

    eventually("the two waiting messages to be evicted", Duration::from_secs(10), || async {
        dead_letters(&b, "g").await.len() == 2
    })
    .await;
    assert_eq!(
        dead_letters(&b, "g").await,
        vec![(1, "t1".into(), "max_wait_time".into()), (2, "t2".into(), "max_wait_time".into())]
    );
    let pid = first.messages()[0]["partitionId"].as_str().unwrap().to_string();
    assert_eq!(b.cursor(&pid, "g").await.0, 2, "the cursor moved past them");
    assert_eq!(b.pop("/api/v1/pop/queue/stale?consumerGroup=g&batch=10").await.status, 204);
    let (_, dlq) = b.get("/api/v1/dlq?queue=stale&consumerGroup=g").await;
    assert_eq!(dlq["total"], 2);
    assert_eq!(dlq["messages"][0]["errorMessage"], "max_wait_time");
    assert_eq!(dlq["messages"][0]["data"], 2, "the snapshot keeps the payload");
    let (_, status) = b.get("/api/v1/status?queue=stale").await;
    assert_eq!(status["evicted"], 2, "{status}");
    let (_, queue_status) = b.get("/api/v1/status/queues/stale").await;
    assert_eq!((queue_status["evicted"].clone(), queue_status["deadLetters"].clone()), (json!(2), json!(2)), "{queue_status}");

    // A fresh message is not evicted before its time.
    b.push_to("stale", "p", &[json!("fresh")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/stale?consumerGroup=g&batch=10&autoAck=true").await.data(), vec![json!("fresh")]);
}

#[tokio::test]
async fn eviction_never_passes_a_live_lease_and_leaves_other_groups_and_queues_alone() {
    let b = evicting_broker().await;
    b.post("/api/v1/configure", json!({"queue": "held", "options": {"maxWaitTimeSeconds": 1}})).await;
    b.push_to("held", "p", &[json!(0), json!(1)]).await;
    b.push_to("no-limit", "p", &[json!(0)]).await;
    // g holds a long lease on both messages; h reads and acks one; plain reads no-limit.
    let leased = b.pop("/api/v1/pop/queue/held?consumerGroup=g&batch=10&leaseSeconds=60").await;
    assert_eq!(leased.data(), vec![json!(0), json!(1)]);
    let h = b.pop("/api/v1/pop/queue/held?consumerGroup=h&batch=1&autoAck=true").await;
    assert_eq!(h.data(), vec![json!(0)]);
    assert_eq!(b.pop("/api/v1/pop/queue/no-limit?consumerGroup=plain&batch=1&leaseSeconds=1").await.status, 200);

    eventually("h's waiting message to be evicted", Duration::from_secs(10), || async { dead_letters(&b, "h").await.len() == 1 }).await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // several more passes
    assert!(dead_letters(&b, "g").await.is_empty(), "a live lease is never passed");
    assert!(dead_letters(&b, "plain").await.is_empty(), "a queue without a limit keeps everything");
    let pid = leased.messages()[0]["partitionId"].as_str().unwrap().to_string();
    let lease = leased.body.as_ref().unwrap()["leaseId"].as_str().unwrap().to_string();
    assert_eq!(b.cursor(&pid, "g").await, (-1, Some(lease.clone()), 0));
    // The lease holder's ack still commits normally.
    let last = leased.messages()[1]["transactionId"].as_str().unwrap().to_string();
    let acks = b.ack_batch(Some("g"), &[(&last, &pid, "completed", Some(&lease))]).await;
    assert_eq!(acks[0]["success"], true, "{acks:?}");
    assert_eq!(b.cursor(&pid, "g").await.0, 1);
}

/// A broker killed (`kill -9`) again and again while it evicts loses no
/// message and dead-letters none twice: each pass's dead letters and cursor
/// move are one statement, so a crash lands before or after it, never inside.
#[tokio::test]
async fn killing_the_broker_mid_eviction_loses_nothing_and_doubles_nothing() {
    let mut b = Broker::start_with(&[("EVICTION_INTERVAL", "100"), ("EVICTION_BATCH_SIZE", "50")]).await;
    b.post("/api/v1/configure", json!({"queue": "crash", "options": {"maxWaitTimeSeconds": 1}})).await;
    let partitions = ["a", "b", "c", "d"];
    for p in partitions {
        let items: Vec<Value> = (0..500).map(|i| json!({"queue": "crash", "partition": p, "payload": i})).collect();
        assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
        // First contact gives group g a cursor on every partition, at -1.
        assert_eq!(b.pop(&format!("/api/v1/pop/queue/crash/partition/{p}?consumerGroup=g&batch=1&leaseSeconds=1")).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(1200)).await; // leases lapse, messages age past the limit
    let sql = b.sql().await;
    let evicted = || async {
        sql.query_one("SELECT count(*) FROM queen.dead_letters WHERE consumer_group = 'g'", &[]).await.unwrap().get::<_, i64>(0)
    };
    // 2,000 messages at 50 per pass: many passes, each interrupted at some point.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        b.restart().await; // kill -9, then start again on the same database
    }
    eventually("every message to be evicted", Duration::from_secs(30), || async { evicted().await == 2000 }).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // a few more passes: nothing more to do
    assert_eq!(evicted().await, 2000, "none twice");
    let rows = sql
        .query(
            "SELECT p.name, count(DISTINCT d.msg_offset), min(d.msg_offset), max(d.msg_offset), c.committed
             FROM queen.dead_letters d JOIN queen.partitions p ON p.id = d.partition_id
             JOIN queen.consumers c ON c.partition_id = d.partition_id AND c.consumer_group = d.consumer_group
             GROUP BY p.name, c.committed ORDER BY p.name",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, i64, i64, i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
    let want: Vec<(String, i64, i64, i64, i64)> = partitions.iter().map(|p| (p.to_string(), 500, 0, 499, 499)).collect();
    assert_eq!(got, want, "each partition: offsets 0..=499 once each, and the cursor past the last");
}

/// Issue 44 §2: a queue with maxWaitTimeSeconds whose partitions nobody has
/// popped evicts its overdue messages too, for the queue-mode consumer,
/// which then finds them gone; a group that arrives later with
/// `subscriptionMode=all` still reads them (they were not evicted for it).
/// A queue without a limit gets no cursor.
#[tokio::test]
async fn overdue_messages_nobody_has_read_are_dead_lettered_for_the_queue_mode_consumer() {
    let b = evicting_broker().await;
    b.post("/api/v1/configure", json!({"queue": "unread", "options": {"maxWaitTimeSeconds": 1}})).await;
    for p in ["a", "b"] {
        let items: Vec<Value> = (0..3).map(|i| json!({"queue": "unread", "partition": p, "transactionId": format!("{p}{i}"), "payload": i})).collect();
        assert_eq!(b.post("/api/v1/push", json!({"items": items})).await.0, 201);
    }
    b.push_to("no-limit", "p", &[json!(0)]).await;
    eventually("six unread messages to be evicted", Duration::from_secs(10), || async {
        dead_letters(&b, "__QUEUE_MODE__").await.len() == 6
    })
    .await;
    let txns: std::collections::BTreeSet<String> = dead_letters(&b, "__QUEUE_MODE__").await.into_iter().map(|(_, t, e)| {
        assert_eq!(e, "max_wait_time");
        t
    }).collect();
    assert_eq!(txns.len(), 6, "each once: {txns:?}");
    assert_eq!(b.pop("/api/v1/pop/queue/unread?batch=10&wait=false").await.status, 204, "the queue-mode consumer finds them gone");
    let late = b.pop("/api/v1/pop/queue/unread?consumerGroup=late&subscriptionMode=all&batch=10&autoAck=true").await;
    assert_eq!(late.messages().len(), 3, "a later group reads the backlog it was not evicted for");
    let cursors: i64 = b
        .sql()
        .await
        .query_one("SELECT count(*) FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'no-limit'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(cursors, 0, "a queue without a limit is left alone");
    // What comes after the eviction is delivered to the queue-mode consumer.
    b.push_to("unread", "a", &[json!("fresh")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/unread?batch=10&autoAck=true").await.data(), vec![json!("fresh")]);
}

/// Issue 45: eviction met a segment it could not decode, stopped there and
/// said nothing, so a cursor stayed stuck with no trace. Now it is logged
/// and counted, and nothing of it or after it is dead-lettered out of order.
#[tokio::test]
async fn a_segment_eviction_cannot_read_is_said_and_nothing_past_it_moves() {
    let b = Broker::start_with(&[("EVICTION_INTERVAL", "200")]).await;
    b.post("/api/v1/configure", json!({"queue": "rot", "options": {"maxWaitTimeSeconds": 1}})).await;
    for i in 0..2 {
        b.push_to("rot", "p", &[json!(i)]).await;
    }
    let sql = b.sql().await;
    // The first segment's blob is corrupted, as a bad disk or a bug could leave it.
    sql.execute("UPDATE queen.segments SET blob = '\\x00010203'::bytea WHERE base_offset = 0", &[]).await.unwrap();
    eventually("the unreadable segment to be said", Duration::from_secs(10), || async {
        b.logs().iter().any(|l| l.contains("eviction cannot read a segment") && l.contains("base_offset=0"))
    })
    .await;
    assert!(dead_letters(&b, "__QUEUE_MODE__").await.is_empty(), "nothing past it was evicted out of order");
    let metrics = String::from_utf8(b.get_bytes("/metrics/prometheus").await.1).unwrap();
    assert!(metrics.lines().any(|l| l.starts_with("queen_eviction_unreadable_segments_total ") && !l.ends_with(" 0")), "counted");
}
