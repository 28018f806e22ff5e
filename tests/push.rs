//! The push path over HTTP against a real PostgreSQL (API.md §2.1, issue 2).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{stored_messages, Broker};
use serde_json::{json, Value};

fn results(body: &Value) -> &Vec<Value> {
    body.as_array().expect("the push answer is an array")
}

/// The answer is written by hand: a client's transactionId comes back as
/// it was sent, whatever it holds.
#[tokio::test]
async fn a_push_answer_carries_any_transaction_id_back_intact() {
    let b = Broker::start().await;
    let txn = "quote\" backslash\\ tab\t ctrl\u{1} é 🦀 </script>";
    let (status, body) = b.post("/api/v1/push", json!({"items": [{"queue": "esc", "payload": 1, "transactionId": txn}]})).await;
    assert_eq!(status, 201);
    let r = results(&body);
    assert_eq!((r[0]["transactionId"].as_str(), r[0]["transaction_id"].as_str()), (Some(txn), Some(txn)));
    assert_eq!(r[0]["queueName"], "esc");
    let (status, again) = b.post("/api/v1/push", json!({"items": [{"queue": "esc", "payload": 2, "transactionId": txn}]})).await;
    assert_eq!(status, 201);
    assert_eq!(results(&again)[0]["status"], "duplicate");
    assert_eq!(results(&again)[0]["messageId"], r[0]["messageId"]);
}

