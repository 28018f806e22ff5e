//! A lease that is not live never moves a cursor (issue 25, docs/DECISIONS.md
//! "Ack fencing"): on every ack path, an ack naming a lease commits only while
//! that lease is the partition's live lease for its group. Released (by a
//! nack, a full-batch ack, a seek, a group delete), expired and never-issued
//! leases answer `invalid or expired lease` and change nothing; transactions
//! are fenced by their acks' leases even below the cursor.

mod common;

use std::time::Duration;

use common::Broker;
use serde_json::{json, Value};

const INVALID: &str = "invalid or expired lease";

/// Pushes `txns` to `queue`/p and pops them as one leased batch of `group`
/// (`None`: queue mode): (lease, partitionId).
async fn leased(b: &Broker, queue: &str, group: Option<&str>, txns: &[&str], extra: &str) -> (String, String) {
    pop_leased(b, queue, "p", "", group, txns, extra).await
}

/// Pushes `txns` to `queue`/`partition` and pops them as one leased batch:
/// from that partition's route when `partition` is non-empty, else from the
/// whole queue (its `Default` partition).
async fn leased_in(b: &Broker, queue: &str, partition: &str, group: Option<&str>, txns: &[&str]) -> (String, String) {
    match partition {
        "" => pop_leased(b, queue, "Default", "", group, txns, "").await,
        p => pop_leased(b, queue, p, &format!("/partition/{p}"), group, txns, "").await,
    }
}

