//! seeds/pop-routes.md, statement by statement (issue 35 §4): each test is
//! named after the sentence it holds, quoted in its doc comment, and runs in
//! both candidate modes (the hot-list and `QUEEN_HOTLIST=false`). Hold this
//! file against the page.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::{brokers_in_both_modes, Broker};
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
        // The lease a pop takes follows the queue's, leaseSeconds <= 0 is
        // absent, and a positive one wins for this call only.
        for (queue, lease, want) in [("implicit", "0", 300.0), ("chosen", "-3", 120.0), ("created", "7", 7.0)] {
            b.push_to(queue, "p", &[json!(2)]).await;
            let r = b.pop(&format!("/api/v1/pop/queue/{queue}?leaseSeconds={lease}&batch=10")).await;
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

/// "partitions caps how many partitions one call may claim. 0 or a negative
/// value means no cap. It is ignored by the single-partition route, which by
/// definition claims one." And "batch is the total message budget for the
/// call, shared across every partition the pop touches".
#[tokio::test]
async fn partitions_caps_a_pop_no_cap_at_zero_or_below_ignored_by_the_single_partition_route() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        for p in ["a", "b", "c"] {
            b.push_to("cap", p, &[json!(1), json!(2)]).await;
        }
        for (query, claimed, messages) in [("partitions=2&batch=100", 2, 4), ("partitions=0&batch=100", 3, 6), ("partitions=-1&batch=5", 3, 5)] {
            let body = b.pop(&format!("/api/v1/pop/queue/cap?{query}&consumerGroup=g{claimed}{messages}&autoAck=true")).await.body.expect("a batch");
            assert_eq!(body["partitionsClaimed"], claimed, "{mode} {query}");
            assert_eq!(body["messages"].as_array().unwrap().len(), messages, "{mode} {query}: the batch is shared");
        }
        let body = b.pop("/api/v1/pop/queue/cap/partition/b?partitions=5&batch=100&consumerGroup=one").await.body.expect("b");
        assert_eq!(body["partitionsClaimed"], 1, "{mode}");
        assert!(body["messages"].as_array().unwrap().iter().all(|m| m["partition"] == "b"), "{mode}");
    }
}

/// "Queue mode is an ordinary group with a reserved name: it has its own
/// cursor like any other, and two consumers that both omit consumerGroup
/// share it."
#[tokio::test]
async fn queue_mode_has_its_own_cursor_beside_the_named_groups() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("own", "p", &[json!(1), json!(2)]).await;
        assert_eq!(b.pop("/api/v1/pop/queue/own?batch=1&autoAck=true").await.data(), [json!(1)], "{mode}");
        assert_eq!(b.pop("/api/v1/pop/queue/own?batch=5&consumerGroup=named&autoAck=true").await.data(), [json!(1), json!(2)], "{mode}");
        assert_eq!(b.pop("/api/v1/pop/queue/own?batch=5&autoAck=true").await.data(), [json!(2)], "{mode}: queue mode's own cursor");
    }
}

/// "subscriptionFrom takes now or an ISO-8601 timestamp; an unparseable
/// timestamp is ignored." And "subscriptionMode=all (the default) starts at
/// the oldest retained message; new skips the existing backlog."
#[tokio::test]
async fn subscription_from_now_skips_the_backlog_and_an_unparseable_one_is_ignored() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("from", "p", &[json!("old")]).await;
        let r = b.pop("/api/v1/pop/queue/from?consumerGroup=garbled&subscriptionFrom=not-a-time&autoAck=true").await;
        assert_eq!((r.status, r.data()), (200, vec![json!("old")]), "{mode}: ignored, so all");
        assert_eq!(b.pop("/api/v1/pop/queue/from?consumerGroup=now&subscriptionFrom=now").await.status, 204, "{mode}");
        assert_eq!(b.pop("/api/v1/pop/queue/from?consumerGroup=fresh&subscriptionMode=new").await.status, 204, "{mode}");
        b.push_to("from", "p", &[json!("new")]).await;
        for g in ["now", "fresh"] {
            let r = b.pop(&format!("/api/v1/pop/queue/from?consumerGroup={g}&autoAck=true")).await;
            assert_eq!(r.data(), [json!("new")], "{mode} {g}: only what came after");
        }
    }
}