#[tokio::test]
async fn a_push_answers_201_with_one_result_per_item_in_item_order() {
    let b = Broker::start().await;
    let (status, body) = b
        .post(
            "/api/v1/push",
            json!({"items": [
                {"queue": "orders", "partition": "p1", "payload": {"n": 1}, "transactionId": "a"},
                {"queue": "orders", "payload": {"n": 2}, "transactionId": "b"},
                {"queue": "orders", "partition": "p1", "payload": {"n": 3}, "transactionId": "c"},
            ]}),
        )
        .await;
    assert_eq!(status, 201);
    let r = results(&body);
    assert_eq!(r.len(), 3);
    for (i, (item, txn)) in r.iter().zip(["a", "b", "c"]).enumerate() {
        assert_eq!(item["index"], i);
        assert_eq!(item["status"], "queued");
        assert_eq!(item["transactionId"], txn);
        assert_eq!(item["transaction_id"], txn);
        assert_eq!(item["queueName"], "orders");
        assert_eq!(item["messageId"], item["message_id"]);
        let id = uuid::Uuid::parse_str(item["messageId"].as_str().unwrap()).unwrap();
        assert_eq!(id.get_version_num(), 7, "message ids are UUIDv7");
        let pid = item["partitionId"].as_str().expect("partitionId is a string");
        pid.parse::<i64>().expect("partitionId is a decimal integer");
        let mut keys: Vec<&str> = item.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["index", "messageId", "message_id", "partitionId", "queueName", "status", "transactionId", "transaction_id"]);
    }
    assert_eq!(r[0]["partitionId"], r[2]["partitionId"]);
    assert_ne!(r[0]["partitionId"], r[1]["partitionId"]);

    let sql = b.sql().await;
    let p1 = stored_messages(&sql, "orders", "p1").await;
    assert_eq!(p1.iter().map(|m| (m.offset, m.payload.as_str())).collect::<Vec<_>>(), [(0, r#"{"n":1}"#), (1, r#"{"n":3}"#)]);
    assert_eq!(p1[0].message_id, r[0]["messageId"].as_str().unwrap());
    let default = stored_messages(&sql, "orders", "Default").await;
    assert_eq!(default.len(), 1, "an item without partition goes to Default");
    assert_eq!(default[0].transaction_id, "b");
}

#[tokio::test]
async fn payloads_are_stored_byte_for_byte_and_trace_ids_kept() {
    let b = Broker::start().await;
    let raw = r#"{"items":[{"queue":"raw","payload":{"z": 1,  "a" : [1.50, "é"]},"traceId":"0198f2c1-9a7b-7d20-8e31-4c5d6e7f8a90"},{"queue":"raw","payload":null},{"queue":"raw"}]}"#;
    let (status, _) = b.post_raw("/api/v1/push", "application/json", raw.as_bytes().to_vec()).await;
    assert_eq!(status, 201);
    let stored = stored_messages(&b.sql().await, "raw", "Default").await;
    assert_eq!(stored[0].payload, r#"{"z": 1,  "a" : [1.50, "é"]}"#);
    assert_eq!(stored[0].trace_id.as_deref(), Some("0198f2c1-9a7b-7d20-8e31-4c5d6e7f8a90"));
    assert_eq!(stored[1].payload, "null");
    assert_eq!(stored[2].payload, "null");
    assert_eq!(stored[1].trace_id, None);
}

#[tokio::test]
async fn the_broker_mints_a_transaction_id_when_it_is_absent_or_empty() {
    let b = Broker::start().await;
    let (status, body) =
        b.post("/api/v1/push", json!({"items": [{"queue": "q", "payload": 1}, {"queue": "q", "transactionId": ""}]})).await;
    assert_eq!(status, 201);
    let r = results(&body);
    for item in r {
        assert_eq!(item["status"], "queued");
        assert_eq!(item["transactionId"], item["messageId"], "the minted id is the message id's text");
    }
    assert_ne!(r[0]["transactionId"], r[1]["transactionId"]);
}

#[tokio::test]
async fn an_empty_items_array_answers_201_with_an_empty_array() {
    let b = Broker::start().await;
    let (status, body) = b.post("/api/v1/push", json!({"items": []})).await;
    assert_eq!((status, body), (201, json!([])));
}

#[tokio::test]
async fn inside_one_request_the_first_transaction_id_wins() {
    let b = Broker::start().await;
    let (status, body) = b
        .post(
            "/api/v1/push",
            json!({"items": [
                {"queue": "d", "payload": "first", "transactionId": "t"},
                {"queue": "d", "payload": "other", "transactionId": "u"},
                {"queue": "d", "payload": "second", "transactionId": "t"},
                {"queue": "d", "partition": "elsewhere", "payload": "third", "transactionId": "t"},
            ]}),
        )
        .await;
    assert_eq!(status, 201);
    let r = results(&body);
    let statuses: Vec<&str> = r.iter().map(|i| i["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["queued", "queued", "duplicate", "queued"], "dedup is per (queue, partition)");
    assert_eq!(r[2]["messageId"], r[0]["messageId"], "a duplicate carries the leader's id");
    let stored = stored_messages(&b.sql().await, "d", "Default").await;
    assert_eq!(stored.iter().map(|m| m.payload.as_str()).collect::<Vec<_>>(), [r#""first""#, r#""other""#]);
}

#[tokio::test]
async fn a_repeat_across_requests_is_a_duplicate_with_the_original_id_and_writes_nothing() {
    let b = Broker::start().await;
    let (_, first) = b.post("/api/v1/push", json!({"items": [{"queue": "x", "payload": 1, "transactionId": "t1"}]})).await;
    let (status, again) = b
        .post(
            "/api/v1/push",
            json!({"items": [{"queue": "x", "payload": 2, "transactionId": "t1"}, {"queue": "x", "payload": 3, "transactionId": "t2"}]}),
        )
        .await;
    assert_eq!(status, 201);
    let r = results(&again);
    assert_eq!(r[0]["status"], "duplicate");
    assert_eq!(r[0]["messageId"], first[0]["messageId"]);
    assert_eq!(r[0]["partitionId"], first[0]["partitionId"]);
    assert_eq!(r[1]["status"], "queued");
    let stored = stored_messages(&b.sql().await, "x", "Default").await;
    assert_eq!(stored.iter().map(|m| (m.offset, m.payload.as_str())).collect::<Vec<_>>(), [(0, "1"), (1, "3")]);

    // A push made only of duplicates writes no segment at all.
    let (_, all_dup) = b.post("/api/v1/push", json!({"items": [{"queue": "x", "payload": 9, "transactionId": "t2"}]})).await;
    assert_eq!(all_dup[0]["status"], "duplicate");
    let sql = b.sql().await;
    let segments: i64 = sql.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get(0);
    assert_eq!(segments, 2);
    let last: i64 = sql.query_one("SELECT last_offset FROM queen.partitions", &[]).await.unwrap().get(0);
    assert_eq!(last, 1);
}

#[tokio::test]
async fn deduplication_ends_with_the_queues_window() {
    let b = Broker::start().await;
    let push = |payload: i32| json!({"items": [{"queue": "w", "payload": payload, "transactionId": "same"}]});
    b.post("/api/v1/push", push(1)).await;
    b.sql().await.execute("UPDATE queen.queues SET dedup_window_seconds = 1 WHERE name = 'w'", &[]).await.unwrap();
    let (_, inside) = b.post("/api/v1/push", push(2)).await;
    assert_eq!(inside[0]["status"], "duplicate");
    // The window is the rule under test: let it pass.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (_, after) = b.post("/api/v1/push", push(3)).await;
    assert_eq!(after[0]["status"], "queued");
    let (_, again) = b.post("/api/v1/push", push(4)).await;
    assert_eq!(again[0]["status"], "duplicate", "the re-pushed id opens a new window");
    assert_eq!(again[0]["messageId"], after[0]["messageId"]);
}

#[tokio::test]
async fn a_queue_with_a_zero_window_does_not_deduplicate_across_requests() {
    let b = Broker::start().await;
    let push = json!({"items": [{"queue": "z", "payload": 1, "transactionId": "same"}]});
    b.post("/api/v1/push", push.clone()).await;
    b.sql().await.execute("UPDATE queen.queues SET dedup_window_seconds = 0 WHERE name = 'z'", &[]).await.unwrap();
    let (_, r) = b.post("/api/v1/push", push).await;
    assert_eq!(r[0]["status"], "queued");
    assert_eq!(stored_messages(&b.sql().await, "z", "Default").await.len(), 2);
}

#[tokio::test]
async fn an_implicit_queue_gets_labels_from_its_dotted_name_and_a_60_second_lease() {
    let b = Broker::start().await;
    for q in ["billing.invoices.v2", "plain"] {
        let (status, _) = b.post("/api/v1/push", json!({"items": [{"queue": q, "payload": 1}]})).await;
        assert_eq!(status, 201);
    }
    let sql = b.sql().await;
    let rows = sql.query("SELECT name, namespace, task, lease_time, dedup_window_seconds, dead_letter_queue FROM queen.queues ORDER BY name", &[]).await.unwrap();
    let got: Vec<(String, String, String, i32, i32, bool)> =
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))).collect();
    assert_eq!(
        got,
        [
            ("billing.invoices.v2".into(), "billing".into(), "invoices".into(), 60, 3600, true),
            ("plain".into(), "plain".into(), "".into(), 60, 3600, true),
        ]
    );
}

#[tokio::test]
async fn bad_push_bodies_answer_400_naming_the_item_and_field() {
    let b = Broker::start().await;
    let cases: Vec<(&str, &str)> = vec![
        (r#"{"items":[{"queue":"q"},{"queue":7}]}"#, "items[1].queue"),
        (r#"{"items":[{"payload":1}]}"#, "items[0].queue"),
        (r#"{"items":[{"queue":"q","partition":5}]}"#, "items[0].partition"),
        (r#"{"items":[{"queue":"q","transactionId":{}}]}"#, "items[0].transactionId"),
        (r#"{"items":[{"queue":"q","traceId":"not-a-uuid"}]}"#, "items[0].traceId"),
        (r#"{"items":"nope"}"#, "items"),
        (r#"{"nothing":true}"#, "items"),
        (r#"{"items":[{"queue":"q"}"#, "bad body"),
        ("", "bad body"),
    ];
    for (body, field) in cases {
        let (status, answer) = b.post_raw("/api/v1/push", "application/json", body.as_bytes().to_vec()).await;
        assert_eq!(status, 400, "{body}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(field), "{body}: {error}");
    }
    let long = "q".repeat(256);
    let (status, answer) = b.post("/api/v1/push", json!({"items": [{"queue": long}]})).await;
    assert_eq!(status, 400);
    assert_eq!(answer["error"], "items[0].queue: longer than 255 bytes");
    let (status, answer) = b.post_raw("/api/v1/push", "application/json", b"{\"items\":[{\"queue\":\"\xff\"}]}".to_vec()).await;
    assert_eq!(status, 400);
    assert!(answer["error"].as_str().unwrap().contains("UTF-8"));
    // Nothing was written by any of them, and the broker still serves.
    let count: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get(0);
    assert_eq!(count, 0);
    let (status, _) = b.post("/api/v1/push", json!({"items": [{"queue": "q"}]})).await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn a_body_over_the_limit_answers_413_json() {
    let b = Broker::start_with(&[("QUEEN_MAX_BODY_BYTES", "2048")]).await;
    let big = json!({"items": [{"queue": "q", "payload": "x".repeat(4000)}]});
    let (status, body) = b.post("/api/v1/push", big).await;
    assert_eq!(status, 413);
    assert_eq!(body["error"], "request body larger than 2048 bytes");
    let (status, _) = b.post("/api/v1/push", json!({"items": [{"queue": "q", "payload": "small"}]})).await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn fifty_concurrent_pushers_to_one_partition_get_gap_free_offsets_in_few_segments() {
    let b = Broker::start().await;
    const PUSHERS: usize = 50;
    const EACH: usize = 20;
    let mut tasks = Vec::new();
    for p in 0..PUSHERS {
        let http = b.http.clone();
        let url = format!("{}/api/v1/push", b.url);
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let body = json!({"items": [{"queue": "hot", "payload": {"p": p, "i": i}, "transactionId": format!("{p}-{i}")}]});
                let r = http.post(&url).json(&body).send().await.unwrap();
                assert_eq!(r.status().as_u16(), 201);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = (PUSHERS * EACH) as i64;
    let sql = b.sql().await;
    let last: i64 = sql.query_one("SELECT last_offset FROM queen.partitions", &[]).await.unwrap().get(0);
    assert_eq!(last, n - 1);
    let segs = sql.query("SELECT base_offset, end_offset FROM queen.segments ORDER BY base_offset", &[]).await.unwrap();
    let mut expect = 0i64;
    for s in &segs {
        assert_eq!(s.get::<_, i64>(0), expect, "segments are contiguous");
        expect = s.get::<_, i64>(1) + 1;
    }
    assert_eq!(expect, n);
    assert!((segs.len() as i64) < n / 2, "{} segments for {n} messages: pushes were not coalesced", segs.len());
    let stored = stored_messages(&sql, "hot", "Default").await;
    let offsets: Vec<i64> = stored.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (0..n).collect::<Vec<_>>());
    let txns: HashSet<&str> = stored.iter().map(|m| m.transaction_id.as_str()).collect();
    assert_eq!(txns.len() as i64, n, "every message stored exactly once");
    // Each partition's order is each pusher's order.
    for p in 0..PUSHERS {
        let mine: Vec<usize> = stored
            .iter()
            .filter(|m| m.transaction_id.starts_with(&format!("{p}-")))
            .map(|m| m.transaction_id.split('-').nth(1).unwrap().parse().unwrap())
            .collect();
        assert_eq!(mine, (0..EACH).collect::<Vec<_>>());
    }
    let hashes: i64 = sql
        .query_one("SELECT count(DISTINCT h) FROM queen.segments s, unnest(s.txn_hashes) h", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(hashes, n, "each segment carries one hash per message");
}

/// Batch-1 producers spread over many partitions of several queues: their
/// segments are committed in groups (one writer, so groups must form), each
/// group one call of the write function whatever queues it spans, and every
/// partition still gets gap-free offsets in each pusher's order.
#[tokio::test]
async fn thin_pushes_over_many_partitions_are_group_committed_gap_free() {
    let mut b = common::broker_counting_calls(&[("QUEEN_PUSH_GROUP_WRITERS", "1")]).await;
    const QUEUES: usize = 8;
    const PUSHERS: usize = 48;
    const EACH: usize = 10;
    const PARTITIONS: usize = 16;
    let mut tasks = Vec::new();
    for p in 0..PUSHERS {
        let http = b.http.clone();
        let url = format!("{}/api/v1/push", b.url);
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                // Several queues, so groups also span queues.
                let queue = format!("thin.q{}", p % QUEUES);
                let partition = format!("p{}", p % PARTITIONS);
                let body = json!({"items": [{"queue": queue, "partition": partition, "payload": {"p": p, "i": i},
                                             "transactionId": format!("{p}-{i}")}]});
                let r = http.post(&url).json(&body).send().await.unwrap();
                assert_eq!(r.status().as_u16(), 201);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let sql = b.sql().await;
    let mut total = 0;
    for queue in (0..QUEUES).map(|q| format!("thin.q{q}")) {
        for part in 0..PARTITIONS {
            let stored = stored_messages(&sql, &queue, &format!("p{part}")).await;
            if stored.is_empty() {
                continue;
            }
            let offsets: Vec<i64> = stored.iter().map(|m| m.offset).collect();
            assert_eq!(offsets, (0..stored.len() as i64).collect::<Vec<_>>(), "{queue}/p{part} is gap-free");
            for p in (0..PUSHERS).filter(|p| p % PARTITIONS == part) {
                let mine: Vec<usize> = stored
                    .iter()
                    .filter(|m| m.transaction_id.starts_with(&format!("{p}-")))
                    .map(|m| m.transaction_id.split('-').nth(1).unwrap().parse().unwrap())
                    .collect();
                assert!(mine.is_empty() || mine == (0..EACH).collect::<Vec<_>>(), "pusher {p} in order: {mine:?}");
            }
            total += stored.len();
        }
    }
    assert_eq!(total, PUSHERS * EACH, "every push stored once");
    let segments: i64 = sql.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get(0);
    let text = b.prometheus().await;
    let metric = |name: &str| common::sample(&text, name).unwrap_or(0.0);
    let (grouped, groups) = (metric("queen_push_group_segments_sum"), metric("queen_push_group_segments_count"));
    assert_eq!(grouped as i64, segments, "every segment went through a group commit");
    assert!(groups < grouped, "{groups} group commits for {grouped} segments: no group carried two");
    drop(sql);
    assert_eq!(metric("queen_push_known_missed_segments_total"), 0.0, "one broker's memory is never behind its partitions");
    let calls = common::calls_after_exit(&mut b).await;
    // A group is one call whatever queues it spans: the one statement when
    // the dedup memory covers every segment (the partition was written by
    // this broker before), else the checking function.
    let (known, checked) = (calls("push_known_segments_v1"), calls("push_segments_of_queues_v1"));
    assert!(known > 0 && checked > 0, "{known} known writes, {checked} checked");
    assert_eq!((known + checked) as f64, groups, "one call a group, whatever queues it spans");
    assert!(checked <= (QUEUES * PARTITIONS) as i64, "{checked} checked calls: only a group with a partition's first write needs one");
    assert_eq!(calls("push_segment_without_window_v1"), 0, "every queue keeps a window");
}

/// The transactionId hasher of the test's database (its `queen.dedup_key`).
async fn database_hasher(sql: &tokio_postgres::Client) -> queen::log::TxnHasher {
    let key: Vec<u8> = sql.query_one("SELECT key FROM queen.dedup_key", &[]).await.unwrap().get(0);
    queen::log::TxnHasher::new(&key.try_into().expect("a 16-byte key"))
}

/// The hashes that decide what is a duplicate are keyed per database: the
/// same transactionId hashes differently in two databases, and never to the
/// public unkeyed value, so a producer cannot craft an id that collides with
/// another producer's (issue 45). What each stores is its key's SipHash.
#[tokio::test]
async fn transaction_id_hashes_are_keyed_with_a_secret_of_the_database() {
    let (one, two) = (Broker::start().await, Broker::start().await);
    let mut stored = Vec::new();
    for b in [&one, &two] {
        b.push_to("keyed", "p", &[json!({"n": 1})]).await;
        let sql = b.sql().await;
        let hashes: Vec<i64> = sql
            .query_one("SELECT s.txn_hashes FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id WHERE p.name = 'p'", &[])
            .await
            .unwrap()
            .get(0);
        let txn = stored_messages(&sql, "keyed", "p").await[0].transaction_id.clone();
        assert_eq!(hashes, vec![database_hasher(&sql).await.hash(&txn)], "the stored hash is the database key's");
        assert_ne!(hashes[0], queen::log::legacy_index_hash(&txn), "not the public unkeyed hash");
        stored.push((txn, hashes[0]));
    }
    // The same id in both databases, hashed with each one's key.
    let id = "the-same-id";
    let (h1, h2) = (database_hasher(&one.sql().await).await.hash(id), database_hasher(&two.sql().await).await.hash(id));
    assert_ne!(h1, h2, "two databases hold two keys");
    // A repeat is still a repeat under the key.
    let item = json!({"items": [{"queue": "keyed", "partition": "p", "transactionId": stored[0].0, "payload": 2}]});
    let (status, again) = one.post("/api/v1/push", item).await;
    assert_eq!((status, again[0]["status"].as_str()), (201, Some("duplicate")), "{again}");
}

/// `queen.push_segments_with_memory_v1` applies the duplicate rule per
/// segment: a segment holding a frame already in its partition's window is
/// refused whole (offsets given back, no hashes kept), its neighbours in the
/// same call are written. Called as a broker that knows nothing of the
/// partitions (every segment in the window is checked).
#[tokio::test]
async fn a_group_call_refuses_only_the_segment_with_a_duplicate() {
    let b = Broker::start().await;
    let first = b.push_to("grp", "b", &[json!("original")]).await;
    let original = first[0]["messageId"].as_str().unwrap().to_string();
    let sql = b.sql().await;
    let dup = database_hasher(&sql).await.hash(first[0]["transactionId"].as_str().unwrap());
    let blobs = vec![blob(&["a1", "a2"]), blob(&["b1", "dup"]), blob(&["c1"])];
    let rows = sql
        .query(
            "SELECT o_seg, o_base_offset, o_dup_index, o_seg_blob FROM queen.push_segments_with_memory_v1('grp', $1, $2, $3, $4, $5, $6, $7)
             WHERE o_seen_base IS NULL ORDER BY o_seg, o_dup_index",
            &[
                &vec!["a", "b", "c"],
                &vec![2i32, 2, 1],
                &blobs,
                &vec![11i64, 12, 21, dup, 31],
                &vec![None::<i64>; 3],
                &vec![None::<i64>; 3],
                &vec![None::<i32>; 3],
            ],
        )
        .await
        .unwrap();
    let got: Vec<(i32, Option<i64>, Option<i32>)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(got, vec![(1, Some(0), None), (2, None, Some(1)), (3, Some(0), None)]);
    assert!(rows[1].get::<_, Option<Vec<u8>>>(3).is_some(), "the duplicate row carries the original's segment");
    let last = |p: &'static str| {
        let sql = &sql;
        async move {
            sql.query_one(
                "SELECT p.last_offset FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'grp' AND p.name = $1",
                &[&p],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
        }
    };
    assert_eq!((last("a").await, last("b").await, last("c").await), (1, 0, 0), "b's offsets were given back");
    let b_hashes: Vec<i64> = sql
        .query_one(
            "SELECT array_agg(h) FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id, unnest(s.txn_hashes) h
             WHERE p.name = 'b'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(b_hashes, vec![dup], "only the original's hash is stored in b");
    let stored_b = stored_messages(&sql, "grp", "b").await;
    assert_eq!(stored_b.len(), 1);
    assert_eq!(stored_b[0].message_id, original);

    let twice = sql
        .query(
            "SELECT * FROM queen.push_segments_with_memory_v1('grp', $1, $2, $3, $4, $5, $6, $7)",
            &[
                &vec!["a", "a"],
                &vec![1i32, 1],
                &vec![blob(&["x"]), blob(&["y"])],
                &vec![91i64, 92],
                &vec![None::<i64>; 2],
                &vec![None::<i64>; 2],
                &vec![None::<i32>; 2],
            ],
        )
        .await
        .unwrap_err();
    let message = twice.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
    assert!(message.contains("a partition appears twice"), "{twice:?}");
}

/// A segment blob of frames with these transactionIds (payload `1`).
fn blob(frames: &[&str]) -> Vec<u8> {
    let mut raw = Vec::new();
    for f in frames {
        let frame = queen::log::Frame {
            message_id: uuid::Uuid::now_v7(),
            trace_id: None,
            transaction_id: f,
            producer_sub: None,
            encrypted: false,
            payload: b"1",
        };
        frame.encode_into(&mut raw).expect("test frame fits");
    }
    queen::log::compress_frames(&raw, 3)
}

/// `queen.push_segments_of_queues_v1` writes segments of several queues in
/// one call, each by its own queue's rules: a queue without a window keeps
/// no hashes and checks nothing, a duplicate in a queue with one refuses
/// only its segment, a queue the call names first is created (with the
/// default window), and each row names its segment by its place in the
/// call, whatever order the locks were taken in.
#[tokio::test]
async fn one_call_writes_the_segments_of_several_queues_each_by_its_window() {
    let b = Broker::start().await;
    let (status, _) = b.post("/api/v1/configure", json!({"queue": "plain", "options": {"dedupWindowSeconds": 0}})).await;
    assert_eq!(status, 200);
    let first = b.push_to("kept", "b", &[json!("original")]).await;
    let sql = b.sql().await;
    let dup = database_hasher(&sql).await.hash(first[0]["transactionId"].as_str().unwrap());
    let rows = sql
        .query(
            "SELECT o_seg, o_window, o_base_offset, o_dup_index FROM queen.push_segments_of_queues_v1($1, $2, $3, $4, $5, $6, $7, $8)
             WHERE o_seen_base IS NULL ORDER BY o_seg",
            &[
                &vec!["plain", "kept", "new.q", "kept"],
                &vec!["a", "b", "z", "a"],
                &vec![1i32, 2, 1, 1],
                &vec![blob(&["x"]), blob(&["b1", "dup"]), blob(&["z1"]), blob(&["a1"])],
                &vec![41i64, 42, dup, 43, 44],
                &vec![None::<i64>; 4],
                &vec![None::<i64>; 4],
                &vec![None::<i32>; 4],
            ],
        )
        .await
        .unwrap();
    let got: Vec<(i32, i32, Option<i64>, Option<i32>)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    assert_eq!(got, vec![(1, 0, Some(0), None), (2, 3600, None, Some(1)), (3, 3600, Some(0), None), (4, 3600, Some(0), None)]);
    let stored: Vec<(String, String, i64, Option<Vec<i64>>)> = sql
        .query(
            "SELECT q.name, p.name, p.last_offset, s.txn_hashes FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
             LEFT JOIN queen.segments s ON s.partition_id = p.id ORDER BY q.name, p.name, s.base_offset",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let expected = vec![
        ("kept".to_string(), "a".to_string(), 0, Some(vec![44])),
        ("kept".into(), "b".into(), 0, Some(vec![dup])),
        ("new.q".into(), "z".into(), 0, Some(vec![43])),
        ("plain".into(), "a".into(), 0, None),
    ];
    assert_eq!(stored, expected, "b's offsets were given back; only queues with a window keep hashes");
}

/// API.md §3: flag-8 groups are stored as they came, and repacked only when
/// deduplication drops a frame.
#[tokio::test]
async fn a_flag_8_group_is_stored_as_it_came_and_repacked_when_a_duplicate_drops_a_frame() {
    let b = Broker::start().await;
    // Level 19 differs from the broker's level 3: equal bytes prove no recompression.
    let (body, z, ids) = common::flag8_body("bin", "p", &[("a1", r#"{"n":1}"#), ("a2", r#"{"n":2}"#)], 19);
    let (status, answer) = b.post_raw("/api/v1/push", "application/octet-stream", body).await;
    assert_eq!(status, 201, "{answer}");
    let statuses: Vec<&str> = results(&answer).iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["queued", "queued"]);
    let returned: Vec<String> = results(&answer).iter().map(|r| r["messageId"].as_str().unwrap().to_string()).collect();
    assert_eq!(returned, ids.iter().map(|i| i.to_string()).collect::<Vec<_>>(), "the client's ids are kept");
    let sql = b.sql().await;
    let blobs: Vec<Vec<u8>> =
        sql.query("SELECT blob FROM queen.segments ORDER BY base_offset", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(blobs, vec![z], "the group became the segment byte for byte");

    // The broker did not encode frames for a group it stores whole; the
    // repack below reads them back out of the client's blob.
    let (body, z2, ids2) = common::flag8_body("bin", "p", &[("a2", r#"{"n":2}"#), ("a3", r#"{"n":3}"#)], 19);
    let (status, answer) = b.post_raw("/api/v1/push", "application/octet-stream", body).await;
    assert_eq!(status, 201, "{answer}");
    let statuses: Vec<&str> = results(&answer).iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["duplicate", "queued"]);
    let blobs: Vec<Vec<u8>> =
        sql.query("SELECT blob FROM queen.segments ORDER BY base_offset", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(blobs.len(), 2);
    assert_ne!(blobs[1], z2, "a dropped frame means a repacked segment");
    let stored = stored_messages(&sql, "bin", "p").await;
    let txns: Vec<(i64, &str, &str)> = stored.iter().map(|m| (m.offset, m.transaction_id.as_str(), m.payload.as_str())).collect();
    assert_eq!(txns, vec![(0, "a1", r#"{"n":1}"#), (1, "a2", r#"{"n":2}"#), (2, "a3", r#"{"n":3}"#)]);
    let kept: Vec<String> = [ids[0], ids[1], ids2[1]].iter().map(|i| i.to_string()).collect();
    assert_eq!(stored.iter().map(|m| m.message_id.clone()).collect::<Vec<_>>(), kept, "the repack keeps the client's ids");
}

#[tokio::test]
async fn acknowledged_pushes_survive_a_broker_crash() {
    let mut b = Broker::start().await;
    let (status, body) = b
        .post("/api/v1/push", json!({"items": [{"queue": "durable", "payload": "kept", "transactionId": "k1"}]}))
        .await;
    assert_eq!(status, 201);
    b.restart().await; // kill -9, then start again
    let (_, again) = b.post("/api/v1/push", json!({"items": [{"queue": "durable", "payload": "x", "transactionId": "k1"}, {"queue": "durable", "payload": "next", "transactionId": "k2"}]})).await;
    assert_eq!(again[0]["status"], "duplicate");
    assert_eq!(again[0]["messageId"], body[0]["messageId"]);
    assert_eq!(again[1]["status"], "queued");
    let stored = stored_messages(&b.sql().await, "durable", "Default").await;
    assert_eq!(stored.iter().map(|m| (m.offset, m.payload.as_str())).collect::<Vec<_>>(), [(0, r#""kept""#), (1, r#""next""#)]);
}

#[tokio::test]
async fn a_graceful_shutdown_commits_every_push_it_answered() {
    let mut b = Broker::start_with(&[("QUEEN_V2_FUSION_HOLD_MS", "20")]).await;
    let mut tasks = Vec::new();
    for p in 0..20 {
        let http = b.http.clone();
        let url = format!("{}/api/v1/push", b.url);
        tasks.push(tokio::spawn(async move {
            let mut ok = Vec::new();
            for i in 0..200 {
                let txn = format!("{p}-{i}");
                let body = json!({"items": [{"queue": "drain", "partition": format!("p{}", p % 4), "payload": i, "transactionId": txn}]});
                match http.post(&url).json(&body).send().await {
                    Ok(r) if r.status().as_u16() == 201 => ok.push(txn),
                    _ => break,
                }
            }
            ok
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let code = b.terminate().await;
    assert_eq!(code, Some(0), "a graceful shutdown exits 0");
    let mut answered = HashSet::new();
    for t in tasks {
        answered.extend(t.await.unwrap());
    }
    assert!(!answered.is_empty());
    let sql = b.sql().await;
    let mut stored = HashSet::new();
    for p in 0..4 {
        for m in stored_messages(&sql, "drain", &format!("p{p}")).await {
            stored.insert(m.transaction_id);
        }
    }
    let lost: Vec<_> = answered.difference(&stored).collect();
    assert!(lost.is_empty(), "answered 201 but not stored: {lost:?}");
}

#[tokio::test]
async fn unknown_api_routes_answer_json_404() {
    let b = Broker::start().await;
    let (status, body) = b.get("/api/v1/nothing-here").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"], "no such route: GET /api/v1/nothing-here");
    let (status, body) = b.get("/api/v1/push").await;
    assert_eq!(status, 405);
    assert_eq!(body["error"], "method not allowed");
}

/// A queue with a dedup window (or one not yet known) is written through
/// `push_segments_of_queues_v1` until the broker's dedup memory covers the
/// partition, then through `push_known_segments_v1`, and a duplicate the
/// broker remembers is answered without a write; once the broker knows a queue keeps no window,
/// its segments go to `push_segment_without_window_v1`, which keeps no
/// hashes. The previous version's names are wrappers nothing here calls. What is known
/// outlives the partition's lane (each push here finds its lane gone).
#[tokio::test]
async fn each_queue_is_written_through_the_function_its_window_calls_for() {
    let mut b = common::broker_counting_calls(&[]).await;
    let (status, _) = b.post("/api/v1/configure", json!({"queue": "w0", "options": {"dedupWindowSeconds": 0}})).await;
    assert_eq!(status, 200);
    for i in 0..4 {
        for queue in ["dd", "w0"] {
            let item = json!({"queue": queue, "partition": "p", "payload": i, "transactionId": format!("{queue}-{i}")});
            assert_eq!(b.post("/api/v1/push", json!({ "items": [item] })).await.0, 201);
        }
    }
    // The same id again: still refused as a duplicate on the direct path.
    let again = json!({"queue": "dd", "partition": "p", "payload": 9, "transactionId": "dd-2"});
    let (status, body) = b.post("/api/v1/push", json!({ "items": [again] })).await;
    assert_eq!((status, body[0]["status"].as_str()), (201, Some("duplicate")), "{body}");
    let sql = b.sql().await;
    let entries: i64 = sql
        .query_one("SELECT count(*) FROM queen.txn_index t JOIN queen.partitions p ON p.id = t.partition_id JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'w0'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(entries, 0, "no queue keeps an index");
    let hashed: Vec<(String, i64)> = sql
        .query(
            "SELECT q.name, count(s.txn_hashes) FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
             JOIN queen.queues q ON q.id = p.queue_id GROUP BY q.name ORDER BY q.name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(hashed, vec![("dd".to_string(), 4), ("w0".to_string(), 0)], "only a queue with a window stores hashes");
    drop(sql);
    let calls = common::calls_after_exit(&mut b).await;
    assert_eq!(calls("push_segments_of_queues_v1"), 2, "dd's first write and w0's first (nothing known of either)");
    assert_eq!(calls("push_known_segments_v1"), 3, "dd's writes its dedup memory covers");
    assert_eq!(calls("push_segment_without_window_v1"), 3, "w0's writes once its window is known");
    let wrappers = (calls("push_segments_with_memory_v1"), calls("push_segments_v2"), calls("push_segment_v1"));
    assert_eq!(wrappers, (0, 0, 0), "the one-queue functions are the previous versions'");
}

/// The ids of a push answer by transactionId: (status, messageId).
fn by_txn(body: &Value) -> std::collections::HashMap<String, (String, String)> {
    results(body)
        .iter()
        .map(|r| {
            let field = |f: &str| r[f].as_str().unwrap().to_string();
            (field("transactionId"), (field("status"), field("messageId")))
        })
        .collect()
}

/// Pushes ids `id-N` for N in `ids` to shared/p through `broker`.
async fn push_ids(broker: &Broker, ids: std::ops::Range<i32>) -> std::collections::HashMap<String, (String, String)> {
    let items: Vec<Value> =
        ids.map(|i| json!({"queue": "shared", "partition": "p", "payload": i, "transactionId": format!("id-{i}")})).collect();
    let (status, answer) = broker.post("/api/v1/push", json!({ "items": items })).await;
    assert_eq!(status, 201, "{answer}");
    by_txn(&answer)
}

/// Deduplication stays exact when two brokers write one partition and
/// across a restart: each broker remembers what it wrote, and PostgreSQL
/// checks what it has not seen under the partition lock (`push::dedup`).
#[tokio::test]
async fn two_brokers_on_one_partition_store_each_id_once_and_answer_the_originals() {
    let mut a = Broker::start().await;
    let b = a.peer().await;
    let first = push_ids(&a, 0..50).await;
    assert!(first.values().all(|(s, _)| s == "queued"));
    // b has never written the partition: PostgreSQL checks the whole window.
    let second = push_ids(&b, 25..75).await;
    for i in 25..75 {
        let txn = format!("id-{i}");
        if i < 50 {
            assert_eq!(second[&txn], ("duplicate".to_string(), first[&txn].1.clone()), "{txn}: a's original");
        } else {
            assert_eq!(second[&txn].0, "queued", "{txn}");
        }
    }
    // a's memory is behind b's write: its one-statement write passes the
    // partition over, and PostgreSQL checks what a has not seen.
    let third = push_ids(&a, 60..80).await;
    for i in 60..80 {
        let txn = format!("id-{i}");
        let want = if i < 75 { ("duplicate".to_string(), second[&txn].1.clone()) } else { ("queued".to_string(), third[&txn].1.clone()) };
        assert_eq!(third[&txn], want, "{txn}");
    }
    let missed = common::sample(&a.prometheus().await, "queen_push_known_missed_segments_total");
    assert_eq!(missed, Some(1.0), "a's known write of 60..80 was passed over once, then checked");
    // And after a restart a remembers nothing.
    a.restart().await;
    let again = push_ids(&a, 0..10).await;
    for (txn, answer) in &again {
        assert_eq!(answer, &("duplicate".to_string(), first[txn].1.clone()), "{txn}");
    }
    // Both at once, on the same new ids: each stored once, both answered
    // with the one message id.
    for round in 0..4 {
        let ids = 1000 + round * 100..1100 + round * 100;
        let (x, y) = tokio::join!(push_ids(&a, ids.clone()), push_ids(&b, ids.clone()));
        for i in ids {
            let txn = format!("id-{i}");
            let statuses = [x[&txn].0.as_str(), y[&txn].0.as_str()];
            assert!(statuses.contains(&"queued") && statuses.contains(&"duplicate"), "{txn}: {statuses:?}");
            assert_eq!(x[&txn].1, y[&txn].1, "{txn}: one message id");
        }
    }
    let stored = stored_messages(&a.sql().await, "shared", "p").await;
    let txns: HashSet<&str> = stored.iter().map(|m| m.transaction_id.as_str()).collect();
    assert_eq!((stored.len(), txns.len()), (480, 480), "80 ids, then 4 x 100, each stored once");
}

/// A failover to a standby that lagged loses the last writes, which the
/// broker's dedup memory still holds. Simulated here by removing the last
/// segment and moving the partition's tail back: a lost id is new again,
/// and an id now at a lost id's offset is not mistaken for it.
#[tokio::test]
async fn ids_a_failover_lost_are_new_again_and_their_offsets_mean_the_new_messages() {
    let b = Broker::start().await;
    let b = &b;
    let push = |txn: &'static str| async move {
        let (status, answer) =
            b.post("/api/v1/push", json!({"items": [{"queue": "lag", "partition": "p", "payload": txn, "transactionId": txn}]})).await;
        assert_eq!(status, 201, "{answer}");
        (answer[0]["status"].as_str().unwrap().to_string(), answer[0]["messageId"].as_str().unwrap().to_string())
    };
    assert_eq!(push("kept").await.0, "queued");
    assert_eq!(push("lost").await.0, "queued");
    b.sql()
        .await
        .batch_execute(
            "DELETE FROM queen.segments WHERE base_offset = 1;
             UPDATE queen.partitions SET last_offset = 0;",
        )
        .await
        .unwrap();
    let new = push("other").await; // written at offset 1, where "lost" was
    assert_eq!(new.0, "queued");
    let again = push("lost").await;
    assert_eq!(again.0, "queued", "its message was lost: a new one");
    assert_eq!(push("other").await, ("duplicate".to_string(), new.1.clone()));
    assert_eq!(push("lost").await, ("duplicate".to_string(), again.1.clone()));
    assert_eq!(push("kept").await.0, "duplicate");
    let stored: Vec<String> = stored_messages(&b.sql().await, "lag", "p").await.into_iter().map(|m| m.transaction_id).collect();
    assert_eq!(stored, ["kept", "other", "lost"]);
}

/// The one-statement write trusts the broker's dedup memory only as far as
/// the window it kept: after the queue's window is widened (through another
/// broker, so this one still sees the old window), an id the
/// memory has let go of (it left the old window) is still in the new one,
/// so the write passes the partition over and PostgreSQL's check refuses
/// the id with its original's message id.
#[tokio::test]
async fn a_window_widened_under_the_memory_is_checked_by_postgres() {
    // No purge pass: the hashes of the old window must stay in the segments.
    let b = Broker::start_with(&[("RETENTION_INTERVAL", "3600000")]).await;
    assert_eq!(b.post("/api/v1/configure", json!({"queue": "ww", "options": {"dedupWindowSeconds": 1}})).await.0, 200);
    let push = |txn: &'static str| {
        let b = &b;
        async move {
            let (status, answer) =
                b.post("/api/v1/push", json!({"items": [{"queue": "ww", "partition": "p", "payload": txn, "transactionId": txn}]})).await;
            assert_eq!(status, 201, "{answer}");
            (answer[0]["status"].as_str().unwrap().to_string(), answer[0]["messageId"].as_str().unwrap().to_string())
        }
    };
    let (status, original) = push("x").await;
    assert_eq!(status, "queued");
    // The memory keeps a hash 5 s past its window (push::dedup's EDGE_US).
    tokio::time::sleep(Duration::from_millis(6500)).await;
    // y's write lets x go from the memory (it left the one-second window).
    assert_eq!(push("y").await.0, "queued");
    // Widened through another broker: this one still sees the old window.
    let other = b.peer().await;
    assert_eq!(other.post("/api/v1/configure", json!({"queue": "ww", "options": {"dedupWindowSeconds": 3600}})).await.0, 200);
    assert_eq!(push("x").await, ("duplicate".to_string(), original), "x is inside the widened window");
    let missed = common::sample(&b.prometheus().await, "queen_push_known_missed_segments_total");
    assert_eq!(missed, Some(1.0), "the memory's window was narrower than the queue's: the write was checked");
    let stored: Vec<String> = stored_messages(&b.sql().await, "ww", "p").await.into_iter().map(|m| m.transaction_id).collect();
    assert_eq!(stored, ["x", "y"]);
}

/// A broker of the previous version, during a rolling upgrade, still calls
/// `queen.push_segments_v2` and `queen.push_segment_v1` (issue 44 §5): both
/// are wrappers of the renamed functions, with their answers' shapes, and a
/// duplicate through the wrapper is still refused.
#[tokio::test]
async fn the_previous_versions_push_functions_still_write_through_their_wrappers() {
    let b = Broker::start().await;
    assert_eq!(b.post("/api/v1/configure", json!({"queue": "plain", "options": {"dedupWindowSeconds": 0}})).await.0, 200);
    b.push_to("windowed", "p", &[json!("first")]).await;
    let sql = b.sql().await;
    let blob = |txn: &str| {
        let mut raw = Vec::new();
        queen::log::Frame { message_id: uuid::Uuid::now_v7(), trace_id: None, transaction_id: txn, producer_sub: None, encrypted: false, payload: b"7" }
            .encode_into(&mut raw).expect("test frame fits");
        queen::log::compress_frames(&raw, 3)
    };
    let one = sql
        .query_one("SELECT o_base_offset, o_window FROM queen.push_segment_v1('plain', 'p', $1, $2)", &[&vec![0i64], &blob("old-1")])
        .await
        .unwrap();
    assert_eq!((one.get::<_, Option<i64>>(0), one.get::<_, Option<i32>>(1)), (Some(0), Some(0)));
    let h = database_hasher(&sql).await.hash("old-2");
    let rows = sql
        .query(
            "SELECT o_seg, o_base_offset, o_dup_index FROM queen.push_segments_v2('windowed', $1, $2, $3, $4, $5, $6, $7) WHERE o_seen_base IS NULL",
            &[&vec!["p"], &vec![1i32], &vec![blob("old-2")], &vec![h], &vec![None::<i64>], &vec![None::<i64>], &vec![None::<i32>]],
        )
        .await
        .unwrap();
    let got: Vec<(i32, Option<i64>, Option<i32>)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(got, vec![(1, Some(1), None)], "written after the broker's first message");
    let again = sql
        .query(
            "SELECT o_dup_index FROM queen.push_segments_v2('windowed', $1, $2, $3, $4, $5, $6, $7) WHERE o_dup_index IS NOT NULL",
            &[&vec!["p"], &vec![1i32], &vec![blob("old-2")], &vec![h], &vec![None::<i64>], &vec![None::<i64>], &vec![None::<i32>]],
        )
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "the same id again is a duplicate through the wrapper too");
    assert_eq!(stored_messages(&sql, "windowed", "p").await.len(), 2);
    assert_eq!(stored_messages(&sql, "plain", "p").await.len(), 1);
}
