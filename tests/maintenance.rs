//! Background services: retention, the dedup purge, the metrics sampler (issue 5).

mod common;

use std::time::Duration;

use common::{eventually, Broker};
use serde_json::{json, Value};

async fn fast_broker() -> Broker {
    Broker::start_with(&[("RETENTION_INTERVAL", "300"), ("METRICS_FLUSH_MS", "300")]).await
}

/// Pushes one message with `txn` to partition p of `queue`; its status.
async fn push_status(b: &Broker, queue: &str, txn: &str) -> String {
    let (status, body) = b.post("/api/v1/push", json!({"items": [{"queue": queue, "partition": "p", "transactionId": txn, "payload": 1}]})).await;
    assert_eq!(status, 201, "{body}");
    body[0]["status"].as_str().unwrap().to_string()
}

async fn count(b: &Broker, sql: &str) -> i64 {
    b.sql().await.query_one(sql, &[]).await.unwrap().get(0)
}

/// Pops (queue, partition p) leased for `group` and gives it back with
/// `retry`: the group now has a cursor at -1.
async fn touch(b: &Broker, queue: &str, group: &str) {
    let body = b.pop(&format!("/api/v1/pop/queue/{queue}/partition/p?consumerGroup={group}&batch=1")).await.body.unwrap();
    let m = &body["messages"][0];
    b.ack_batch(Some(group), &[(m["transactionId"].as_str().unwrap(), m["partitionId"].as_str().unwrap(), "retry", body["leaseId"].as_str())]).await;
}

#[tokio::test]
async fn retention_removes_old_segments_and_a_cursor_in_the_gap_moves_on() {
    let b = fast_broker().await;
    b.push_to("ret", "p", &[json!("old")]).await;
    b.post("/api/v1/configure", json!({"queue": "ret", "options": {"retentionSeconds": 3}})).await;
    touch(&b, "ret", "h").await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    b.push_to("ret", "p", &[json!("new")]).await;
    eventually("the old segment to expire", Duration::from_secs(5), || async { count(&b, "SELECT count(*) FROM queen.segments").await == 1 }).await;
    assert_eq!(count(&b, "SELECT log_start FROM queen.partitions").await, 1, "log_start follows the first kept offset");
    assert_eq!(b.pop("/api/v1/pop/queue/ret/partition/p?consumerGroup=h").await.data(), [json!("new")]);
    assert_eq!(b.pop("/api/v1/pop/queue/ret/partition/p?consumerGroup=fresh").await.data(), [json!("new")]);
}

/// A partition retention emptied holds nothing to read, whatever a new
/// group's cursor says (issue 51): a group's first contact with 200 emptied
/// partitions seeds none of them, so its first pop finds the one message
/// pushed since, instead of claiming its way through 200 empty candidates
/// and answering empty.
#[tokio::test]
async fn partitions_retention_emptied_are_no_candidates_for_a_new_group() {
    let b = fast_broker().await;
    b.post("/api/v1/configure", json!({"queue": "emptied", "options": {"retentionSeconds": 1}})).await;
    let items: Vec<Value> = (0..200).map(|n| json!({"queue": "emptied", "partition": format!("p{n:03}"), "payload": n})).collect();
    b.post("/api/v1/push", json!({ "items": items })).await;
    eventually("retention to empty every partition", Duration::from_secs(8), || async {
        count(&b, "SELECT count(*) FROM queen.segments").await == 0
    })
    .await;
    b.push_to("emptied", "p199", &[json!("new")]).await;
    let r = b.pop("/api/v1/pop/queue/emptied?consumerGroup=late&batch=10&partitions=4").await;
    assert_eq!(r.data(), [json!("new")], "the new message, on the first pop");
}