/// "What a popped message does not carry": no offset, no delivery or
/// attempt count, no lease expiry, no queue name, no headers, no status,
/// retry count or DLQ flag: exactly the ten documented fields. "on the
/// discovery route the top-level queue is empty".
#[tokio::test]
async fn a_popped_message_carries_exactly_its_ten_fields_and_a_discovery_answer_names_no_queue() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("shop.orders", "p", &[json!({"n": 1})]).await;
        let wild = b.pop("/api/v1/pop/queue/shop.orders?consumerGroup=g").await.body.expect("a batch");
        let disc = b.pop("/api/v1/pop?namespace=shop&consumerGroup=d").await.body.expect("a batch");
        assert_eq!(wild["queue"], "shop.orders", "{mode}");
        assert_eq!(disc["queue"], "", "{mode}: the discovery answer's queue is empty");
        let want: std::collections::BTreeSet<&str> =
            ["id", "transactionId", "traceId", "data", "producerSub", "createdAt", "partitionId", "partition", "leaseId", "consumerGroup"].into();
        for body in [&wild, &disc] {
            let m = &body["messages"][0];
            let keys: std::collections::BTreeSet<&str> = m.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, want, "{mode}: {m}");
            assert!(!m["partitionId"].as_str().unwrap().is_empty(), "{mode}: acks need it");
        }
    }
}

/// "An empty pop is a 204 with no body ... 1. Nothing is available for this
/// group. 2. Pop maintenance is on." And "A long poll that times out returns
/// 204, not an error."
#[tokio::test]
async fn an_empty_pop_is_a_bare_204_when_nothing_is_there_under_pop_maintenance_and_after_a_long_poll() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        let bare = |path: &'static str| {
            let b = &b;
            async move {
                let (status, body) = b.get_bytes(path).await;
                assert_eq!((status, body.len()), (204, 0), "{mode} {path}");
            }
        };
        bare("/api/v1/pop/queue/e").await;
        bare("/api/v1/pop/queue/e?wait=true&timeout=200").await;
        b.push_to("e", "p", &[json!(1)]).await;
        assert_eq!(b.post("/api/v1/system/maintenance/pop", json!({"enabled": true})).await.0, 200);
        bare("/api/v1/pop/queue/e").await;
        assert_eq!(b.post("/api/v1/system/maintenance/pop", json!({"enabled": false})).await.0, 200);
        assert_eq!(b.pop("/api/v1/pop/queue/e").await.status, 200, "{mode}: served again");
    }
}

/// "A push wakes parked pops immediately: on the queue-scoped routes, a push
/// to that queue; on the discovery route, any push within the same scope."
#[tokio::test]
async fn a_push_wakes_a_parked_discovery_pop_of_its_scope() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        assert_eq!(b.pop("/api/v1/pop?namespace=wake&consumerGroup=g").await.status, 204);
        let url = format!("{}/api/v1/pop?namespace=wake&consumerGroup=g&wait=true&timeout=10000&autoAck=true", b.url);
        let waiter = tokio::spawn(async move {
            let r = reqwest::get(url).await.unwrap();
            (r.status().as_u16(), Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.push_to("wake.up", "p", &[json!(1)]).await;
        let pushed = Instant::now();
        let (status, at) = waiter.await.unwrap();
        assert_eq!(status, 200, "{mode}");
        assert!(at.duration_since(pushed) < Duration::from_millis(500), "{mode}: woken, not re-checked: {:?}", at.duration_since(pushed));
    }
}

/// "Three different situations all produce that same bare 204: ... 3. The
/// pop's stored procedure reported an error. The error text is discarded
/// with the body." (Here the targeted route's function is made to fail.)
#[tokio::test]
async fn a_stored_procedure_error_answers_a_bare_204() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.push_to("err", "p", &[json!(1)]).await;
        b.sql()
            .await
            .batch_execute(
                "CREATE OR REPLACE FUNCTION queen.pop_specific_v1(p_queue text, p_partition text, p_group text, p_worker text,
                     p_lease_seconds integer, p_auto_ack boolean, p_budget integer, p_intent_mode text, p_intent_from timestamptz)
                 RETURNS SETOF queen.pop_row LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$;",
            )
            .await
            .unwrap();
        let (status, body) = b.get_bytes("/api/v1/pop/queue/err/partition/p").await;
        assert_eq!((status, body.len()), (204, 0), "{mode}");
        // The log is read by another thread: give the line a moment to arrive.
        let logged = || b.logs().iter().any(|l| l.contains("injected failure"));
        for _ in 0..100 {
            if logged() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(logged(), "{mode}: the operator still gets the text in the log");
    }
}

