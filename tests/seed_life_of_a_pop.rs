//! seeds/life-of-a-pop.md, statement by statement (issue 35 §4): each test
//! is named after the sentence it holds, quoted in its doc comment, and runs
//! in both candidate modes (the hot-list and `QUEEN_HOTLIST=false`). Hold
//! this file against the page.

#[macro_use]
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
        b.until_parked(1).await;
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

/// The committed offset of (queue, partition, group), if its cursor exists.
async fn committed(b: &Broker, queue: &str, partition: &str, group: &str) -> Option<i64> {
    b.sql()
        .await
        .query_opt(
            "SELECT c.committed FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id
             JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 AND p.name = $2 AND c.consumer_group = $3",
            &[&queue, &partition, &group],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// "The worker id is a freshly minted UUIDv7 per request, and on a leased pop
/// it is what the client gets back as `leaseId`."
#[tokio::test]
async fn the_lease_id_is_a_uuid_v7_minted_per_request_and_written_as_the_worker_id() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("w", "a", &[json!(1)]).await;
        b.push_to("w", "b", &[json!(2)]).await;
        let one = b.pop("/api/v1/pop/queue/w?consumerGroup=g").await.body.expect("a batch");
        let two = b.pop("/api/v1/pop/queue/w?consumerGroup=g").await.body.expect("the other partition");
        let (l1, l2) = (one["leaseId"].as_str().unwrap(), two["leaseId"].as_str().unwrap());
        assert_ne!(l1, l2, "{mode}: one per request");
        for (lease, body) in [(l1, &one), (l2, &two)] {
            assert_eq!(uuid::Uuid::parse_str(lease).unwrap().get_version_num(), 7, "{mode}");
            let pid: i64 = body["partitionId"].as_str().unwrap().parse().unwrap();
            let worker: String = b
                .sql()
                .await
                .query_one("SELECT worker_id FROM queen.consumers WHERE partition_id = $1 AND consumer_group = 'g'", &[&pid])
                .await
                .unwrap()
                .get(0);
            assert_eq!(worker, lease, "{mode}");
        }
    }
}

/// "Step 3: subscription seeding, on first contact only ... The order of
/// preference is: 1. The durable subscription record ... 2. The pop-carried
/// intent, for a direct single-partition pop that never went through
/// registration ... 3. Otherwise `committed = -1`: deliver everything
/// retained. `__QUEUE_MODE__` is excluded from step 1 and 2 deliberately."
#[tokio::test]
async fn seeding_prefers_the_durable_record_then_a_targeted_pops_intent_then_the_beginning() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("seed", "p", &[json!("old")]).await;
        // 2: a targeted pop of a group that never registered seeds from its intent.
        assert_eq!(b.pop("/api/v1/pop/queue/seed/partition/p?consumerGroup=direct&subscriptionMode=new").await.status, 204, "{mode}");
        assert_eq!(committed(&b, "seed", "p", "direct").await, Some(0), "{mode}: at the partition's end");
        // 3: no intent, no record: the beginning.
        let r = b.pop("/api/v1/pop/queue/seed/partition/p?consumerGroup=plain&autoAck=true").await;
        assert_eq!(r.data(), [json!("old")], "{mode}");
        // Queue mode ignores the intent.
        let r = b.pop("/api/v1/pop/queue/seed/partition/p?subscriptionMode=new&autoAck=true").await;
        assert_eq!(r.data(), [json!("old")], "{mode}: queue mode never skips backlog");
        // 1: a group registered by a wildcard pop with mode all; a partition
        // that appears later is seeded from that record, not from a later intent.
        assert_eq!(b.pop("/api/v1/pop/queue/seed?consumerGroup=registered&batch=10&autoAck=true").await.data(), [json!("old")]);
        b.push_to("seed", "later", &[json!("later")]).await;
        let r = b.pop("/api/v1/pop/queue/seed/partition/later?consumerGroup=registered&subscriptionMode=new&autoAck=true").await;
        assert_eq!(r.data(), [json!("later")], "{mode}: the durable record wins over the pop's intent");
    }
}