#[tokio::test]
async fn retention_forgets_the_ids_of_what_it_removes() {
    // Retention shorter than the (default, hour-long) dedup window: a removed
    // message's transactionId is forgotten with it, by the broker that
    // remembered it and by one that starts afresh.
    let mut b = fast_broker().await;
    b.post("/api/v1/configure", json!({"queue": "rt", "options": {"retentionSeconds": 1}})).await;
    assert_eq!(push_status(&b, "rt", "r-1").await, "queued");
    assert_eq!(push_status(&b, "rt", "r-2").await, "queued");
    assert_eq!(push_status(&b, "rt", "r-1").await, "duplicate");
    eventually("the segments to expire", Duration::from_secs(6), || async { count(&b, "SELECT count(*) FROM queen.segments").await == 0 }).await;
    assert_eq!(push_status(&b, "rt", "r-1").await, "queued", "forgotten with its message");
    assert_eq!(push_status(&b, "rt", "r-1").await, "duplicate", "and remembered again");
    b.restart().await;
    assert_eq!(push_status(&b, "rt", "r-2").await, "queued", "forgotten after a restart too");
    assert_eq!(push_status(&b, "rt", "r-1").await, "duplicate");
    assert_eq!(count(&b, "SELECT count(*) FROM queen.txn_index").await, 0, "pushes write no index entries");
}

#[tokio::test]
async fn completed_retention_waits_for_every_group() {
    let b = fast_broker().await;
    b.push_to("done", "p", &[json!("a")]).await;
    b.post("/api/v1/configure", json!({"queue": "done", "options": {"completedRetentionSeconds": 1}})).await;
    // Two groups subscribe through the wildcard route; only one finishes.
    assert_eq!(b.pop("/api/v1/pop/queue/done?consumerGroup=fast&autoAck=true").await.data(), [json!("a")]);
    let slow = b.pop("/api/v1/pop/queue/done?consumerGroup=slow").await.body.unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(count(&b, "SELECT count(*) FROM queen.segments").await, 1, "kept while a group still needs it");
    let m = &slow["messages"][0];
    b.ack_batch(Some("slow"), &[(m["transactionId"].as_str().unwrap(), m["partitionId"].as_str().unwrap(), "completed", slow["leaseId"].as_str())]).await;
    eventually("the consumed segment to go", Duration::from_secs(5), || async { count(&b, "SELECT count(*) FROM queen.segments").await == 0 }).await;
    assert_eq!(b.pop("/api/v1/pop/queue/done?consumerGroup=slow").await.status, 204);
}

/// Turns every stored segment of (queue, partition) into what a broker
/// before `0019_dedup_in_segments.sql` wrote: no hashes in the segment, one
/// index entry per message, keyed by the unkeyed hash of those days (these
/// tests push one message per segment).
async fn as_written_before_0019(b: &Broker, queue: &str, partition: &str) {
    let sql = b.sql().await;
    for m in common::stored_messages(&sql, queue, partition).await {
        sql.execute(
            "INSERT INTO queen.txn_index (partition_id, txn_hash, msg_offset, created_at)
             SELECT s.partition_id, $3, s.base_offset, s.created_at FROM queen.segments s
             JOIN queen.partitions p ON p.id = s.partition_id WHERE p.name = $1 AND s.base_offset = $2",
            &[&partition, &m.offset, &queen::log::legacy_index_hash(&m.transaction_id)],
        )
        .await
        .unwrap();
    }
    sql.execute("UPDATE queen.segments SET txn_hashes = NULL", &[]).await.unwrap();
}

/// The legacy index is read and emptied with the hash it was written with:
/// the purge finds its entries (it decodes the segments and hashes their ids
/// the old way).
/// Deduplicating against it is not kept: the broker's identities are keyed
/// since 0025, so an id from before is new to it (docs/DECISIONS.md).
#[tokio::test]
async fn index_entries_written_before_0019_are_purged_when_they_leave_the_window() {
    let mut b = fast_broker().await;
    b.post("/api/v1/configure", json!({"queue": "dd", "options": {"dedupWindowSeconds": 2}})).await;
    assert_eq!(push_status(&b, "dd", "legacy-1").await, "queued");
    assert_eq!(push_status(&b, "dd", "legacy-2").await, "queued");
    as_written_before_0019(&b, "dd", "p").await;
    b.restart().await; // the broker's memory is gone: only the old index knows
    assert_eq!(count(&b, "SELECT count(*) FROM queen.txn_index").await, 2);
    eventually("the purge to take the old entries", Duration::from_secs(6), || async {
        count(&b, "SELECT count(*) FROM queen.txn_index").await == 0
    })
    .await;
    assert_eq!(count(&b, "SELECT count(*) FROM queen.segments").await, 2, "the messages themselves stay");
}