async fn pop_leased(
    b: &Broker,
    queue: &str,
    partition: &str,
    route: &str,
    group: Option<&str>,
    txns: &[&str],
    extra: &str,
) -> (String, String) {
    let items: Vec<Value> =
        txns.iter().map(|t| json!({"queue": queue, "partition": partition, "payload": {"t": t}, "transactionId": t})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    let g = group.map(|g| format!("&consumerGroup={g}")).unwrap_or_default();
    let r = b.pop(&format!("/api/v1/pop/queue/{queue}{route}?batch={}{g}{extra}", txns.len())).await;
    let body = r.body.unwrap_or_else(|| panic!("a batch of {queue}: {}", r.status));
    assert_eq!(body["messages"].as_array().unwrap().len(), txns.len(), "{body}");
    (body["leaseId"].as_str().unwrap().to_string(), body["partitionId"].as_str().unwrap().to_string())
}

fn group_name(group: Option<&str>) -> &str {
    group.unwrap_or("__QUEUE_MODE__")
}

/// The committed offset of (partition, group), or None without a cursor row.
async fn committed(b: &Broker, pid: &str, group: Option<&str>) -> Option<i64> {
    let pid: i64 = pid.parse().unwrap();
    b.sql()
        .await
        .query_opt("SELECT committed FROM queen.consumers WHERE partition_id = $1 AND consumer_group = $2", &[&pid, &group_name(group)])
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// The issue's reproduction, on both ways an ack resolves its offset: the
/// registry and index, and the segments around the cursor.
#[tokio::test]
async fn a_completed_ack_under_a_lease_its_nack_released_moves_nothing() {
    for no_index in [false, true] {
        let b = if no_index { Broker::start_with(&[("QUEEN_ACK_REGISTRY_MB", "0")]).await } else { Broker::start().await };
        if no_index {
            assert_eq!(b.post("/api/v1/configure", json!({"queue": "q", "options": {"dedupWindowSeconds": 0}})).await.0, 200);
        }
        let (lease, pid) = leased(&b, "q", None, &["t0", "t1", "t2"], "").await;
        let (status, r) = b
            .post("/api/v1/ack", json!({"transactionId": "t0", "partitionId": pid, "leaseId": lease, "status": "failed", "error": "boom"}))
            .await;
        assert_eq!(status, 200);
        assert_eq!((r[0]["success"].as_bool(), r[0]["leaseReleased"].as_bool()), (Some(true), Some(true)), "{r}");
        let (status, r) = b
            .post("/api/v1/ack", json!({"transactionId": "t1", "partitionId": pid, "leaseId": lease, "status": "completed", "error": null}))
            .await;
        assert_eq!(status, 200);
        assert_eq!(r[0]["success"], false, "no_index={no_index}: {r}");
        assert_eq!(r[0]["error"], INVALID);
        assert_eq!(committed(&b, &pid, None).await, Some(-1), "the cursor stays before t0");
        let (_, m) = b.get(&format!("/api/v1/messages/{pid}/t0")).await;
        assert_ne!(m["status"], "completed", "{m}");
        let again = b.pop("/api/v1/pop/queue/q?batch=3").await.body.expect("t0 redelivers");
        let txns: Vec<&str> = again["messages"].as_array().unwrap().iter().map(|m| m["transactionId"].as_str().unwrap()).collect();
        assert_eq!(txns, ["t0", "t1", "t2"], "no_index={no_index}");
        assert_ne!(again["leaseId"].as_str().unwrap(), lease, "a fresh lease");
    }
}

/// How a lease stops being live.
#[derive(Debug, Clone, Copy)]
enum Death {
    Nack,
    FullBatchAck,
    Seek,
    GroupDelete,
    Expiry,
    NeverIssued,
}

/// The ack routes a client can commit through.
#[derive(Debug, Clone, Copy)]
enum Route {
    Single,
    Batch,
    /// A batch spanning two partitions: applied in one transaction.
    TwoPartitionBatch,
}

/// Makes the lease die as `death` says; returns the lease the ack will name
/// and the cursor expected after it (unchanged).
async fn kill_lease(b: &Broker, queue: &str, group: Option<&str>, death: Death) -> (String, String, i64, &'static str) {
    let extra = if matches!(death, Death::Expiry) { "&leaseSeconds=1" } else { "" };
    let (lease, pid) = leased(b, queue, group, &["t0", "t1", "t2"], extra).await;
    let gq = group.map(|g| format!(",\"consumerGroup\":\"{g}\"")).unwrap_or_default();
    let ack = |txn: &str, status: &str| -> Value {
        serde_json::from_str(&format!(
            r#"{{"transactionId":"{txn}","partitionId":"{pid}","leaseId":"{lease}","status":"{status}","error":null{gq}}}"#
        ))
        .unwrap()
    };
    match death {
        Death::Nack => {
            let (_, r) = b.post("/api/v1/ack", ack("t0", "failed")).await;
            assert_eq!(r[0]["leaseReleased"], true, "{r}");
            (lease, pid, -1, "t1")
        }
        Death::FullBatchAck => {
            let (_, r) = b.post("/api/v1/ack", ack("t2", "completed")).await;
            assert_eq!(r[0]["leaseReleased"], true, "{r}");
            // The next batch is someone else's; the old lease must not touch it.
            let (next, _) = leased(b, queue, group, &["t3", "t4"], "").await;
            assert_ne!(next, lease);
            (lease, pid, 2, "t3")
        }
        Death::Seek => {
            let g = group.expect("seek takes a named group");
            let (status, body) = b
                .post(&format!("/api/v1/consumer-groups/{g}/queues/{queue}/seek"), json!({"timestamp": "2000-01-01T00:00:00Z"}))
                .await;
            assert_eq!(status, 200, "{body}");
            (lease, pid, -1, "t1")
        }
        Death::GroupDelete => {
            let g = group.expect("a named group");
            let r = b.http.delete(format!("{}/api/v1/consumer-groups/{g}", b.url)).send().await.unwrap();
            assert_eq!(r.status(), 200);
            (lease, pid, i64::MIN, "t1")
        }
        Death::Expiry => {
            tokio::time::sleep(Duration::from_millis(1100)).await; // the lease length is the rule under test
            (lease, pid, -1, "t1")
        }
        Death::NeverIssued => ("never-issued".to_string(), pid, -1, "t1"),
    }
}

#[tokio::test]
async fn a_lease_that_is_not_live_is_refused_on_every_ack_route_and_changes_nothing() {
    let b = Broker::start().await;
    let deaths = [Death::Nack, Death::FullBatchAck, Death::Seek, Death::GroupDelete, Death::Expiry, Death::NeverIssued];
    let routes = [Route::Single, Route::Batch, Route::TwoPartitionBatch];
    for (n, (death, route)) in deaths.iter().flat_map(|d| routes.map(|r| (*d, r))).enumerate() {
        let case = format!("{death:?} via {route:?}");
        let queue = format!("q{n}");
        let group = Some("g");
        let (lease, pid, before, txn) = kill_lease(&b, &queue, group, death).await;
        let item = json!({"transactionId": txn, "partitionId": pid, "leaseId": lease, "status": "completed", "error": null});
        let answers: Vec<Value> = match route {
            Route::Single => {
                let mut one = item.clone();
                one["consumerGroup"] = json!("g");
                let (status, r) = b.post("/api/v1/ack", one).await;
                assert_eq!(status, 200, "{case}: {r}");
                r.as_array().unwrap().clone()
            }
            Route::Batch => b.ack_batch(group, &[(txn, &pid, "completed", Some(&lease))]).await,
            Route::TwoPartitionBatch => {
                // A live batch of another queue beside it: that one commits.
                let (other_lease, other_pid) = leased(&b, &format!("{queue}-other"), group, &["o0"], "").await;
                let r = b.ack_batch(group, &[(txn, &pid, "completed", Some(&lease)), ("o0", &other_pid, "completed", Some(&other_lease))]).await;
                assert_eq!(r[1]["success"], true, "{case}: the live lease commits: {r:?}");
                assert_eq!(committed(&b, &other_pid, group).await, Some(0), "{case}");
                r
            }
        };
        assert_eq!(answers[0]["success"], false, "{case}: {answers:?}");
        assert_eq!(answers[0]["error"], INVALID, "{case}");
        let expected = if before == i64::MIN { None } else { Some(before) };
        assert_eq!(committed(&b, &pid, group).await, expected, "{case}: nothing moved");
    }
}

#[tokio::test]
async fn a_plain_ack_below_the_cursor_stays_a_noop_whatever_its_lease() {
    let b = Broker::start().await;
    let (lease, pid) = leased(&b, "q", None, &["t0", "t1", "t2"], "").await;
    let r = b.ack_batch(None, &[("t2", &pid, "completed", Some(&lease))]).await;
    assert_eq!(r[0]["leaseReleased"], true);
    // A client retrying its acks after the lease was released by them.
    let r = b.ack_batch(None, &[("t0", &pid, "completed", Some(&lease)), ("t1", &pid, "completed", Some("never-issued"))]).await;
    for a in &r {
        assert_eq!((a["success"].as_bool(), a["noop"].as_bool(), a["error"].is_null()), (Some(true), Some(true), true), "{a}");
    }
    assert_eq!(committed(&b, &pid, None).await, Some(2));
}

#[tokio::test]
async fn an_ack_naming_no_lease_keeps_the_lease_less_rule() {
    let b = Broker::start().await;
    let (lease, pid) = leased(&b, "q", None, &["t0", "t1", "t2"], "").await;
    let r = b.ack_batch(None, &[("t0", &pid, "failed", Some(&lease))]).await;
    assert_eq!(r[0]["leaseReleased"], true);
    let r = b.ack_batch(None, &[("t1", &pid, "completed", None)]).await;
    assert_eq!(r[0]["success"], true, "a lease-less ack advances the cursor: {r:?}");
    assert_eq!(committed(&b, &pid, None).await, Some(1));
}

/// Consumer A's lease expires, B takes the batch over and commits it: A is a
/// zombie, and its "ack my input, push my output" must not commit.
async fn zombie(b: &Broker) -> (String, String) {
    let (zombie_lease, pid) = leased(b, "in", Some("g"), &["job-1"], "&leaseSeconds=1").await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // the lease length is the rule under test
    let body = b.pop("/api/v1/pop/queue/in?consumerGroup=g").await.body.expect("B gets the batch");
    let live = body["leaseId"].as_str().unwrap();
    let r = b.ack_batch(Some("g"), &[("job-1", &pid, "completed", Some(live))]).await;
    assert_eq!(r[0]["success"], true);
    (zombie_lease, pid)
}

async fn out_segments(b: &Broker) -> i64 {
    b.sql()
        .await
        .query_one(
            "SELECT count(*) FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
             JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'out'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_transaction_acking_with_a_lease_that_is_not_live_rolls_back_even_below_the_cursor() {
    let b = Broker::start().await;
    let (zombie_lease, pid) = zombie(&b).await;
    let push = json!({"type": "push", "items": [{"queue": "out", "payload": "result", "transactionId": "out-1"}]});
    let own = json!({"type": "ack", "transactionId": "job-1", "partitionId": pid, "status": "completed", "consumerGroup": "g", "leaseId": zombie_lease});
    let lent = json!({"type": "ack", "transactionId": "job-1", "partitionId": pid, "status": "completed", "consumerGroup": "g"});
    for (how, ack) in [("its own leaseId", own), ("the single required lease", lent)] {
        let (status, body) =
            b.post("/api/v1/transaction", json!({"operations": [push.clone(), ack], "requiredLeases": [zombie_lease]})).await;
        assert_eq!(status, 200, "{how}: {body}");
        assert_eq!(body["success"], false, "{how}: {body}");
        assert_eq!(body["results"], json!([]));
        let error = body["error"].as_str().unwrap();
        assert!(error.contains("rolled back: ") && error.contains("operations[1]"), "{how}: {error}");
        assert!(error.contains("\"job-1\"") && error.contains(INVALID) && error.contains(&zombie_lease), "{how}: {error}");
        assert_eq!(out_segments(&b).await, 0, "{how}: the output is not pushed");
    }
    assert_eq!(committed(&b, &pid, Some("g")).await, Some(0));
}

/// The older clients' `transaction().ack(m1).ack(m2).commit()` (issue 44
/// §1): acks of messages popped from two partitions, or two queues, sent
/// without their own `leaseId` beside a `requiredLeases` naming both. A lease
/// holds exactly one (partition, group), so each ack's partition names its
/// lease among the required ones: the bundle commits, in the JavaScript
/// client's camelCase and the pre-2.x Python client's snake_case, in a group
/// and in queue mode, for pops of a named partition and of the whole queue.
#[tokio::test]
async fn acks_of_several_partitions_without_their_own_lease_resolve_each_by_its_partition() {
    let b = Broker::start().await;
    let cases = [
        ("two partitions of one queue, named", "multi", "p1", "multi", "p2", Some("g")),
        ("two queues, whole-queue pops", "qa", "", "qb", "", Some("g")),
        ("two partitions in queue mode", "qm", "p1", "qm", "p2", None),
    ];
    for (n, (how, qa, pa, qb, pb, group)) in cases.into_iter().enumerate() {
        for snake in [false, true] {
            let (x, y) = (format!("x-{n}-{snake}"), format!("y-{n}-{snake}"));
            let (l1, p1) = leased_in(&b, qa, pa, group, &[&x]).await;
            let (l2, p2) = leased_in(&b, qb, pb, group, &[&y]).await;
            assert_ne!(p1, p2, "{how}");
            let ack = |txn: &str, pid: &str| {
                let mut op = if snake {
                    json!({"type": "ack", "transaction_id": txn, "partition_id": pid, "status": "completed"})
                } else {
                    json!({"type": "ack", "transactionId": txn, "partitionId": pid, "status": "completed"})
                };
                if let Some(g) = group {
                    op[if snake { "consumer_group" } else { "consumerGroup" }] = json!(g);
                }
                op
            };
            let out = format!("out-{n}-{snake}");
            let push = if snake {
                json!({"type": "push", "items": [{"queue": "out", "payload": 1, "transaction_id": out}]})
            } else {
                json!({"type": "push", "items": [{"queue": "out", "partition": "r", "payload": 1, "transactionId": out}]})
            };
            let leases_key = if snake { "required_leases" } else { "requiredLeases" };
            let before = out_segments(&b).await;
            let body = json!({"operations": [ack(&x, &p1), ack(&y, &p2), push], leases_key: [l1, l2]});
            let (status, body) = b.post("/api/v1/transaction", body).await;
            assert_eq!((status, body["success"].as_bool()), (200, Some(true)), "{how} snake={snake}: {body}");
            let results = body["results"].as_array().unwrap();
            assert_eq!(results.len(), 3, "{body}");
            assert_eq!((results[0]["transactionId"].as_str(), results[1]["transactionId"].as_str()), (Some(&*x), Some(&*y)));
            assert_eq!(
                (committed(&b, &p1, group).await, committed(&b, &p2, group).await),
                (Some(snake as i64), Some(snake as i64)),
                "{how} snake={snake}: each ack committed its own partition (the second round's message is at offset 1)"
            );
            assert_eq!(out_segments(&b).await, before + 1, "{how}: the output is pushed");
            // Each batch was acknowledged whole: both leases are released.
            for pid in [&p1, &p2] {
                let row = b.cursor(pid, group_name(group)).await;
                assert_eq!(row.1, None, "{how}: the lease on {pid} is released");
            }
        }
    }
}

/// Per-ack fencing stays: when one of the required leases is no longer live
/// on its partition (another consumer took that batch over), the ack that
/// partition resolves to is refused and the bundle rolls back whole, the live
/// partition's cursor included.
#[tokio::test]
async fn acks_of_several_partitions_roll_back_whole_when_one_partitions_lease_is_not_live() {
    let b = Broker::start().await;
    let (l1, p1) = leased_in(&b, "fx", "p1", Some("g"), &["x"]).await;
    let (zombie_lease, pz) = zombie(&b).await;
    let ops = json!([
        {"type": "ack", "transactionId": "x", "partitionId": p1, "status": "completed", "consumerGroup": "g"},
        {"type": "ack", "transactionId": "job-1", "partitionId": pz, "status": "completed", "consumerGroup": "g"},
        {"type": "push", "items": [{"queue": "out", "payload": 1}]}
    ]);
    let (status, body) = b.post("/api/v1/transaction", json!({"operations": ops, "requiredLeases": [l1, zombie_lease]})).await;
    assert_eq!((status, body["success"].as_bool()), (200, Some(false)), "{body}");
    assert_eq!(body["results"], json!([]));
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("rolled back: operations[1]") && error.contains("\"job-1\"") && error.contains(INVALID), "{error}");
    assert_eq!(committed(&b, &p1, Some("g")).await, Some(-1), "the live partition's ack rolled back too");
    assert_eq!(b.cursor(&p1, "g").await.1.as_deref(), Some(&*l1), "and its lease is still held");
    assert_eq!(out_segments(&b).await, 0);
    // A lease that holds no partition at all (never issued) is no cover either.
    let ops = json!([
        {"type": "ack", "transactionId": "x", "partitionId": p1, "status": "completed", "consumerGroup": "g"},
        {"type": "ack", "transactionId": "job-1", "partitionId": pz, "status": "completed", "consumerGroup": "g"}
    ]);
    let (_, body) = b.post("/api/v1/transaction", json!({"operations": ops, "requiredLeases": [l1, "never-issued"]})).await;
    assert_eq!(body["success"], false, "{body}");
    assert!(body["error"].as_str().unwrap().contains("operations[1]"), "{body}");
    assert_eq!(committed(&b, &p1, Some("g")).await, Some(-1));
    // With its own live lease beside them, each ack commits.
    let (status, body) = b
        .post(
            "/api/v1/transaction",
            json!({"operations": [{"type": "ack", "transactionId": "x", "partitionId": p1, "status": "completed", "consumerGroup": "g", "leaseId": l1}],
                   "requiredLeases": [l1, zombie_lease]}),
        )
        .await;
    assert_eq!((status, body["success"].as_bool()), (200, Some(true)), "{body}");
    assert_eq!(committed(&b, &p1, Some("g")).await, Some(0));
}

#[tokio::test]
async fn a_binary_transaction_is_fenced_by_its_acks_leases_too() {
    let b = Broker::start().await;
    let (zombie_lease, pid) = zombie(&b).await;
    let ack = |lease: &str| {
        json!({"operations": [{"type": "ack", "transactionId": "job-1", "partitionId": pid, "status": "completed",
                               "consumerGroup": "g", "leaseId": lease}], "requiredLeases": [lease]})
    };
    let (status, body) = b.post_raw("/api/v1/transaction", "application/x-queen-push", common::qtb1(&ack(&zombie_lease), "out", "out-1")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["success"], false, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("rolled back: ") && error.contains(INVALID), "{error}");
    assert_eq!(out_segments(&b).await, 0, "the binary push rolled back with the ack");
    // The same body under a live lease commits both.
    let (live, pid2) = leased(&b, "in", Some("g"), &["job-2"], "").await;
    let live_ack = json!({"operations": [{"type": "ack", "transactionId": "job-2", "partitionId": pid2, "status": "completed",
                                          "consumerGroup": "g", "leaseId": live}], "requiredLeases": [live]});
    let (status, body) = b.post_raw("/api/v1/transaction", "application/x-queen-push", common::qtb1(&live_ack, "out", "out-2")).await;
    assert_eq!((status, body["success"].as_bool()), (200, Some(true)), "{body}");
    assert_eq!(out_segments(&b).await, 1);
    assert_eq!(committed(&b, &pid2, Some("g")).await, Some(1), "job-2 is offset 1 after job-1");
}