/// The empty-partition seal "fires only when the partition is *entirely*
/// empty and unfiltered: `take = 0` also happens when segments exist but are
/// deferred by `delayedProcessing`, and sealing past those would skip live
/// messages."
#[tokio::test]
async fn a_partition_whose_messages_are_only_delayed_is_not_sealed() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.post("/api/v1/configure", json!({"queue": "late", "options": {"delayedProcessing": 1}})).await;
        b.push_to("late", "p", &[json!("soon")]).await;
        assert_eq!(b.pop("/api/v1/pop/queue/late?consumerGroup=g").await.status, 204, "{mode}: hidden");
        assert_eq!(committed(&b, "late", "p", "g").await, Some(-1), "{mode}: the cursor stays before the hidden message");
        let r = b.pop("/api/v1/pop/queue/late?consumerGroup=g&wait=true&timeout=5000&autoAck=true").await;
        assert_eq!(r.data(), [json!("soon")], "{mode}: delivered once visible");
    }
}

/// "What to expect when things go wrong: Another worker holds the lease |
/// that partition is skipped this cycle; other partitions still serve".
#[tokio::test]
async fn a_partition_another_worker_holds_is_skipped_and_the_others_still_serve() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("busy", "a", &[json!("a")]).await;
        b.push_to("busy", "b", &[json!("b")]).await;
        let held = b.pop("/api/v1/pop/queue/busy/partition/a?consumerGroup=g").await;
        assert_eq!(held.data(), [json!("a")]);
        let started = Instant::now();
        let other = b.pop("/api/v1/pop/queue/busy?consumerGroup=g").await;
        assert_eq!(other.data(), [json!("b")], "{mode}: the other partition serves");
        assert!(started.elapsed() < Duration::from_secs(2), "{mode}: skipped, not waited on");
        assert_eq!(b.pop("/api/v1/pop/queue/busy/partition/a?consumerGroup=g").await.status, 204, "{mode}: still held");
    }
}

/// "What to expect when things go wrong: Cursor sits in a retention gap |
/// the forward scan takes the next existing segment; not an error" and
/// "Partition emptied entirely by retention | the cursor is sealed to
/// `last_offset`; it stops being a candidate".
#[tokio::test]
async fn a_partition_emptied_by_retention_is_sealed_and_a_cursor_in_a_retention_gap_scans_forward() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("q", "gone", &[json!(1), json!(2)]).await;
        b.push_to("q", "gap", &[json!("lost")]).await;
        b.push_to("q", "gap", &[json!("kept")]).await;
        // What retention does: remove whole segments.
        b.sql()
            .await
            .execute(
                "DELETE FROM queen.segments s USING queen.partitions p
                 WHERE p.id = s.partition_id AND (p.name = 'gone' OR (p.name = 'gap' AND s.base_offset = 0))",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(b.pop("/api/v1/pop/queue/q/partition/gone?consumerGroup=g").await.status, 204, "{mode}");
        assert_eq!(committed(&b, "q", "gone", "g").await, Some(1), "{mode}: sealed to last_offset");
        let r = b.pop("/api/v1/pop/queue/q?consumerGroup=g&batch=10").await;
        assert_eq!(r.data(), [json!("kept")], "{mode}: the cursor in the gap scans forward, and the sealed one is no candidate");
    }
}

/// "What to expect when things go wrong: Statement timeout | the statement
/// is cancelled server-side, the connection quarantined, `500` returned" and
/// "Pool exhausted | `500` with `{"error":"pool"}`" (seeds/pop-routes.md:
/// "or {"error":"pop failed"} when the statement timed out and was
/// cancelled").
#[tokio::test]
async fn an_exhausted_pool_answers_500_pool_and_a_timed_out_claim_500_pop_failed() {
    let env = [("DB_POOL_SIZE", "2"), ("DB_CONNECTION_TIMEOUT", "300"), ("QUEEN_STMT_TIMEOUT_MS", "1500")];
    for (mode, b) in brokers_in_both_modes(&env).await {
        b.push_to("q", "p", &[json!(1)]).await;
        let answers = four_pops_while_the_cursors_are_locked(&b, "", None).await;
        assert!(answers.contains(&(500, json!({"error": "pool"}))), "{mode}: {answers:?}");
        assert!(answers.contains(&(500, json!({"error": "pop failed"}))), "{mode}: {answers:?}");
        assert_eq!(b.pop("/api/v1/pop/queue/q/partition/p").await.data(), [json!(1)], "{mode}: and the broker recovers");
    }
}