#[tokio::test]
async fn an_id_is_a_duplicate_exactly_inside_its_window() {
    let b = fast_broker().await;
    b.post("/api/v1/configure", json!({"queue": "dw", "options": {"dedupWindowSeconds": 2}})).await;
    let push = |txn| push_status(&b, "dw", txn);
    assert_eq!(push("old-1").await, "queued");
    assert_eq!(push("old-2").await, "queued");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(push("young").await, "queued");
    assert_eq!(push("old-1").await, "duplicate", "1.3 s old: inside its window");
    // The purge marks the two old segments once PostgreSQL's clock has them
    // outside the window: from then on their ids are new.
    eventually("the old segments to leave the window", Duration::from_secs(5), || async {
        count(&b, "SELECT COALESCE(max(purged_below), -1) FROM queen.dedup_purge_marks").await == 2
    })
    .await;
    assert_eq!(push("young").await, "duplicate", "still inside its window");
    assert_eq!(push("old-1").await, "queued", "out of its window: a new message");
    assert_eq!(push("old-1").await, "duplicate", "and that one is inside its own");
    eventually("the rest to leave the window", Duration::from_secs(6), || async {
        count(&b, "SELECT COALESCE(max(purged_below), -1) FROM queen.dedup_purge_marks").await == 4
    })
    .await;
    assert_eq!(push("young").await, "queued");
}

#[tokio::test]
async fn the_dedup_purge_leaves_a_partition_alone_until_its_creation_leaves_the_window() {
    // 100,000 new partitions must not cost the purge 100,000 marks in the
    // first minutes: none of their segments can be older than they are.
    let b = fast_broker().await;
    b.post("/api/v1/configure", json!({"queue": "young", "options": {"dedupWindowSeconds": 2}})).await;
    for p in ["a", "b", "c"] {
        b.push_to("young", p, &[json!(p)]).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await; // three ticks
    assert_eq!(count(&b, "SELECT count(*) FROM queen.dedup_purge_marks").await, 0, "no partition is due yet");
    eventually("the segments to leave the window", Duration::from_secs(5), || async {
        count(&b, "SELECT count(*) FROM queen.dedup_purge_marks WHERE purged_below = 1").await == 3
    })
    .await;
}

#[tokio::test]
async fn the_dedup_purge_walks_a_long_history_in_passes() {
    let b = fast_broker().await;
    b.post("/api/v1/configure", json!({"queue": "long", "options": {"dedupWindowSeconds": 1}})).await;
    for n in 0..40 {
        b.push_to("long", "p", &[json!(n)]).await; // one segment each: more than one pass takes
    }
    assert_eq!(count(&b, "SELECT count(*) FROM queen.segments").await, 40);
    eventually("the history to be walked", Duration::from_secs(6), || async {
        count(&b, "SELECT COALESCE(max(purged_below), -1) FROM queen.dedup_purge_marks").await == 40
    })
    .await;
}

/// The purge looks for due partitions a window at a time (issue 51): with
/// windows of 10, all 25 partitions of a windowed queue are still marked.
#[tokio::test]
async fn the_dedup_purge_finds_due_partitions_over_several_windows() {
    let b = Broker::start_with(&[("RETENTION_INTERVAL", "100"), ("QUEEN_MAINTENANCE_WINDOW", "10")]).await;
    b.post("/api/v1/configure", json!({"queue": "wide", "options": {"dedupWindowSeconds": 1}})).await;
    for n in 0..25 {
        b.push_to("wide", &format!("p{n}"), &[json!(n)]).await;
    }
    eventually("every partition's segment to be purged", Duration::from_secs(10), || async {
        count(&b, "SELECT count(*) FROM queen.dedup_purge_marks WHERE purged_below = 1").await == 25
    })
    .await;
}

#[tokio::test]
async fn the_partition_table_grown_past_twice_its_statistics_is_analyzed() {
    let b = Broker::start_with(&[("QUEEN_ANALYZE_INTERVAL_MS", "200")]).await;
    let sql = b.sql().await;
    let reltuples = |table: &'static str| {
        let sql = &sql;
        async move {
            let n: f32 = sql.query_one("SELECT reltuples FROM pg_class WHERE oid = $1::text::regclass", &[&table]).await.unwrap().get(0);
            n
        }
    };
    b.push_to("small", "p", &[json!(1)]).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(reltuples("queen.partitions").await < 0.0, "a table under 1,000 rows is left to autovacuum");
    sql.batch_execute(
        "INSERT INTO queen.partitions (queue_id, name) SELECT q.id, 'g' || n FROM queen.queues q, generate_series(1, 3000) n",
    )
    .await
    .unwrap();
    eventually("queen.partitions to be analyzed", Duration::from_secs(8), || async {
        reltuples("queen.partitions").await >= 3000.0
    })
    .await;
    assert!(reltuples("queen.consumers").await < 0.0, "the cursor table is left to autovacuum");
}

