//! seeds/consuming.md, statement by statement (issue 35 §4): each test is
//! named after the sentence it holds, quoted in its doc comment, and runs in
//! both candidate modes (the hot-list and `QUEEN_HOTLIST=false`). Hold this
//! file against the page.

#[macro_use]
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

/// The committed offset and lease holder of every cursor of `group` on `queue`.
async fn cursors(b: &Broker, queue: &str, group: &str) -> Vec<(String, i64, Option<String>, i32)> {
    b.sql()
        .await
        .query(
            "SELECT p.name, c.committed, c.worker_id, c.retry_count FROM queen.consumers c
             JOIN queen.partitions p ON p.id = c.partition_id JOIN queen.queues q ON q.id = p.queue_id
             WHERE q.name = $1 AND c.consumer_group = $2 ORDER BY p.name",
            &[&queue, &group],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

fn txns(body: &Value) -> Vec<String> {
    body["messages"].as_array().unwrap().iter().map(|m| m["transactionId"].as_str().unwrap().to_string()).collect()
}

/// "A consumer group is a name. Each group holds one cursor per partition, so
/// two groups read the same messages independently ... Nothing has to be
/// created first: the group's rows appear on its first pop."
#[tokio::test]
async fn a_group_is_a_name_whose_cursors_appear_on_its_first_pop_and_groups_read_independently() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("g", "p", &[json!(1), json!(2)]).await;
        assert!(cursors(&b, "g", "billing").await.is_empty(), "{mode}: nothing exists before the first pop");
        let billing = b.pop("/api/v1/pop/queue/g?consumerGroup=billing&autoAck=true").await;
        assert_eq!(billing.data(), [json!(1), json!(2)], "{mode}");
        assert_eq!(cursors(&b, "g", "billing").await, [("p".to_string(), 1, None, 0)], "{mode}: its cursor, moved by autoAck");
        let analytics = b.pop("/api/v1/pop/queue/g?consumerGroup=analytics&autoAck=true").await;
        assert_eq!(analytics.data(), [json!(1), json!(2)], "{mode}: the other group reads the same messages");
    }
}

/// "Omitting `consumerGroup` puts you in the implicit group `__QUEUE_MODE__`.
/// ... every consumer that omits the group shares one set of cursors, so a
/// message is delivered to exactly one of them." And "Queue mode always reads
/// from the beginning ... `subscriptionMode=new` does not skip the backlog".
#[tokio::test]
async fn queue_mode_consumers_share_one_cursor_each_message_to_one_of_them_from_the_beginning() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        for p in ["a", "b"] {
            let items: Vec<Value> = (0..3).map(|n| json!({"queue": "qm", "partition": p, "payload": n, "transactionId": format!("{p}{n}")})).collect();
            assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
        }
        let first = b.pop("/api/v1/pop/queue/qm?batch=10&subscriptionMode=new").await.body.expect("the backlog, despite new");
        let second = b.pop("/api/v1/pop/queue/qm?batch=10").await.body.expect("the other partition");
        assert_eq!(b.pop("/api/v1/pop/queue/qm?batch=10").await.status, 204, "{mode}: both partitions are leased");
        let mut all = [txns(&first), txns(&second)].concat();
        all.sort();
        assert_eq!(all, ["a0", "a1", "a2", "b0", "b1", "b2"], "{mode}: each message to exactly one consumer");
        assert_eq!(first["consumerGroup"], "__QUEUE_MODE__");
    }
}

/// The parameter table: "`batch` | `200`", "`partitions` | `1`", "`autoAck` |
/// `false`" ("Those are the values the broker applies when a parameter is
/// absent").
#[tokio::test]
async fn a_pop_that_sends_no_parameters_takes_200_leased_messages_from_one_partition() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        let items: Vec<Value> = (0..250).map(|n| json!({"queue": "d", "partition": "big", "payload": n})).collect();
        assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
        b.push_to("d", "small", &[json!("s")]).await;
        let body = b.pop("/api/v1/pop/queue/d").await.body.expect("a batch");
        let n = body["messages"].as_array().unwrap().len();
        assert!(n == 200 || n == 1, "{mode}: {n}");
        assert_eq!(body["partitionsClaimed"], 1, "{mode}");
        assert!(!body["leaseId"].as_str().unwrap().is_empty(), "{mode}: leased, not autoAck");
        let other = b.pop("/api/v1/pop/queue/d").await.body.expect("the other partition");
        let m = other["messages"].as_array().unwrap().len();
        assert_eq!(n + m, 201, "{mode}: 200 of the big one, and the small one");
    }
}