/// Four pops of q/p sent while a transaction holds the cursor table, so
/// their claims block inside PostgreSQL holding their connections; the lock
/// goes when all four have answered (`hold: None`) or after `hold`. Their
/// answers (status, body), in the order sent.
async fn four_pops_while_the_cursors_are_locked(b: &Broker, query: &str, hold: Option<Duration>) -> Vec<(u16, Value)> {
    let sql = b.sql().await;
    sql.batch_execute("BEGIN; LOCK TABLE queen.consumers IN ACCESS EXCLUSIVE MODE").await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = format!("{}/api/v1/pop/queue/q/partition/p{query}", b.url);
        tasks.push(tokio::spawn(async move {
            let r = reqwest::get(url).await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }));
    }
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
        sql.batch_execute("ROLLBACK").await.unwrap();
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    if hold.is_none() {
        sql.batch_execute("ROLLBACK").await.unwrap();
    }
    answers
}

/// A long-poll is not a request that failed when the pool is busy: one that
/// finds no connection within `DB_CONNECTION_TIMEOUT` goes back to waiting
/// until its own deadline (a thousand groups woken by one push met the pool
/// this way and answered 500s, docs/PERFORMANCE.md, issue 51). Without the
/// change two of these four answer `500 pool`.
#[tokio::test]
async fn a_long_poll_that_meets_a_busy_pool_waits_instead_of_failing() {
    let env = [("DB_POOL_SIZE", "2"), ("DB_CONNECTION_TIMEOUT", "300")];
    for (mode, b) in brokers_in_both_modes(&env).await {
        b.push_to("q", "p", &[json!(1)]).await;
        let answers = four_pops_while_the_cursors_are_locked(&b, "?wait=true&timeout=4000", Some(Duration::from_millis(1200))).await;
        let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
        assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 1, "{mode}: one delivery: {answers:?}");
        assert_eq!(statuses.iter().filter(|s| **s == 204).count(), 3, "{mode}: the rest wait out their timeout: {answers:?}");
        let delivered = answers.iter().find(|(s, _)| *s == 200).unwrap();
        assert_eq!(delivered.1["messages"][0]["data"], json!(1), "{mode}: {answers:?}");
        let busy = common::sample(&b.prometheus().await, "queen_pop_busy_looks_total").unwrap_or(0.0);
        assert!(busy >= 1.0, "{mode}: the busy looks are counted: {busy}");
    }
}

// Statements tests/pop.rs held first, in both candidate modes by name (`::hotlist`, `::sql_scan`).
both_modes!(
    fifty_first_contact_pops_on_two_hundred_partitions_cause_no_deadlock,
);