/// "minPopWaitTime ... takes effect on the queue-scoped wildcard route":
/// a targeted pop is never held (API.md §6 A-25).
#[tokio::test]
async fn min_pop_wait_takes_effect_on_the_wildcard_route_only() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        b.post("/api/v1/configure", json!({"queue": "mw", "options": {"minPopWaitTime": 5000}})).await;
        b.push_to("mw", "p", &[json!(1)]).await;
        let started = Instant::now();
        let r = b.pop("/api/v1/pop/queue/mw/partition/p?wait=true&batch=10&timeout=10000&autoAck=true").await;
        assert_eq!(r.data(), [json!(1)], "{mode}");
        assert!(started.elapsed() < Duration::from_millis(1000), "{mode}: not held: {:?}", started.elapsed());
    }
}

// Statements tests/pop.rs held first, in both candidate modes by name (`::hotlist`, `::sql_scan`).
both_modes!(
    the_single_partition_route_claims_only_that_partition_and_registers_nothing,
    the_discovery_route_spans_queues_by_label,
);

/// "partitions ... is ignored by the single-partition route, which by
/// definition claims one" and (seeds/consuming.md) "The targeted pop names
/// one partition and skips candidate selection entirely ... it is also the
/// only one that does not seed the group's cursors across the whole queue":
/// it writes no durable subscription.
async fn the_single_partition_route_claims_only_that_partition_and_registers_nothing(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    b.push_to("q", "mine", &[json!("m")]).await;
    b.push_to("q", "other", &[json!("o")]).await;
    let r = b.pop("/api/v1/pop/queue/q/partition/mine?consumerGroup=g&partitions=5").await;
    assert_eq!(r.data(), [json!("m")]);
    assert_eq!(r.body.unwrap()["partition"], "mine");
    let subs: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.subscriptions", &[]).await.unwrap().get(0);
    assert_eq!(subs, 0, "the targeted pop writes no durable subscription");
    assert_eq!(b.pop("/api/v1/pop/queue/q/partition/nowhere").await.status, 204);
    // Percent-decoded path segments.
    b.push_to("q", "with space", &[json!("s")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/q/partition/with%20space").await.data(), [json!("s")]);
}

/// "The discovery route requires at least one of namespace and task" and
/// "on the discovery route the top-level queue is empty, so a discovery
/// consumer that needs to know which queue a message came from must map it
/// from partitionId itself".
async fn the_discovery_route_spans_queues_by_label(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    b.push_to("billing.invoices", "p", &[json!("i")]).await;
    b.push_to("billing.refunds", "p", &[json!("r")]).await;
    b.push_to("shipping.labels", "p", &[json!("s")]).await;
    let r = b.pop("/api/v1/pop?namespace=billing&batch=10&partitions=0&consumerGroup=g").await;
    let body = r.body.clone().unwrap();
    assert_eq!(body["queue"], "");
    let mut data: Vec<String> = r.data().iter().map(|d| d.as_str().unwrap().to_string()).collect();
    data.sort();
    assert_eq!(data, ["i", "r"]);
    assert!(r.messages().iter().all(|m| !m["partitionId"].as_str().unwrap().is_empty()));
    let r = b.pop("/api/v1/pop?task=labels&consumerGroup=g").await;
    assert_eq!(r.data(), [json!("s")]);
    let r = b.pop("/api/v1/pop?consumerGroup=g").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body.unwrap(), json!({"success": false, "error": "namespace or task is required", "messages": []}));
}

/// "Between wakes the pop re-checks on an interval that backs off
/// (POP_WAIT_INITIAL_INTERVAL_MS 100 ms, growing after
/// POP_WAIT_BACKOFF_THRESHOLD 3 consecutive empty waits by
/// POP_WAIT_BACKOFF_MULTIPLIER 2.0, capped at POP_WAIT_MAX_INTERVAL_MS
/// 1000 ms)". A push through another broker opens no gate here when this
/// broker does not hear the brokers' hints (`QUEEN_PEER_HINTS=false`; with
/// them it wakes at once, tests/cluster.rs), so only the re-check finds it:
/// within an initial interval early in the wait, after a grown one once
/// three re-checks found nothing, within the cap later. (The SQL path: the
/// hot-list learns of such pushes from its reseed instead, tests/pop.rs.)
#[tokio::test]
async fn a_parked_pop_re_checks_on_the_backoff_schedule_when_no_wake_comes() {
    let here = Broker::start_with(&[("QUEEN_HOTLIST", "false"), ("QUEEN_PEER_HINTS", "false")]).await;
    let there = here.peer().await;
    assert_eq!(here.pop("/api/v1/pop/queue/far?consumerGroup=g").await.status, 204);
    // (parked for, found no sooner than, found within) ms after the push: the
    // first three re-checks come 100 ms apart, the fourth 600 ms after the third.
    for (park, after, within) in [(150u64, 0u64, 250u64), (350, 300, 900), (3000, 0, 1150)] {
        let (http, url) = (here.http.clone(), format!("{}/api/v1/pop/queue/far?consumerGroup=g&wait=true&timeout=10000&autoAck=true", here.url));
        let parked = tokio::spawn(async move {
            let r = http.get(&url).send().await.unwrap();
            (r.status().as_u16(), Instant::now())
        });
        // The schedule starts when the pop parks, not when the request was
        // sent (on a loaded CI machine the two were 200 ms apart).
        let mut looks = 0;
        while common::sample(&here.prometheus().await, "queen_parked_long_polls") != Some(1.0) {
            looks += 1;
            assert!(looks < 400, "the pop never parked");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(park)).await;
        there.push_to("far", "p", &[json!(park)]).await;
        let pushed = Instant::now();
        let (status, at) = parked.await.unwrap();
        let took = at.saturating_duration_since(pushed);
        assert_eq!(status, 200);
        assert!(took < Duration::from_millis(within), "parked {park} ms: found {took:?} after the push");
        assert!(took >= Duration::from_millis(after), "parked {park} ms: found {took:?} after the push: the interval did not grow");
    }
}

/// "Two queue options can make a message that is committed still not
/// deliverable ... Both are enforced in SQL, so they apply to every pop
/// route." Held here on the targeted and the discovery route (the wildcard
/// route's holds are tests/seed_life_of_a_pop.rs'), and released once they
/// have passed.
#[tokio::test]
async fn delayed_processing_and_window_buffer_hold_a_message_on_every_pop_route() {
    for (mode, b) in brokers_in_both_modes(&[]).await {
        for (queue, option) in [("vis.delayed", "delayedProcessing"), ("vis.window", "windowBuffer")] {
            let task = queue.split('.').nth(1).unwrap();
            // Labels as the client sends them: configure does not derive them from the name.
            let (status, body) = b.post("/api/v1/configure", json!({"queue": queue, "namespace": "vis", "task": task, "options": {option: 1}})).await;
            assert_eq!(status, 200, "{body}");
            b.push_to(queue, "p", &[json!(option)]).await;
            let routes = [
                format!("/api/v1/pop/queue/{queue}/partition/p?consumerGroup=targeted&autoAck=true"),
                format!("/api/v1/pop?namespace=vis&task={task}&consumerGroup=discovery&autoAck=true"),
                format!("/api/v1/pop/queue/{queue}?consumerGroup=wildcard&autoAck=true"),
            ];
            for route in &routes {
                assert_eq!(b.pop(route).await.status, 204, "{mode} {option}: {route} delivered a message still held");
            }
            tokio::time::sleep(Duration::from_millis(1200)).await; // the option's length is the rule under test
            for route in &routes {
                assert_eq!(b.pop(route).await.data(), [json!(option)], "{mode} {option}: {route}");
            }
        }
    }
}