/// "`timeout` | `30000` ms | ... The broker default comes from
/// `DEFAULT_TIMEOUT`, falling back to `POP_DEFAULT_TIMEOUT_MS`, then to 30000."
#[tokio::test]
async fn the_long_poll_timeout_defaults_to_default_timeout_then_pop_default_timeout_ms() {
    for (env, want) in [
        (vec![("DEFAULT_TIMEOUT", "600"), ("POP_DEFAULT_TIMEOUT_MS", "5000")], 600),
        (vec![("POP_DEFAULT_TIMEOUT_MS", "900")], 900),
    ] {
        for (mode, b) in brokers_in_both_modes(&env).await {
            b.pop("/api/v1/pop/queue/t").await;
            let started = Instant::now();
            assert_eq!(b.pop("/api/v1/pop/queue/t?wait=true").await.status, 204, "{mode}");
            let took = started.elapsed();
            assert!(took >= Duration::from_millis(want - 50) && took < Duration::from_millis(want + 1500), "{mode} {env:?}: {took:?}");
            // "It only has an effect when wait=true" (seeds/pop-routes.md).
            let started = Instant::now();
            assert_eq!(b.pop("/api/v1/pop/queue/t?timeout=5000").await.status, 204, "{mode}");
            assert!(started.elapsed() < Duration::from_millis(500), "{mode}: a single attempt: {:?}", started.elapsed());
        }
    }
}

/// "Sending `subscriptionMode` on later pops has no effect. The stored record
/// wins, so a group that first connected with the default `all` will keep
/// reading history no matter what subsequent pops ask for."
#[tokio::test]
async fn subscription_mode_on_later_pops_has_no_effect() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("s", "p", &[json!(1), json!(2), json!(3)]).await;
        let first = b.pop("/api/v1/pop/queue/s?consumerGroup=g&batch=1&autoAck=true").await;
        assert_eq!(first.data(), [json!(1)], "{mode}: all, the default");
        b.push_to("s", "late", &[json!("late")]).await;
        let later = b.pop("/api/v1/pop/queue/s/partition/p?consumerGroup=g&batch=10&autoAck=true&subscriptionMode=new").await;
        assert_eq!(later.data(), [json!(2), json!(3)], "{mode}: history keeps coming");
        let new_partition = b.pop("/api/v1/pop/queue/s?consumerGroup=g&batch=10&autoAck=true&subscriptionMode=new").await;
        assert_eq!(new_partition.data(), [json!("late")], "{mode}: a later partition inherits the stored subscription");
    }
}

/// "`createdAt` is the segment's timestamp, so all messages written by the
/// same push share it to the microsecond."
#[tokio::test]
async fn messages_of_one_push_share_their_segments_created_at_to_the_microsecond() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("c", "p", &[json!(1), json!(2), json!(3)]).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        b.push_to("c", "p", &[json!(4)]).await;
        let r = b.pop("/api/v1/pop/queue/c?batch=10&autoAck=true").await;
        let at: Vec<String> = r.messages().iter().map(|m| m["createdAt"].as_str().unwrap().to_string()).collect();
        assert_eq!(at.len(), 4, "{mode}");
        assert!(at[0] == at[1] && at[1] == at[2], "{mode}: one push, one segment: {at:?}");
        assert!(at[3] > at[2], "{mode}: a later push, a later segment: {at:?}");
        assert_eq!(at[0].len(), "2026-07-30T09:12:44.881000Z".len(), "{mode}: microseconds and a Z: {}", at[0]);
    }
}