#[tokio::test]
async fn the_sampler_persists_per_queue_traffic() {
    let b = fast_broker().await;
    b.push_to("sampled", "p", &[json!(1), json!(2), json!(3)]).await;
    b.pop("/api/v1/pop/queue/sampled?batch=2&autoAck=true").await;
    eventually("a sample", Duration::from_secs(5), || async {
        count(&b, "SELECT COALESCE(sum(pushed), 0)::bigint FROM queen.metrics_samples WHERE queue_name = 'sampled'").await == 3
    })
    .await;
    eventually("the pops", Duration::from_secs(5), || async {
        count(&b, "SELECT COALESCE(sum(popped), 0)::bigint FROM queen.metrics_samples WHERE queue_name = 'sampled'").await == 2
    })
    .await;
}

#[tokio::test]
async fn status_routes_report_real_figures() {
    let b = fast_broker().await;
    b.push_to("st.one", "a", &[json!(1), json!(2), json!(3)]).await;
    b.push_to("st.one", "b", &[json!(4)]).await;
    b.push_to("st.two", "a", &[json!(5)]).await;
    b.pop("/api/v1/pop/queue/st.one/partition/a?consumerGroup=g&batch=2&autoAck=true").await;
    eventually("a sample", Duration::from_secs(5), || async {
        count(&b, "SELECT COALESCE(sum(popped), 0)::bigint FROM queen.metrics_samples").await == 2
    })
    .await;

    let (status, s) = b.get("/api/v1/status?namespace=st").await;
    assert_eq!(status, 200);
    assert_eq!((s["queues"].as_i64(), s["partitions"].as_i64()), (Some(2), Some(3)));
    assert_eq!(s["messages"], json!({"total": 5, "pending": 3}), "g committed 2 of partition a");
    assert_eq!((s["throughput"]["pushed"].as_i64(), s["throughput"]["popped"].as_i64()), (Some(5), Some(2)));

    let (_, list) = b.get("/api/v1/status/queues?namespace=st").await;
    assert_eq!(list["total"], 2);
    let one = &list["queues"][0];
    assert_eq!((one["name"].as_str(), one["pending"].as_i64(), one["messages"].as_i64()), (Some("st.one"), Some(2), Some(4)));
    assert_eq!(one["groups"][0]["name"], "g");
    assert_eq!(one["groups"][0]["pending"], 1);

    let (status, q) = b.get("/api/v1/status/queues/st.one").await;
    assert_eq!(status, 200);
    assert_eq!(q["partitions"].as_array().unwrap().len(), 2);
    assert_eq!(q["throughput"]["pushed"], 4);
    assert_eq!(b.get("/api/v1/status/queues/none").await.0, 404);
    let (_, m) = b.get("/api/v1/status/queues/st.one/messages?limit=2").await;
    assert_eq!(m["messages"].as_array().unwrap().len(), 2);

    let (_, a) = b.get("/api/v1/status/analytics?interval=minute&queue=st.one").await;
    let pushed: i64 = a["series"].as_array().unwrap().iter().map(|p| p["pushed"].as_i64().unwrap()).sum();
    assert_eq!(pushed, 4);
    assert_eq!(b.get("/api/v1/status/analytics?interval=fortnight").await.0, 400);
}