/// "The group-first-contact bulk seed. On the very first pop of a
/// `(queue, group)`, one insert ... elects a single seeder ... and that
/// seeder seeds the cursor of *every* partition of the queue in one
/// set-based statement. Without it, `log_pop_v1`'s per-partition lazy row
/// creation convoys" (the first-contact storm).
async fn fifty_first_contact_pops_on_two_hundred_partitions_cause_no_deadlock(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    let items: Vec<Value> = (0..200).map(|p| json!({"queue": "wide", "partition": format!("p{p}"), "payload": p})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    let sql = b.sql().await;
    let deadlocks = || async {
        sql.query_one("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()", &[]).await.unwrap().get::<_, i64>(0)
    };
    let before = deadlocks().await;
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let url = format!("{}/api/v1/pop/queue/wide?batch=10&partitions=4&consumerGroup=fresh", b.url);
        tasks.push(tokio::spawn(async move { reqwest::get(url).await.unwrap().status().as_u16() }));
    }
    let mut delivered = 0;
    for t in tasks {
        let s = t.await.unwrap();
        assert!(s == 200 || s == 204, "status {s}");
        delivered += (s == 200) as usize;
    }
    assert!(delivered > 0);
    // pg_stat counters are flushed asynchronously; give them a moment.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(deadlocks().await, before, "PostgreSQL reported deadlocks");
    assert!(!b.logs().iter().any(|l| l.contains("deadlock")), "the broker logged a deadlock");
    let seeded: i64 = sql.query_one("SELECT count(*) FROM queen.consumers WHERE consumer_group = 'fresh'", &[]).await.unwrap().get(0);
    assert_eq!(seeded, 200, "the elected seeder seeded every partition's cursor");
}

/// "The empty-scan watermark. When a scan claims nothing, the watermark is
/// not advanced blindly: a partition may have been skipped only because
/// someone else held its lease. Throttled to once every 30 seconds, the
/// procedure re-checks for pending data *ignoring* the lease filter, and
/// advances the watermark only if the queue is genuinely empty." This
/// bookkeeping lives only on the SQL path ("Without the hot-list"), so the
/// test runs there alone.
#[tokio::test]
async fn the_empty_scan_watermark_advances_only_when_the_group_has_nothing_pending() {
    let b = Broker::start_with(&[("QUEEN_HOTLIST", "false")]).await;
    b.push_to("wm", "p", &[json!(1)]).await;
    let leased = b.pop("/api/v1/pop/queue/wm?consumerGroup=g").await;
    assert_eq!(leased.status, 200);
    let sql = b.sql().await;
    let qid: i64 = sql.query_one("SELECT id FROM queen.queues WHERE name = 'wm'", &[]).await.unwrap().get(0);
    let watermark = || async {
        sql.query_opt("SELECT watermark = '-infinity'::timestamptz FROM queen.scan_watermarks WHERE queue_id = $1 AND consumer_group = 'g'", &[&qid])
            .await
            .unwrap()
            .map(|r| r.get::<_, bool>(0))
    };
    // The scan claimed nothing because of the lease: the floor stays.
    assert_eq!(b.pop("/api/v1/pop/queue/wm?consumerGroup=g").await.status, 204);
    assert_eq!(watermark().await, Some(true), "a lease-held backlog keeps the watermark at its floor");
    // Once everything is committed, the next re-check (30 s later) advances it.
    let pid: i64 = leased.body.unwrap()["partitionId"].as_str().unwrap().parse().unwrap();
    b.commit_cursor(pid, "g", 0).await;
    sql.execute("SELECT queen.note_empty_scan_v1($1, 'g', now() + interval '10 seconds')", &[&qid]).await.unwrap();
    assert_eq!(watermark().await, Some(true), "throttled to once every 30 seconds");
    sql.execute("SELECT queen.note_empty_scan_v1($1, 'g', now() + interval '31 seconds')", &[&qid]).await.unwrap();
    assert_eq!(watermark().await, Some(false), "advanced: the queue is genuinely empty for g");
    // New writes after the watermark are still candidates.
    b.push_to("wm", "p", &[json!(2)]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/wm?consumerGroup=g").await.data(), [json!(2)]);
}

/// "What to expect when things go wrong: Client disconnects mid-pop |
/// checked-out ring candidates are re-appended by a drop guard; the SQL claim
/// either committed (and the lease will expire) or rolled back." The client
/// gives up while its claim waits on a lock inside PostgreSQL; whichever way
/// the claim went, the message is neither lost nor stranded out of the ring:
/// once the lease it may have taken expires, the next plain pop gets it.
#[tokio::test]
async fn a_client_that_disconnects_mid_pop_loses_nothing_and_strands_no_candidate() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("gone", "p", &[json!("kept")]).await;
        assert_eq!(b.pop("/api/v1/pop/queue/gone?consumerGroup=g&batch=1&leaseSeconds=1").await.status, 200);
        tokio::time::sleep(Duration::from_millis(1100)).await; // the ring knows p; its lease has expired
        let sql = b.sql().await;
        sql.batch_execute("BEGIN; LOCK TABLE queen.consumers IN ACCESS EXCLUSIVE MODE").await.unwrap();
        let impatient = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
        let r = impatient.get(format!("{}/api/v1/pop/queue/gone?consumerGroup=g&leaseSeconds=1", b.url)).send().await;
        assert!(r.is_err(), "{mode}: the client gave up first");
        sql.batch_execute("ROLLBACK").await.unwrap();
        tokio::time::sleep(Duration::from_millis(1300)).await; // any lease the abandoned claim took expires
        let r = b.pop("/api/v1/pop/queue/gone?consumerGroup=g&autoAck=true").await;
        assert_eq!(r.data(), [json!("kept")], "{mode}: redelivered, from the ring or the scan");
    }
}