/// "A lease carries an expiry. When it passes, the next pop for that
/// (partition, group) re-delivers the same span from the cursor forward ...
/// Redelivery caused by an expiry is counted as an attempt but does **not**
/// consume the retry budget: only an explicit `failed` ack does."
#[tokio::test]
async fn an_expired_lease_redelivers_the_span_as_an_attempt_without_spending_the_retry_budget() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.post("/api/v1/configure", json!({"queue": "x", "options": {"retryLimit": 1}})).await;
        b.push_to("x", "p", &[json!(1), json!(2)]).await;
        let first = b.pop("/api/v1/pop/queue/x?batch=2&leaseSeconds=1&consumerGroup=g").await.body.expect("a batch");
        tokio::time::sleep(Duration::from_millis(1100)).await; // the lease length is the rule under test
        let again = b.pop("/api/v1/pop/queue/x?batch=2&consumerGroup=g").await.body.expect("redelivered");
        assert_eq!(txns(&again), txns(&first), "{mode}: the same span");
        assert_ne!(again["leaseId"], first["leaseId"]);
        let c = cursors(&b, "x", "g").await;
        assert_eq!((c[0].1, c[0].3), (-1, 0), "{mode}: the cursor did not move and no retry was spent");
        let attempts: i32 = b.sql().await.query_one("SELECT attempt_count FROM queen.consumers WHERE consumer_group = 'g'", &[]).await.unwrap().get(0);
        assert_eq!(attempts, 2, "{mode}: counted as an attempt");
        // The whole budget is still there: one failed ack is a retry, not the DLQ.
        let pid = again["partitionId"].as_str().unwrap();
        let t0 = &txns(&again)[0];
        let r = b.ack_batch(Some("g"), &[(t0, pid, "failed", Some(again["leaseId"].as_str().unwrap()))]).await;
        assert_eq!((r[0]["success"].as_bool(), r[0]["dlq"].as_bool()), (Some(true), Some(false)), "{mode}: {r:?}");
    }
}

/// "With `wait=true` a pop that finds nothing parks instead of returning. It
/// releases its PostgreSQL connection first, so a parked consumer holds no
/// database resource".
#[tokio::test]
async fn parked_long_polls_hold_no_database_connection() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        assert_eq!(b.pop("/api/v1/pop/queue/idle").await.status, 204);
        let mut tasks = Vec::new();
        for _ in 0..1000 {
            let url = format!("{}/api/v1/pop/queue/idle?wait=true&timeout=4000", b.url);
            tasks.push(tokio::spawn(async move { reqwest::get(url).await.map(|r| r.status().as_u16()).unwrap_or(0) }));
        }
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let conns: i64 = b
            .sql()
            .await
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'queen' AND state <> 'idle'", &[])
            .await
            .unwrap()
            .get(0);
        assert!(conns <= 4, "{mode}: {conns} busy database connections for 1000 parked pops");
        let mut answered = 0;
        for t in tasks {
            answered += (t.await.unwrap() == 204) as usize;
        }
        assert_eq!(answered, 1000, "{mode}: each timed out with a bare 204");
    }
}

/// "To hold a batch longer than the lease, extend it:
/// `POST /api/v1/lease/:leaseId/extend` with `{"seconds": 120}` (60 if you
/// send no body) renews every live lease held by that lease id. The call
/// always returns `200`; check `success` and `renewed`, which are `false` and
/// `0` when the lease has already expired or never existed."
#[tokio::test]
async fn a_lease_extension_renews_every_live_lease_of_the_id_with_or_without_a_body() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        for p in ["a", "b"] {
            b.push_to("ext", p, &[json!(p)]).await;
        }
        let body = b.pop("/api/v1/pop/queue/ext?partitions=2&batch=10&leaseSeconds=5&consumerGroup=g").await.body.expect("both");
        assert_eq!(body["partitionsClaimed"], 2, "{mode}");
        let lease = body["leaseId"].as_str().unwrap();
        let left = || async {
            b.sql()
                .await
                .query_one(
                    "SELECT min(EXTRACT(EPOCH FROM (lease_expires_at - now())))::float8 FROM queen.consumers WHERE worker_id = $1",
                    &[&lease],
                )
                .await
                .unwrap()
                .get::<_, f64>(0)
        };
        let (status, r) = b.post(&format!("/api/v1/lease/{lease}/extend"), json!({"seconds": 120})).await;
        assert_eq!((status, r["success"].as_bool(), r["renewed"].as_i64()), (200, Some(true), Some(2)), "{mode}: {r}");
        assert!((left().await - 120.0).abs() < 3.0, "{mode}: 120 s");
        let r = b.http.post(format!("{}/api/v1/lease/{lease}/extend", b.url)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let r: Value = r.json().await.unwrap();
        assert_eq!(r["renewed"], 2, "{mode}: no body: {r}");
        assert!((left().await - 120.0).abs() < 3.0, "{mode}: 60 s never shortens the 120 already given");
        // Alone, no body means 60 seconds.
        b.push_to("ext", "c", &[json!("c")]).await;
        let fresh = b.pop("/api/v1/pop/queue/ext?leaseSeconds=5&consumerGroup=g").await.body.expect("c");
        let fresh_lease = fresh["leaseId"].as_str().unwrap();
        b.http.post(format!("{}/api/v1/lease/{fresh_lease}/extend", b.url)).send().await.unwrap();
        let fresh_left: f64 = b
            .sql()
            .await
            .query_one("SELECT EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 FROM queen.consumers WHERE worker_id = $1", &[&fresh_lease])
            .await
            .unwrap()
            .get(0);
        assert!((fresh_left - 60.0).abs() < 3.0, "{mode}: {fresh_left} s");
        let (status, r) = b.post("/api/v1/lease/never-issued/extend", json!({})).await;
        assert_eq!((status, r["success"].as_bool(), r["renewed"].as_i64()), (200, Some(false), Some(0)), "{mode}: {r}");
    }
}

