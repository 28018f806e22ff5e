//! seeds/pop-routes.md, statement by statement (issue 35 §4): each test is
//! named after the sentence it holds, quoted in its doc comment, and runs in
//! both candidate modes (the hot-list and `QUEEN_HOTLIST=false`). Hold this
//! file against the page.

mod common;

use common::brokers_in_both_modes;
use serde_json::json;

/// "The discovery route requires at least one of namespace and task. With
/// neither, it returns 400 with
/// {"success":false,"error":"namespace or task is required","messages":[]}
/// rather than scanning every queue."
#[tokio::test]
async fn discovery_with_neither_namespace_nor_task_answers_400_with_the_documented_bytes() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        for path in ["/api/v1/pop", "/api/v1/pop?consumerGroup=g", "/api/v1/pop?namespace=&task="] {
            let (status, body) = b.get_bytes(path).await;
            assert_eq!(status, 400, "{mode} {path}");
            assert_eq!(
                String::from_utf8(body).unwrap(),
                r#"{"success":false,"error":"namespace or task is required","messages":[]}"#,
                "{mode} {path}"
            );
        }
    }
}

/// "leaseSeconds overrides the queue's configured lease for this call only.
/// Values of 0 or less are treated as absent, so the queue value applies: 60
/// seconds for a queue created implicitly by a push, 300 seconds for one
/// created or updated through /api/v1/configure."
#[tokio::test]
async fn a_queue_created_or_updated_through_configure_has_a_300_second_lease() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("implicit", "p", &[json!(1)]).await;
        assert_eq!(b.queue_options("implicit").await["leaseTime"], 60, "{mode}: a push-created queue");
        let (status, body) = b.post("/api/v1/configure", json!({"queue": "implicit", "options": {"retryLimit": 5}})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["options"]["leaseTime"], 300, "{mode}: updated through configure: {body}");
        assert_eq!(body["options"]["retryLimit"], 5);
        let (_, body) = b.post("/api/v1/configure", json!({"queue": "created", "options": {}})).await;
        assert_eq!(body["options"]["leaseTime"], 300, "{mode}: created through configure");
        // A lease the user chose stays through later configures that do not name it.
        b.post("/api/v1/configure", json!({"queue": "chosen", "options": {"leaseTime": 120}})).await;
        let (_, body) = b.post("/api/v1/configure", json!({"queue": "chosen", "options": {"retryLimit": 1}})).await;
        assert_eq!(body["options"]["leaseTime"], 120, "{mode}: configure merges");
        // The lease a pop takes follows the queue's, and leaseSeconds <= 0 is absent.
        for (queue, want) in [("implicit", 300.0), ("chosen", 120.0)] {
            b.push_to(queue, "p", &[json!(2)]).await;
            let r = b.pop(&format!("/api/v1/pop/queue/{queue}?leaseSeconds=0&batch=10")).await;
            assert_eq!(r.status, 200, "{mode} {queue}");
            let left: f64 = b
                .sql()
                .await
                .query_one(
                    "SELECT EXTRACT(EPOCH FROM (c.lease_expires_at - c.lease_acquired_at))::float8 FROM queen.consumers c
                     JOIN queen.partitions p ON p.id = c.partition_id JOIN queen.queues q ON q.id = p.queue_id
                     WHERE q.name = $1 AND c.worker_id IS NOT NULL",
                    &[&queue],
                )
                .await
                .unwrap()
                .get(0);
            assert!((left - want).abs() < 1.0, "{mode} {queue}: a lease of {left} s, not {want}");
        }
    }
}

/// "a queue-scoped pop on a queue that does not exist creates its
/// queen.queues configuration row (column defaults, namespace and task
/// derived from the dotted name) before answering 204." The lease is the
/// implicit queue's 60 seconds (docs/DECISIONS.md, "A queue a pop creates").
#[tokio::test]
async fn a_queue_scoped_pop_on_a_missing_queue_creates_its_row_before_answering_204() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        for (path, queue) in [
            ("/api/v1/pop/queue/billing.invoices.created?consumerGroup=g", "billing.invoices.created"),
            ("/api/v1/pop/queue/ops.audit/partition/p1", "ops.audit"),
        ] {
            let r = b.pop(path).await;
            assert_eq!(r.status, 204, "{mode} {path}");
            let (status, body) = b.get(&format!("/api/v1/resources/queues/{queue}")).await;
            assert_eq!(status, 200, "{mode}: the row exists: {body}");
            let o = &body["options"];
            let (ns, task) = (queue.split('.').next().unwrap(), queue.split('.').nth(1).unwrap());
            assert_eq!((body["namespace"].as_str(), body["task"].as_str()), (Some(ns), Some(task)), "{mode}: {body}");
            assert_eq!(o["leaseTime"], 60, "{mode}: an implicit queue's lease");
            assert_eq!((o["retryLimit"].as_i64(), o["deadLetterQueue"].as_bool()), (Some(3), Some(true)), "{mode}: column defaults: {o}");
        }
    }
}