both_modes!(delayed_processing_makes_only_segments_at_least_d_seconds_old_visible);

/// "`delayedProcessing` (seconds) makes only segments at least `D` seconds
/// old visible": in one partition the older segment is delivered and the
/// young tail cut off until it has aged.
async fn delayed_processing_makes_only_segments_at_least_d_seconds_old_visible(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    b.push_to("q", "p", &[json!("old")]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    b.sql().await.execute("UPDATE queen.queues SET delayed_processing = 1 WHERE name = 'q'", &[]).await.unwrap();
    b.push_to("q", "p", &[json!("young")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/q?batch=10&autoAck=true").await.data(), [json!("old")], "the delayed tail is cut off");
    assert_eq!(b.pop("/api/v1/pop/queue/q?batch=10&autoAck=true").await.status, 204);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(b.pop("/api/v1/pop/queue/q?batch=10&autoAck=true").await.data(), [json!("young")]);
}

/// "It waits on the queue's wake gate, which a local push, a peer's mesh
/// hint, an ack-promote or the background wheel tick can open." An ack that
/// releases a lease promotes what lies behind it: a pop of the same group,
/// parked long enough for its backoff to reach the 1 s cap, gets the rest at
/// once rather than at its next re-check.
#[tokio::test]
async fn an_ack_that_releases_a_lease_wakes_a_parked_pop_of_the_group() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("promote", "p", &[json!("first"), json!("second")]).await;
        let held = b.pop("/api/v1/pop/queue/promote?batch=1&consumerGroup=g").await.body.expect("the first");
        let waiter = parked(&b, "/api/v1/pop/queue/promote?batch=1&consumerGroup=g&wait=true&timeout=15000&autoAck=true");
        // Re-checks come at 0.1, 0.2, 0.3, 0.9, 1.7, 2.7, 3.7 and 4.7 s of
        // parking: an ack at 3.8 s is 0.9 s from the next one.
        tokio::time::sleep(Duration::from_millis(3800)).await;
        let pid = held["partitionId"].as_str().unwrap();
        let txn = held["messages"][0]["transactionId"].as_str().unwrap();
        let acked = Instant::now();
        let r = b.ack_batch(Some("g"), &[(txn, pid, "completed", Some(held["leaseId"].as_str().unwrap()))]).await;
        assert_eq!(r[0]["success"], true, "{mode}: {r:?}");
        let (body, at) = waiter.await.unwrap();
        assert_eq!(body.expect("delivered")["messages"][0]["data"], "second", "{mode}");
        let took = at.duration_since(acked);
        assert!(took < Duration::from_millis(300), "{mode}: answered {took:?} after the ack: the backoff's time, not the wake's");
    }
}

/// "Redelivery detection is the `attempt_offset` comparison: a batch
/// starting at the same offset as the previous delivery means the cursor
/// did not move in between (a nack, or a lease expiry), so `attempt_count`
/// increments; a batch starting anywhere else is fresh work and resets it to
/// 1. `attempt_count` is telemetry and never spends the retry budget".
#[tokio::test]
async fn the_attempt_count_grows_when_a_span_is_redelivered_and_restarts_at_one_on_fresh_work() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.post("/api/v1/configure", json!({"queue": "att", "options": {"retryLimit": 5}})).await;
        b.push_to("att", "p", &[json!(1), json!(2), json!(3)]).await;
        let attempts = || async {
            let r = b.sql().await.query_one("SELECT attempt_count, retry_count FROM queen.consumers WHERE consumer_group = 'g'", &[]).await.unwrap();
            (r.get::<_, i32>(0), r.get::<_, i32>(1))
        };
        let first = b.pop("/api/v1/pop/queue/att?batch=2&consumerGroup=g").await.body.expect("1, 2");
        assert_eq!(attempts().await, (1, 0), "{mode}");
        // A nack releases the span unmoved: the same span again, attempt 2.
        let pid = first["partitionId"].as_str().unwrap();
        let t0 = first["messages"][0]["transactionId"].as_str().unwrap();
        let r = b.ack_batch(Some("g"), &[(t0, pid, "failed", Some(first["leaseId"].as_str().unwrap()))]).await;
        assert_eq!(r[0]["success"], true, "{mode}: {r:?}");
        let again = b.pop("/api/v1/pop/queue/att?batch=2&consumerGroup=g").await.body.expect("redelivered");
        assert_eq!(again["messages"][0]["data"], 1, "{mode}");
        assert_eq!(attempts().await.0, 2, "{mode}: a redelivery of the same span");
        assert_eq!(attempts().await.1, 1, "{mode}: the nack, not the redelivery, spent the retry");
        // Completing the span moves the cursor: the next batch is fresh work.
        let items: Vec<(&str, &str, &str, Option<&str>)> = again["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["transactionId"].as_str().unwrap(), pid, "completed", again["leaseId"].as_str()))
            .collect();
        b.ack_batch(Some("g"), &items).await;
        let fresh = b.pop("/api/v1/pop/queue/att?batch=2&consumerGroup=g").await.body.expect("3");
        assert_eq!(fresh["messages"][0]["data"], 3, "{mode}");
        assert_eq!(attempts().await.0, 1, "{mode}: fresh work starts at one");
    }
}