#[tokio::test]
async fn a_partition_emptied_by_retention_is_removed_after_the_idle_time() {
    let b = Broker::start_with(&[("RETENTION_INTERVAL", "300"), ("PARTITION_CLEANUP_DAYS", "0.00002")]).await;
    b.push_to("emp", "gone", &[json!(1)]).await;
    b.push_to("emp", "busy", &[json!(2)]).await;
    b.pop("/api/v1/pop/queue/emp/partition/gone?consumerGroup=g").await;
    b.post("/api/v1/configure", json!({"queue": "emp", "options": {"retentionSeconds": 1}})).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    b.push_to("emp", "busy", &[json!(3)]).await; // keeps a segment young
    eventually("the emptied partition to go", Duration::from_secs(8), || async {
        b.push_to("emp", "busy", &[json!("fresh")]).await; // written all along: stays
        count(&b, "SELECT count(*) FROM queen.partitions WHERE name = 'gone'").await == 0
    })
    .await;
    assert_eq!(count(&b, "SELECT count(*) FROM queen.consumers").await, 0, "its cursors went with it");
    assert_eq!(count(&b, "SELECT count(*) FROM queen.partitions WHERE name = 'busy'").await, 1);
}

#[tokio::test]
async fn a_failed_statement_reads_as_the_servers_message() {
    // Maintenance ticks and 500 answers print database errors: they must say
    // what PostgreSQL said, not tokio-postgres's bare "db error".
    let b = fast_broker().await;
    let e = b.sql().await.query("SELECT 1 / 0", &[]).await.unwrap_err();
    assert_eq!(queen::db::DbError::from(e).to_string(), "postgres: ERROR 22012: division by zero");
}

/// The Kafka producer expiry (migrations/0038): an idle idempotent producer
/// goes after its idleness with its windows, a transactional id only after
/// the longer one, and never one inside an open transaction.
#[tokio::test]
async fn kafka_producer_expiry_keeps_transactional_ids_longer_and_never_an_open_transaction() {
    let b = Broker::start().await;
    let sql = b.sql().await;
    sql.batch_execute(
        "INSERT INTO queen.kafka_producers (producer_id, epoch, transactional_id, txn_state, touched_at) VALUES
             (1, 0, NULL, 0, now() - interval '2 days'),
             (2, 0, 'weekend', 0, now() - interval '2 days'),
             (3, 0, 'gone', 0, now() - interval '8 days'),
             (4, 0, 'open', 1, now() - interval '8 days'),
             (5, 0, NULL, 0, now());
         INSERT INTO queen.kafka_producer_windows VALUES (1, 'q', '0', 0, '{0}', '{9}', '{0}'), (5, 'q', '0', 0, '{0}', '{9}', '{0}');",
    )
    .await
    .unwrap();
    let day = 86_400i64;
    let gone: i64 = sql.query_one("SELECT queen.kafka_producers_expire_v2($1, $2, 1000)", &[&day, &(7 * day)]).await.unwrap().get(0);
    assert_eq!(gone, 2);
    let left: Vec<i64> = sql.query("SELECT producer_id FROM queen.kafka_producers ORDER BY 1", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(left, vec![2, 4, 5]);
    assert_eq!(count(&b, "SELECT count(*) FROM queen.kafka_producer_windows WHERE producer_id = 1").await, 0, "its windows went with it");
    // A batch bounds one call.
    sql.batch_execute("UPDATE queen.kafka_producers SET touched_at = now() - interval '9 days', txn_state = 0").await.unwrap();
    let gone: i64 = sql.query_one("SELECT queen.kafka_producers_expire_v2($1, $2, 2)", &[&day, &(7 * day)]).await.unwrap().get(0);
    assert_eq!(gone, 2);
    assert_eq!(count(&b, "SELECT count(*) FROM queen.kafka_producers").await, 1);
}