// Statements tests/pop.rs held first, in both candidate modes by name (`::hotlist`, `::sql_scan`).
both_modes!(
    a_leased_partition_is_skipped_by_the_same_group_and_read_by_another,
    auto_ack_commits_inside_the_pop_and_returns_an_empty_lease_id,
    subscription_from_a_timestamp_starts_at_the_first_later_segment,
    a_long_poll_is_woken_by_a_push,
    a_pop_that_delivered_something_answers_the_documented_envelope_and_the_cursor_stands_still,
    the_batch_is_a_budget_that_claimed_partitions_share,
    a_new_group_receives_everything_pushed_to_a_partition_created_after_it_subscribed,
);

/// "A pop that claims a partition holds it until the batch is acked or the
/// lease expires. A second consumer in the same group asking for that
/// partition is skipped, without blocking ... Different groups never
/// interfere, because they are different rows." (One leased batch per
/// (partition, group).)
async fn a_leased_partition_is_skipped_by_the_same_group_and_read_by_another(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    b.push_to("q", "only", &[json!(1), json!(2)]).await;
    let first = b.pop("/api/v1/pop/queue/q").await;
    assert_eq!(first.messages().len(), 2);
    assert_eq!(b.pop("/api/v1/pop/queue/q").await.status, 204, "queue mode shares one cursor: the lane is leased");
    let other = b.pop("/api/v1/pop/queue/q?consumerGroup=analytics").await;
    assert_eq!(other.data(), [json!(1), json!(2)], "another group reads the same lane independently");
    let pid: i64 = first.body.unwrap()["partitionId"].as_str().unwrap().parse().unwrap();
    b.commit_cursor(pid, "__QUEUE_MODE__", 0).await;
    assert_eq!(b.pop("/api/v1/pop/queue/q").await.data(), [json!(2)], "after the commit the next offset comes");
}