/// "When pop maintenance mode is on, every pop answers `204` immediately
/// with no work done": on all three routes, no cursor, no subscription and
/// no queue row is written.
#[tokio::test]
async fn under_pop_maintenance_every_pop_answers_204_with_no_work_done() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("m.q", "p", &[json!(1)]).await;
        assert_eq!(b.post("/api/v1/system/maintenance/pop", json!({"enabled": true})).await, (200, json!({"enabled": true})));
        assert_eq!(b.get("/api/v1/system/maintenance/pop").await.1, json!({"enabled": true}));
        for route in ["/api/v1/pop/queue/m.q", "/api/v1/pop/queue/m.q/partition/p", "/api/v1/pop?namespace=m", "/api/v1/pop/queue/m.missing?wait=true"] {
            let started = Instant::now();
            assert_eq!(b.pop(route).await.status, 204, "{mode} {route}");
            assert!(started.elapsed() < Duration::from_millis(500), "{mode} {route}: immediately, not after a wait");
        }
        let sql = b.sql().await;
        let written: i64 = sql
            .query_one(
                "SELECT (SELECT count(*) FROM queen.consumers) + (SELECT count(*) FROM queen.subscriptions)
                      + (SELECT count(*) FROM queen.queues WHERE name = 'm.missing')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(written, 0, "{mode}: no work was done");
        assert_eq!(b.post("/api/v1/system/maintenance/pop", json!({"enabled": "yes"})).await.0, 400, "{mode}");
        b.post("/api/v1/system/maintenance/pop", json!({"enabled": false})).await;
        assert_eq!(b.pop("/api/v1/pop/queue/m.q").await.data(), [json!(1)], "{mode}: served again");
    }
}