/// "`autoAck=true` makes the pop commit the cursor in the same transaction
/// that reads the messages. No lease is taken, `leaseId` comes back empty,
/// and there is nothing to ack."
async fn auto_ack_commits_inside_the_pop_and_returns_an_empty_lease_id(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    b.push_to("q", "p", &[json!(1), json!(2), json!(3)]).await;
    let r = b.pop("/api/v1/pop/queue/q?batch=2&autoAck=true&consumerGroup=g").await;
    let body = r.body.clone().unwrap();
    assert_eq!(body["leaseId"], "");
    assert!(r.messages().iter().all(|m| m["leaseId"] == ""));
    let row = b.sql().await.query_one("SELECT committed, worker_id FROM queen.consumers WHERE consumer_group = 'g'", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    assert_eq!(row.get::<_, Option<String>>(1), None);
    assert_eq!(b.pop("/api/v1/pop/queue/q?batch=2&autoAck=true&consumerGroup=g").await.data(), [json!(3)]);
    assert_eq!(b.pop("/api/v1/pop/queue/q?autoAck=true&consumerGroup=g").await.status, 204);
}

/// "`subscriptionFrom=` | Just before the first segment written at or after
/// that timestamp" ... "replay is segment-granular: you land on the first
/// segment at or after your timestamp".
async fn subscription_from_a_timestamp_starts_at_the_first_later_segment(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    b.push_to("q", "p", &[json!("early")]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cut = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    tokio::time::sleep(Duration::from_millis(50)).await;
    b.push_to("q", "p", &[json!("late")]).await;
    let r = b.pop(&format!("/api/v1/pop/queue/q?consumerGroup=g&subscriptionFrom={}", common::urlencode(&cut))).await;
    assert_eq!(r.data(), [json!("late")]);
    let r = b.pop("/api/v1/pop/queue/q?consumerGroup=h&subscriptionFrom=not-a-time").await;
    assert_eq!(r.data(), [json!("early"), json!("late")], "an unparseable subscriptionFrom is ignored");
}

/// "With `wait=true` a pop that finds nothing parks ... it waits on the
/// queue's wake gate: a push to that queue wakes it ... gives up at
/// `timeout`, returning the bodiless `204`."
async fn a_long_poll_is_woken_by_a_push(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    // Make the group known first, so the wake (not first contact) is what is measured.
    assert_eq!(b.pop("/api/v1/pop/queue/lp").await.status, 204);
    let started = Instant::now();
    let r = b.pop("/api/v1/pop/queue/lp?wait=true&timeout=400").await;
    assert_eq!(r.status, 204);
    assert!(started.elapsed() >= Duration::from_millis(400), "the deadline answers 204");
    let waiter = {
        let url = format!("{}/api/v1/pop/queue/lp?wait=true&timeout=10000", b.url);
        tokio::spawn(async move {
            let r = reqwest::get(url).await.unwrap();
            (r.status().as_u16(), Instant::now(), r.json::<Value>().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.push_to("lp", "p", &[json!("wake")]).await;
    let pushed_at = Instant::now();
    let (status, answered_at, body) = waiter.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["messages"][0]["data"], "wake");
    let latency = answered_at.saturating_duration_since(pushed_at);
    assert!(latency < Duration::from_millis(100), "woken {latency:?} after the push");
}

/// "With the default candidate ring those local wakes are coalesced onto a
/// 5 ms tick, so a hot queue costs a bounded number of wake-ups per second
/// rather than one per push." The broker counts its gate openings
/// (`queen_wake_gate_opens_total`): at most two per queue and tick (the first
/// push of a tick at once, the rest at the tick).
#[tokio::test]
async fn pushes_to_a_hot_queue_open_its_wake_gate_at_most_twice_a_tick_not_once_per_push() {
    const PUSHES: usize = 400;
    for (mode, b) in brokers_in_both_modes(&[]).await {
        let opens = |text: String| {
            ["push", "tick"].iter().map(|how| common::sample(&text, &format!("queen_wake_gate_opens_total{{how=\"{how}\"}}")).unwrap_or(0.0)).sum::<f64>()
        };
        b.push_to("hot", "p", &[json!("first")]).await;
        let before = opens(b.prometheus().await);
        let started = Instant::now();
        let mut lanes = Vec::new();
        for lane in 0..20 {
            let (http, url) = (b.http.clone(), format!("{}/api/v1/push", b.url));
            lanes.push(tokio::spawn(async move {
                for n in 0..PUSHES / 20 {
                    let body = json!({"items": [{"queue": "hot", "partition": format!("p{lane}"), "payload": n}]});
                    assert_eq!(http.post(&url).json(&body).send().await.unwrap().status().as_u16(), 201);
                }
            }));
        }
        for l in lanes {
            l.await.unwrap();
        }
        let ticks = started.elapsed().as_millis() as f64 / 5.0;
        tokio::time::sleep(Duration::from_millis(20)).await; // the last tick
        let n = opens(b.prometheus().await) - before;
        assert!(n <= 2.0 * (ticks + 2.0), "{mode}: {n} openings over {ticks:.0} ticks");
        if PUSHES as f64 > 4.0 * (ticks + 2.0) {
            assert!(n < PUSHES as f64, "{mode}: {n} openings for {PUSHES} pushes");
        }
    }
}

/// "What comes back": "A pop that delivered something returns `200` with"
/// the documented envelope, messages in offset order with their ten fields;
/// and "The cursor stands still for the whole stretch in the middle: the pop
/// wrote a claim, not a commit" (`worker_id`, `batch_end`, the attempt).
async fn a_pop_that_delivered_something_answers_the_documented_envelope_and_the_cursor_stands_still(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    let pushed = b.push_to("q", "p", &[json!({"n": 0}), json!([1, "é"]), json!(null), json!("three"), json!(4)]).await;
    let r = b.pop("/api/v1/pop/queue/q?batch=3&consumerGroup=billing").await;
    assert_eq!(r.status, 200);
    let body = r.body.clone().unwrap();
    assert_eq!(body["success"], true);
    assert_eq!(body["queue"], "q");
    assert_eq!(body["partition"], "p");
    assert_eq!(body["consumerGroup"], "billing");
    assert_eq!(body["partitionsClaimed"], 1);
    let lease = body["leaseId"].as_str().unwrap();
    assert_eq!(uuid::Uuid::parse_str(lease).unwrap().get_version_num(), 7);
    let pid = body["partitionId"].as_str().unwrap();
    assert_eq!(pid, pushed[0]["partitionId"].as_str().unwrap());
    assert_eq!(r.data(), [json!({"n": 0}), json!([1, "é"]), json!(null)]);
    for (i, m) in r.messages().iter().enumerate() {
        assert_eq!(m["id"], pushed[i]["messageId"]);
        assert_eq!(m["transactionId"], pushed[i]["transactionId"]);
        assert_eq!(m["partitionId"], pid);
        assert_eq!(m["partition"], "p");
        assert_eq!(m["leaseId"], lease);
        assert_eq!(m["consumerGroup"], "billing");
        assert_eq!(m["traceId"], Value::Null);
        assert_eq!(m["producerSub"], Value::Null);
        let created = m["createdAt"].as_str().unwrap();
        assert_eq!(created.len(), "2026-07-30T11:02:44.512873Z".len(), "{created}");
        assert!(created.ends_with('Z'));
        chrono::DateTime::parse_from_rfc3339(created).unwrap();
        let keys: std::collections::HashSet<&str> = m.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let expected: std::collections::HashSet<&str> = ["id", "transactionId", "traceId", "data", "producerSub", "createdAt", "partitionId", "partition", "leaseId", "consumerGroup"].into();
        assert_eq!(keys, expected, "no offset, attempt count or queue name per message");
    }
    let row = b
        .sql()
        .await
        .query_one("SELECT committed, batch_end, worker_id, attempt_count FROM queen.consumers WHERE consumer_group = 'billing'", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), -1, "a lease does not move the cursor");
    assert_eq!(row.get::<_, i64>(1), 2);
    assert_eq!(row.get::<_, String>(2), lease);
    assert_eq!(row.get::<_, i32>(3), 1);
}

/// "`batch` | `200` | Maximum messages to return. A budget, not a promise;
/// when several partitions are claimed they share it." Grouped by partition,
/// each partition's messages in offset order.
async fn the_batch_is_a_budget_that_claimed_partitions_share(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    for p in ["a", "b", "c", "d"] {
        b.push_to("q", p, &[json!(format!("{p}0")), json!(format!("{p}1")), json!(format!("{p}2"))]).await;
    }
    let r = b.pop("/api/v1/pop/queue/q?batch=5&partitions=4").await;
    let msgs = r.messages();
    assert_eq!(msgs.len(), 5);
    assert_eq!(r.body.as_ref().unwrap()["partitionsClaimed"], 2);
    // Grouped by partition, each in offset order.
    let first = msgs[0]["partition"].as_str().unwrap().to_string();
    let second = msgs[3]["partition"].as_str().unwrap().to_string();
    let data: Vec<String> = r.data().iter().map(|d| d.as_str().unwrap().to_string()).collect();
    assert_eq!(data, [format!("{first}0"), format!("{first}1"), format!("{first}2"), format!("{second}0"), format!("{second}1")]);
}

/// "Partitions created later inherit the stored subscription. A partition
/// that appears after the group subscribed is seeded from the stored
/// timestamp, which means a `new` group receives everything ever pushed to
/// that new partition, not nothing."
async fn a_new_group_receives_everything_pushed_to_a_partition_created_after_it_subscribed(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    b.push_to("q", "p1", &[json!("before")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/q?consumerGroup=new-group&subscriptionMode=new").await.status, 204);
    let mode: String = b.sql().await.query_one("SELECT subscription_mode FROM queen.subscriptions WHERE consumer_group = 'new-group'", &[]).await.unwrap().get(0);
    assert_eq!(mode, "new", "the durable record");
    b.push_to("q", "p2", &[json!("late-1"), json!("late-2")]).await;
    let r = b.pop("/api/v1/pop/queue/q?consumerGroup=new-group&batch=10").await;
    assert_eq!(r.data(), [json!("late-1"), json!("late-2")]);
}
