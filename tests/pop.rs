//! The pop path over HTTP against a real PostgreSQL, beyond what the seed
//! pages say (those statements live in tests/seed_*.rs, one file per page):
//! the claim's internals (the set-based pass, the ring's look-again, the
//! registration race), API.md's server defaults and a many-consumer drain.
//! Behavioural tests run in both candidate modes: the hot-list ring and the
//! SQL candidate scan.

#[macro_use]
mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::Broker;
use serde_json::{json, Value};

use common::broker_in_mode as broker;

both_modes!(
    default_subscription_mode_applies_to_named_groups_and_never_to_queue_mode,
    twenty_consumers_on_fifty_partitions_get_every_message_exactly_once,
    cursors_a_group_made_before_it_registered_are_kept_at_first_contact,
);

/// API.md §6: `DEFAULT_SUBSCRIPTION_MODE` is the server's default for a named
/// group's first contact; queue mode always reads from the beginning.
async fn default_subscription_mode_applies_to_named_groups_and_never_to_queue_mode(hotlist: bool) {
    let b = broker(hotlist).await;
    b.push_to("q", "p", &[json!("old")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/q?consumerGroup=fresh&subscriptionMode=new").await.status, 204);
    assert_eq!(b.pop("/api/v1/pop/queue/q?subscriptionMode=new").await.data(), [json!("old")], "queue mode never skips backlog");
    b.push_to("q", "p", &[json!("new")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/q?consumerGroup=fresh&subscriptionMode=new").await.data(), [json!("new")]);
    let b2 = Broker::start_with(&[("QUEEN_HOTLIST", if hotlist { "true" } else { "false" }), ("DEFAULT_SUBSCRIPTION_MODE", "new")]).await;
    b2.push_to("q", "p", &[json!("old")]).await;
    assert_eq!(b2.pop("/api/v1/pop/queue/q?consumerGroup=g").await.status, 204, "DEFAULT_SUBSCRIPTION_MODE applies to named groups");
    assert_eq!(b2.pop("/api/v1/pop/queue/q?consumerGroup=h&subscriptionFrom=now").await.status, 204);
    assert_eq!(b2.pop("/api/v1/pop/queue/q").await.data(), [json!("old")], "but never to queue mode");
}

async fn twenty_consumers_on_fifty_partitions_get_every_message_exactly_once(hotlist: bool) {
    let b = broker(hotlist).await;
    const PARTITIONS: usize = 50;
    const EACH: usize = 10;
    for p in 0..PARTITIONS {
        let payloads: Vec<Value> = (0..EACH).map(|i| json!(format!("{p}-{i}"))).collect();
        b.push_to("busy", &format!("p{p}"), &payloads).await;
    }
    let sql = b.sql().await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let url = format!("{}/api/v1/pop/queue/busy?batch=7&partitions=4&consumerGroup=workers", b.url);
        let http = b.http.clone();
        let db = b.db.clone();
        tasks.push(tokio::spawn(async move {
            let sql = common::cluster().connect(&db).await;
            let mut got = Vec::new();
            let mut idle = 0;
            while idle < 20 {
                let r = http.get(&url).send().await.unwrap();
                if r.status().as_u16() == 204 {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                idle = 0;
                let body: Value = r.json().await.unwrap();
                let mut last_per_partition: HashMap<i64, i64> = HashMap::new();
                for m in body["messages"].as_array().unwrap() {
                    got.push(m["data"].as_str().unwrap().to_string());
                    let pid: i64 = m["partitionId"].as_str().unwrap().parse().unwrap();
                    *last_per_partition.entry(pid).or_insert(-1) += 1;
                }
                // Ack stand-in: commit each claimed span exactly to its end.
                for (pid, _) in last_per_partition {
                    let row = sql
                        .query_one("SELECT batch_end, worker_id FROM queen.consumers WHERE partition_id = $1 AND consumer_group = 'workers'", &[&pid])
                        .await
                        .unwrap();
                    assert_eq!(row.get::<_, Option<String>>(1).as_deref(), body["leaseId"].as_str(), "the lease is ours alone");
                    let end: i64 = row.get(0);
                    sql.execute("UPDATE queen.consumers SET committed = $2, worker_id = NULL, lease_expires_at = NULL WHERE partition_id = $1 AND consumer_group = 'workers'", &[&pid, &end]).await.unwrap();
                }
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), PARTITIONS * EACH, "every message delivered");
    assert_eq!(all.len(), PARTITIONS * EACH, "and none twice");
    drop(sql);
}

/// Single-partition pops make cursor rows without registering the group.
/// Its first wildcard pop must keep them: the first contact's insert without
/// a conflict check meets the existing row and falls back to the general
/// rules, which leave it alone.
async fn cursors_a_group_made_before_it_registered_are_kept_at_first_contact(hotlist: bool) {
    let b = broker(hotlist).await;
    b.push_to("early", "a", &[json!("a0"), json!("a1"), json!("a2")]).await;
    b.push_to("early", "b", &[json!("b0"), json!("b1")]).await;
    let r = b.pop("/api/v1/pop/queue/early/partition/a?consumerGroup=g&batch=2&autoAck=true").await;
    assert_eq!(r.data(), [json!("a0"), json!("a1")]);
    let r = b.pop("/api/v1/pop/queue/early?consumerGroup=g&batch=10&partitions=5&autoAck=true").await;
    let mut got: Vec<String> = r.data().iter().map(|d| d.as_str().unwrap().to_string()).collect();
    got.sort();
    assert_eq!(got, ["a2", "b0", "b1"], "a0 and a1 were consumed before the group registered");
    assert_eq!(b.pop("/api/v1/pop/queue/early?consumerGroup=g&autoAck=true").await.status, 204);
    let sql = b.sql().await;
    let subs: i64 = sql.query_one("SELECT count(*) FROM queen.subscriptions WHERE consumer_group = 'g'", &[]).await.unwrap().get(0);
    assert_eq!(subs, 1, "the group is registered");
    let cursors: i64 = sql.query_one("SELECT count(*) FROM queen.consumers WHERE consumer_group = 'g'", &[]).await.unwrap().get(0);
    assert_eq!(cursors, 2);
}

#[tokio::test]
async fn a_pop_whose_ring_candidates_were_emptied_behind_its_back_looks_again() {
    let b = Broker::start().await;
    // First contact builds the ring; the pushes then list a..e in it.
    assert_eq!(b.pop("/api/v1/pop/queue/stale?consumerGroup=g").await.status, 204);
    for p in ["a", "b", "c", "d", "e"] {
        b.push_to("stale", p, &[json!(p)]).await;
    }
    // The single-partition route does not use the ring: a..d are consumed
    // without it knowing.
    for p in ["a", "b", "c", "d"] {
        let r = b.pop(&format!("/api/v1/pop/queue/stale/partition/{p}?consumerGroup=g&autoAck=true")).await;
        assert_eq!(r.data(), [json!(p)]);
    }
    // partitions=1 checks out two candidates a claim: [a, b] and [c, d] are
    // empty, the third look finds e.
    let r = b.pop("/api/v1/pop/queue/stale?consumerGroup=g&partitions=1&autoAck=true").await;
    assert_eq!(r.status, 200, "a pop must not answer empty while the ring still holds work");
    assert_eq!(r.data(), [json!("e")]);
    assert_eq!(b.pop("/api/v1/pop/queue/stale?consumerGroup=g&partitions=1").await.status, 204);
}

/// An autoAck claim that takes a partition up to the last offset pushed
/// drains it: the partition leaves the ring at once, so what is pushed next
/// is found by the next pop instead of after every drained partition has
/// been visited again (issue 51: after a drain of 100,000 partitions,
/// long-polls met 51,815 stale candidates eight at a time).
#[tokio::test]
async fn an_autoack_drain_leaves_no_drained_partition_in_the_ring() {
    let b = Broker::start().await;
    assert_eq!(b.pop("/api/v1/pop/queue/drained?consumerGroup=g").await.status, 204, "first contact builds the ring");
    let items: Vec<Value> = (0..40).map(|i| json!({"queue": "drained", "partition": format!("p{i:02}"), "payload": i})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    let r = b.pop("/api/v1/pop/queue/drained?consumerGroup=g&batch=40&partitions=50&autoAck=true").await;
    assert_eq!(r.data().len(), 40, "one claim drains the forty partitions");
    // partitions=1 checks out two candidates a claim and looks four times:
    // eight visits, fewer than the drained partitions.
    b.push_to("drained", "late", &[json!("late")]).await;
    let r = b.pop("/api/v1/pop/queue/drained?consumerGroup=g&partitions=1&autoAck=true").await;
    assert_eq!(r.data(), [json!("late")], "the new partition is the ring's only candidate");
    // A drained partition pushed again is a candidate again.
    b.push_to("drained", "p07", &[json!("again")]).await;
    let r = b.pop("/api/v1/pop/queue/drained?consumerGroup=g&partitions=1&autoAck=true").await;
    assert_eq!(r.data(), [json!("again")]);
    assert_eq!(b.pop("/api/v1/pop/queue/drained?consumerGroup=g&partitions=1").await.status, 204);
}

/// Eight consumers of a new group popping at once: one pop leads the first
/// contact (it registers the group, seeding its cursors, and reads the
/// ring's first seed); the others wait for it and claim from the ring. Before,
/// each took the SQL path: eight registrations (`register_group_v1`) and
/// eight candidate scans of every partition (`pop_wildcard_v1`).
#[tokio::test]
async fn concurrent_first_pops_of_a_group_register_it_once_and_claim_from_one_seed() {
    let mut b = common::broker_counting_calls(&[("QUEEN_HOTLIST", "true")]).await;
    let items: Vec<Value> = (0..200).map(|p| json!({"queue": "crowd", "partition": format!("p{p}"), "payload": p})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let url = format!("{}/api/v1/pop/queue/crowd?batch=10&partitions=4&consumerGroup=fresh&autoAck=true", b.url);
        let http = b.http.clone();
        tasks.push(tokio::spawn(async move {
            let r = http.get(url).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200, "200 partitions have work for every first pop");
            let body: Value = r.json().await.unwrap();
            body["messages"].as_array().unwrap().iter().map(|m| m["data"].as_i64().unwrap()).collect::<Vec<i64>>()
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.extend(t.await.unwrap());
    }
    assert_eq!(got.len(), 32, "four partitions of one message each, eight times");
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 32, "no message twice");
    let calls = common::calls_after_exit(&mut b).await;
    assert!(calls("pop_list_set_v1") >= 1, "the pops claimed through the ring");
    assert_eq!(calls("first_contact_v2"), 1, "one first contact");
    assert_eq!(calls("register_group_v1"), 0, "a new group from the beginning needs no general rules");
    assert_eq!(calls("pop_wildcard_v1"), 0, "no pop scanned every partition for candidates");
}

async fn scalar(sql: &tokio_postgres::Client, q: &str) -> i64 {
    sql.query_one(q, &[]).await.unwrap().get(0)
}

/// Pops `queue` for `group` with autoAck until three pops in a row come back
/// empty (at most `max_pops`), and answers the payloads delivered.
async fn drain_autoack(b: &Broker, queue: &str, group: &str, max_pops: usize) -> Vec<i64> {
    let (mut got, mut empty) = (Vec::new(), 0);
    for _ in 0..max_pops {
        let r = b.pop(&format!("/api/v1/pop/queue/{queue}?consumerGroup={group}&batch=100&partitions=100&autoAck=true")).await;
        if r.status == 204 {
            empty += 1;
            if empty == 3 {
                break;
            }
            continue;
        }
        empty = 0;
        got.extend(r.data().iter().map(|d| d.as_i64().unwrap()));
    }
    got
}

/// The rows of a first contact's seed or of one chunk of its walk: the
/// partitions holding messages, and where the walk goes on.
async fn seed_rows(sql: &tokio_postgres::Client, call: &str) -> (Vec<String>, Option<String>) {
    let rows = sql.query(&format!("SELECT o_partition_id, o_partition FROM {call}"), &[]).await.unwrap();
    let (mut pending, mut rest) = (Vec::new(), None);
    for r in rows {
        match r.get::<_, Option<i64>>(0) {
            Some(_) => pending.push(r.get(1)),
            None => rest = Some(r.get(1)),
        }
    }
    (pending, rest)
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("p{i:02}")).collect()
}

/// Issue 51: a new group's first contact covers the first
/// `QUEEN_CURSOR_SEED_CHUNK` partitions only (their cursors, and those
/// holding messages as the ring's seed) and says where it stopped; the rest
/// are walked a chunk per statement (`queen.seed_cursors_v1`), each leaving
/// alone a cursor something else wrote, and none once the group's
/// subscription is gone. Through the broker, the walk writes every cursor
/// while the group drains, and the drain delivers every message once.
#[tokio::test]
async fn a_new_groups_first_contact_covers_one_chunk_and_a_task_walks_the_rest() {
    let b = Broker::start_with(&[("QUEEN_CURSOR_SEED_CHUNK", "7")]).await;
    // Thirty partitions; p05 is created empty (its one message pushed and consumed first).
    let items: Vec<Value> =
        (0..60).map(|i| json!({"queue": "chunks", "partition": format!("p{:02}", i / 2), "payload": i})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    let sql = b.sql().await;
    sql.execute("UPDATE queen.partitions SET log_start = last_offset + 1 WHERE name = 'p05'", &[]).await.unwrap();

    // The functions, for a group the broker never sees.
    let (pending, rest) = seed_rows(&sql, "queen.first_contact_v2('chunks', 'direct', NULL, NULL, 7)").await;
    assert_eq!(pending, [names(0..5), names(6..7)].concat(), "the first seven partitions holding messages");
    assert_eq!(rest.as_deref(), Some("p06"), "and where the walk goes on");
    let direct = "SELECT count(*) FROM queen.consumers WHERE consumer_group = 'direct'";
    assert_eq!(scalar(&sql, direct).await, 7, "seven cursors, p00 to p06");
    let walk = |after: &'static str| {
        let call = format!("queen.seed_cursors_v1('chunks', 'direct', '{after}', 10)");
        let sql = &sql;
        async move { seed_rows(sql, &call).await }
    };
    assert_eq!(walk("p06").await, (names(7..17), Some("p16".to_string())));
    assert_eq!(scalar(&sql, direct).await, 17);
    sql.execute(
        "INSERT INTO queen.consumers (partition_id, consumer_group, committed)
         SELECT p.id, 'direct', 1 FROM queen.partitions p WHERE p.name = 'p20'",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(walk("p16").await, (names(17..27), Some("p26".to_string())));
    assert_eq!(walk("p26").await, (names(27..30), None), "three partitions left: the walk's end");
    assert_eq!(scalar(&sql, direct).await, 30);
    assert_eq!(
        scalar(&sql, "SELECT count(*) FROM queen.consumers WHERE consumer_group = 'direct' AND committed = -1").await,
        29,
        "every written cursor reads from the start; p20's, written before, is kept"
    );
    sql.execute("DELETE FROM queen.subscriptions WHERE consumer_group = 'direct'", &[]).await.unwrap();
    sql.execute("DELETE FROM queen.consumers WHERE consumer_group = 'direct'", &[]).await.unwrap();
    assert_eq!(walk("").await, (vec![], None));
    assert_eq!(scalar(&sql, direct).await, 0, "no cursor for a group no longer subscribed");

    // Through the broker.
    let first = b.pop("/api/v1/pop/queue/chunks?consumerGroup=workers&batch=4&partitions=2&autoAck=true").await;
    assert_eq!(first.data().len(), 4, "the first contact answers with messages");
    common::eventually("the walk to write every cursor", Duration::from_secs(10), || async {
        scalar(&sql, "SELECT count(*) FROM queen.consumers WHERE consumer_group = 'workers'").await == 30
    })
    .await;
    let mut got: Vec<i64> = first.data().iter().map(|d| d.as_i64().unwrap()).collect();
    got.extend(drain_autoack(&b, "chunks", "workers", 50).await);
    got.sort();
    let expected: Vec<i64> = (0..60).filter(|i| i / 2 != 5).collect();
    assert_eq!(got, expected, "every message once, from the ring the walk fed");
}

/// A broker killed while it writes a new group's cursors loses nothing and
/// repeats nothing: the claims write the cursors it did not get to (a
/// chunk of one partition makes the task slow enough to be cut short).
#[tokio::test]
async fn a_broker_killed_while_it_writes_a_groups_cursors_loses_and_repeats_nothing() {
    const PARTITIONS: i64 = 3000;
    let mut b = Broker::start_with(&[("QUEEN_CURSOR_SEED_CHUNK", "1")]).await;
    let items: Vec<Value> = (0..PARTITIONS).map(|i| json!({"queue": "cut", "partition": format!("p{i:04}"), "payload": i})).collect();
    assert_eq!(b.post("/api/v1/push", json!({ "items": items })).await.0, 201);
    let first = b.pop("/api/v1/pop/queue/cut?consumerGroup=g&batch=10&partitions=10&autoAck=true").await;
    b.kill();
    let mut got: Vec<i64> = first.data().iter().map(|d| d.as_i64().unwrap()).collect();
    assert_eq!(got.len(), 10);
    let sql = b.sql().await;
    let cursors = "SELECT count(*) FROM queen.consumers WHERE consumer_group = 'g'";
    let written = scalar(&sql, cursors).await;
    assert!(written < PARTITIONS, "the kill cut the task short ({written} cursors)");
    b.restart().await;
    got.extend(drain_autoack(&b, "cut", "g", 200).await);
    got.sort();
    assert_eq!(got, (0..PARTITIONS).collect::<Vec<i64>>(), "every message once, across the kill");
    assert_eq!(scalar(&sql, cursors).await, PARTITIONS, "the claims wrote the cursors the task did not");
    assert_eq!(scalar(&sql, "SELECT count(*) FROM queen.consumers WHERE consumer_group = 'g' AND committed = 0").await, PARTITIONS);
}

/// A claim that can take one partition only (a batch of one, a partition cap
/// of one) goes to the per-partition list, directly or (at batch 1, alone in
/// the shared claim, `pop::share`) through the share, never to
/// `pop_list_set_v1`: that would lock every candidate's cursor row to claim
/// one.
#[tokio::test]
async fn a_claim_of_one_partition_skips_the_set_based_pass() {
    let mut b = common::broker_counting_calls(&[("QUEEN_HOTLIST", "true")]).await;
    for p in 0..4 {
        b.push_to("single", &format!("p{p}"), &[json!({"p": p, "k": 0}), json!({"p": p, "k": 1})]).await;
    }
    let mut got = Vec::new();
    for query in ["batch=1", "batch=1", "batch=10&partitions=1", "batch=10&partitions=1"] {
        let r = b.pop(&format!("/api/v1/pop/queue/single?{query}&consumerGroup=g&autoAck=true")).await;
        let body = r.body.unwrap_or_else(|| panic!("{query}: a batch"));
        let messages: Vec<(i64, i64)> =
            body["messages"].as_array().unwrap().iter().map(|m| (m["data"]["p"].as_i64().unwrap(), m["data"]["k"].as_i64().unwrap())).collect();
        if query == "batch=1" {
            assert_eq!(messages.len(), 1, "{query}: {messages:?}");
        } else {
            assert!(messages.iter().all(|m| m.0 == messages[0].0), "{query}: one partition, what is left of it: {messages:?}");
        }
        got.extend(messages);
    }
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), got.len(), "nothing twice: {got:?}");
    let calls = common::calls_after_exit(&mut b).await;
    assert!(calls("pop_list_v3") >= 4, "the first contact's claim, the capped ones and the lone shared one through the per-partition list");
    assert_eq!(calls("pop_list_shared_v3"), 0, "a pop alone in the shared claim sends the per-partition list itself");
    assert_eq!(calls("pop_list_set_v1"), 0, "no set-based pass over every candidate");
}

/// Once a claim without a partition cap fills its batch from one partition,
/// the ring's next claims go to the per-partition list (a drain of deep
/// partitions), until a claim spans several partitions again.
#[tokio::test]
async fn after_a_claim_filled_from_one_partition_the_next_ones_skip_the_set_based_pass() {
    let mut b = common::broker_counting_calls(&[("QUEEN_HOTLIST", "true")]).await;
    for p in 0..2 {
        let payloads: Vec<Value> = (0..30).map(|k| json!({"p": p, "k": k})).collect();
        b.push_to("deep", &format!("p{p}"), &payloads).await;
    }
    let pop = |query: &'static str| {
        let b = &b;
        async move {
            let r = b.pop(&format!("/api/v1/pop/queue/deep?{query}&partitions=0&consumerGroup=g&autoAck=true")).await;
            let body = r.body.unwrap_or_else(|| panic!("{query}: a batch"));
            body["messages"].as_array().unwrap().iter().map(|m| (m["data"]["p"].as_i64().unwrap(), m["data"]["k"].as_i64().unwrap())).collect::<Vec<_>>()
        }
    };
    let mut got = Vec::new();
    for _ in 0..4 {
        let batch = pop("batch=10").await;
        assert_eq!(batch.len(), 10, "{batch:?}");
        assert!(batch.iter().all(|m| m.0 == batch[0].0), "one partition fills it: {batch:?}");
        got.extend(batch);
    }
    // Through the per-partition list too, the rest of both partitions in one
    // claim; that claim spanned two, so the next one is set-based again.
    let rest = pop("batch=100").await;
    assert_eq!(rest.len(), 20, "{rest:?}");
    got.extend(rest);
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 60, "every message once");
    for p in 0..2 {
        b.push_to("deep", &format!("p{p}"), &[json!({"p": p, "k": 30})]).await;
    }
    assert_eq!(pop("batch=100").await.len(), 2);
    let calls = common::calls_after_exit(&mut b).await;
    // The first claim is the set-based statement's own (it locks both cursor
    // rows and claims from the first): nothing for the per-partition list.
    assert_eq!(calls("pop_list_set_v1"), 2, "the first claim and the one after the claim over two partitions");
    assert_eq!(calls("pop_list_v3"), 4, "three claims after the first, the one over both");
    assert_eq!(calls("pop_list_v2"), 1, "the one over both went on to the second partition");
    assert_eq!(calls("pop_list_v1"), 0, "the set-based claims needed no per-partition pass");
}

#[tokio::test]
async fn unparseable_parameters_answer_400_naming_them() {
    let b = Broker::start().await;
    for (q, name) in [("batch=x", "batch"), ("wait=perhaps", "wait"), ("timeout=-5", "timeout"), ("partitions=two", "partitions"), ("autoAck=7", "autoAck"), ("subscriptionMode=sometimes", "subscriptionMode")] {
        let r = b.pop(&format!("/api/v1/pop/queue/q?{q}")).await;
        assert_eq!(r.status, 400, "{q}");
        let err = r.body.unwrap()["error"].as_str().unwrap().to_string();
        assert!(err.starts_with(name), "{q}: {err}");
    }
}

/// A push through another broker that sends no hint (tests/cluster.rs has
/// them) is invisible to this broker's rings until a
/// reseed; idle rings are reseeded in the background (one query for every
/// due ring), which opens the gate of a long-poll parked here.
#[tokio::test]
async fn a_push_through_another_broker_reaches_a_parked_long_poll_through_the_background_reseed() {
    let here = Broker::start_with(&[("QUEEN_HOTLIST_RESEED_MS", "400"), ("QUEEN_PEER_HINTS", "false")]).await;
    let there = here.peer().await;
    // First contact, so the ring exists and is idle.
    assert_eq!(here.pop("/api/v1/pop/queue/far?consumerGroup=g").await.status, 204);
    let parked = {
        let (http, url) = (here.http.clone(), format!("{}/api/v1/pop/queue/far?consumerGroup=g&wait=true&timeout=8000", here.url));
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = http.get(&url).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.ok(), started.elapsed())
        })
    };
    here.until_parked(1).await;
    there.push_to("far", "p", &[json!("from elsewhere")]).await;
    let (status, body, took) = parked.await.unwrap();
    assert_eq!(status, 200, "the parked pop was answered");
    assert_eq!(body.unwrap()["messages"][0]["data"], json!("from elsewhere"));
    assert!(took < Duration::from_secs(7), "answered by a reseed (~0.4 s), not the 8 s deadline: {took:?}");
}


/// A ring's reseed reads a window of its queue (issue 51): over 25
/// partitions in windows of 10, a push through another broker to the last
/// partition by name (`p9`, in the third window) still reaches a long-poll
/// parked here, as the reseeds walk on.
#[tokio::test]
async fn a_reseed_walks_a_queue_wider_than_its_window() {
    let here = Broker::start_with(&[("QUEEN_HOTLIST_RESEED_MS", "300"), ("QUEEN_PEER_HINTS", "false"), ("QUEEN_MAINTENANCE_WINDOW", "10")]).await;
    let there = here.peer().await;
    for n in 0..25 {
        here.push_to("wide", &format!("p{n}"), &[json!(n)]).await;
    }
    let mut drained = 0;
    while drained < 25 {
        let r = here.pop("/api/v1/pop/queue/wide?consumerGroup=g&batch=10&autoAck=true").await;
        assert_eq!(r.status, 200, "25 messages to drain, {drained} so far");
        drained += r.body.unwrap()["messages"].as_array().unwrap().len();
    }
    let parked = {
        let (http, url) = (here.http.clone(), format!("{}/api/v1/pop/queue/wide?consumerGroup=g&wait=true&timeout=9000&autoAck=true", here.url));
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = http.get(&url).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.ok(), started.elapsed())
        })
    };
    here.until_parked(1).await;
    there.push_to("wide", "p9", &[json!("last by name")]).await;
    let (status, body, took) = parked.await.unwrap();
    assert_eq!(status, 200, "the parked pop was answered");
    assert_eq!(body.unwrap()["messages"][0]["data"], json!("last by name"));
    assert!(took < Duration::from_secs(8), "answered by the walk's reseeds, not the 9 s deadline: {took:?}");

    // The function the reseeds call: three windows cover the queue, each
    // naming where the next starts; only partitions with data past g's
    // cursor come back as pending (p9 is consumed by now: none).
    there.push_to("wide", "p10", &[json!("again")]).await;
    let sql = here.sql().await;
    let mut after = String::new();
    let mut seen_all = 0;
    let mut pending = Vec::new();
    for _ in 0..3 {
        let rows = sql
            .query("SELECT o_edge, o_seen, o_pending, o_partition FROM queen.hotlist_seed_window_v1(ARRAY['wide'], ARRAY['g'], ARRAY[$1], 10)", &[&after])
            .await
            .unwrap();
        let (edge, seen): (String, i32) = (rows[0].get(0), rows[0].get(1));
        seen_all += seen;
        pending.extend(rows.iter().filter(|r| r.get::<_, bool>(2)).map(|r| r.get::<_, String>(3)));
        after = edge;
    }
    assert_eq!(seen_all, 25, "three windows of 10, 10 and 5");
    assert_eq!(pending, vec!["p10".to_string()]);
    assert_eq!(after, "p9", "the last window ends at the last name");
}

/// The claim comparisons' partitions: p0, p1, … of queue `diff` holding
/// `counts` messages each, p2 with a second segment of two, g0 of a gated
/// queue holding two, group `g` registered, then `late` (no cursor row yet);
/// p1's cursor at 1, p3 leased to another worker. Answers each partition's
/// id by name.
async fn claim_fixture(b: &Broker, counts: &[usize]) -> (tokio_postgres::Client, HashMap<String, i64>) {
    for (i, &n) in counts.iter().enumerate() {
        let payloads: Vec<Value> = (0..n).map(|k| json!({ "p": i, "k": k })).collect();
        b.push_to("diff", &format!("p{i}"), &payloads).await;
    }
    b.push_to("diff", "p2", &[json!("second segment"), json!("of p2")]).await;
    b.push_to("gated", "g0", &[json!(1), json!(2)]).await;
    let sql = b.sql().await;
    sql.batch_execute(
        "SELECT queen.register_group_v1(id, 'g', NULL, NULL) FROM queen.queues;
         UPDATE queen.queues SET window_buffer = 3600 WHERE name = 'gated';",
    )
    .await
    .unwrap();
    b.push_to("diff", "late", &[json!("no cursor row yet")]).await;
    sql.batch_execute(
        "UPDATE queen.consumers c SET committed = 1 FROM queen.partitions p
             WHERE p.id = c.partition_id AND p.name = 'p1';
         UPDATE queen.consumers c SET worker_id = 'other', lease_expires_at = now() + interval '1 hour'
             FROM queen.partitions p WHERE p.id = c.partition_id AND p.name = 'p3';",
    )
    .await
    .unwrap();
    let rows = sql.query("SELECT name, id FROM queen.partitions", &[]).await.unwrap();
    let id = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    (sql, id)
}

/// Group `g`'s cursor rows, one line each, in partition order.
async fn cursor_rows(sql: &tokio_postgres::Client) -> Vec<String> {
    let rows = sql
        .query(
            "SELECT format('%s %s %s %s %s %s %s %s %s', partition_id, committed, worker_id, batch_end, attempt_count,
                           attempt_offset, total_consumed, last_consumed_at IS NOT NULL, lease_expires_at - lease_acquired_at)
             FROM queen.consumers WHERE consumer_group = 'g' ORDER BY partition_id",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// One claim's answer in comparable form: its rows sorted by partition,
/// kind and offset (the set-based pass answers its partitions before the
/// ones it hands on), blobs as digests, then the group's cursor rows as
/// the claim left them. Runs inside a transaction that is rolled back.
async fn claim_and_roll_back(
    sql: &tokio_postgres::Client,
    function: &str,
    pids: &[i64],
    (budget, max_partitions, auto_ack): (i32, i32, bool),
) -> (Vec<String>, Vec<String>) {
    sql.batch_execute("BEGIN").await.unwrap();
    let rows = sql
        .query(
            &format!(
                "SELECT o_partition_id, CASE WHEN o_kind = 'busy' THEN NULL ELSE o_partition END, o_kind, o_base_offset,
                        o_start_idx, o_take, o_created_at::text, md5(o_blob), o_first, o_last, o_attempt, o_msg_count
                 FROM queen.{function}($1, 'g', 'me', 30, $2, $3, $4, NULL, NULL)"
            ),
            &[&pids, &auto_ack, &budget, &max_partitions],
        )
        .await
        .unwrap();
    let mut answer: Vec<(i64, bool, Option<i64>, String)> = rows
        .iter()
        .map(|r| {
            let described = format!(
                "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
                r.get::<_, Option<String>>(1), r.get::<_, String>(2), r.get::<_, Option<i64>>(3),
                r.get::<_, Option<i32>>(4), r.get::<_, Option<i32>>(5), r.get::<_, Option<String>>(6),
                r.get::<_, Option<String>>(7), r.get::<_, Option<i64>>(8), r.get::<_, Option<i64>>(9),
                r.get::<_, Option<i32>>(10), r.get::<_, Option<i32>>(11)
            );
            (r.get(0), r.get::<_, String>(2) != "segment", r.get(3), described)
        })
        .collect();
    answer.sort();
    let cursors = cursor_rows(sql).await;
    sql.batch_execute("ROLLBACK").await.unwrap();
    (
        answer.into_iter().map(|(pid, _, _, d)| format!("{pid} {d}")).collect(),
        cursors,
    )
}

/// The stored functions one claim called (PostgreSQL's per-transaction
/// function statistics), rolled back. On a connection of its own: a
/// backend's function statistics stay pending, and visible to the next
/// transaction's view, until it reports them (at most once a second).
async fn functions_called(b: &Broker, function: &str, pids: &[i64], budget: i32) -> Vec<String> {
    let sql = b.sql().await;
    sql.batch_execute("SET track_functions = 'pl'; BEGIN").await.unwrap();
    sql.query(&format!("SELECT * FROM queen.{function}($1, 'g', 'me', 30, false, $2, 0, NULL, NULL)"), &[&pids, &budget])
        .await
        .unwrap();
    let rows = sql.query("SELECT funcname::text FROM pg_stat_xact_user_functions ORDER BY 1", &[]).await.unwrap();
    sql.batch_execute("ROLLBACK; RESET track_functions").await.unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// `pop_list_prefix_v1` and `pop_list_set_v1` claim the plain candidates in one
/// statement; each must answer what `pop_list_v1` (one partition at a time)
/// answers, rows and cursor rows alike: a budget shared across partitions
/// (cut inside one), the partition cap, auto-ack, a cursor inside a segment,
/// a partition of two segments, a leased partition ('busy'), one locked by
/// another transaction ('busy' said by the set-based pass), a partition
/// without a cursor row and a gated queue (both handed on to the
/// per-partition path).
#[tokio::test]
async fn the_set_based_claim_answers_what_the_per_partition_claim_answers() {
    let b = Broker::start().await;
    let (sql, id) = claim_fixture(&b, &[3, 4, 5, 6, 7]).await;
    let pids: Vec<i64> = ["p0", "p1", "p2", "p3", "p4", "late", "g0"].iter().map(|n| id[*n]).collect();
    let scenarios = [(100, 0, false), (100, 0, true), (9, 0, false), (12, 0, false), (100, 2, false), (1, 0, false)];
    const SET_BASED: [&str; 2] = ["pop_list_prefix_v1", "pop_list_set_v1"];
    for scenario in scenarios {
        let each = claim_and_roll_back(&sql, "pop_list_v1", &pids, scenario).await;
        for set_based in SET_BASED {
            let v = claim_and_roll_back(&sql, set_based, &pids, scenario).await;
            assert_eq!(v, each, "{set_based}, scenario (budget, max partitions, auto-ack) = {scenario:?}");
            assert!(v.0.iter().any(|r| r.contains("\"claimed\"")), "{scenario:?} claims something");
        }
    }
    for set_based in SET_BASED {
        let (all, _) = claim_and_roll_back(&sql, set_based, &pids, (100, 0, false)).await;
        let verdicts = |kind: &str| all.iter().filter(|r| r.contains(&format!("\"{kind}\""))).count();
        assert_eq!((verdicts("claimed"), verdicts("busy"), verdicts("deferred")), (5, 1, 1), "{set_based}: {all:#?}");
        assert_eq!(all.iter().filter(|r| r.contains("\"segment\"")).count(), 6, "p0 p1 p2 (2) p4 late: {all:#?}");
    }

    // Plain candidates only: one statement claims them all, no per-partition
    // call, also when the budget ends inside one of them.
    let plain = [pids[0], pids[1], pids[2], pids[4]];
    for budget in [100, 9] {
        assert_eq!(functions_called(&b, "pop_list_prefix_v1", &plain, budget).await, ["pop_list_prefix_v1"], "budget {budget}");
    }
    // One candidate, or one plain-looking one, is cheaper through pop_list_v1.
    assert_eq!(functions_called(&b, "pop_list_prefix_v1", &plain[..1], 100).await, ["pop_list_prefix_v1", "pop_list_v1"]);
    assert_eq!(functions_called(&b, "pop_list_prefix_v1", &plain, 3).await, ["pop_list_prefix_v1", "pop_list_v1"]);
    assert_eq!(
        functions_called(&b, "pop_list_prefix_v1", &pids, 100).await,
        ["pop_claim_v1", "pop_list_prefix_v1", "pop_list_v1", "seed_cursor_v1"]
    );
    // pop_list_set_v1 looks at the same prefix under its lock: the plain ones
    // are all its own, also when the first fills the budget; one candidate
    // still goes to pop_list_v1, and so do a row not yet seeded and a gated queue.
    for budget in [100, 9, 3] {
        assert_eq!(functions_called(&b, "pop_list_set_v1", &plain, budget).await, ["pop_list_set_v1"], "budget {budget}");
    }
    assert_eq!(functions_called(&b, "pop_list_set_v1", &plain[..1], 100).await, ["pop_list_set_v1", "pop_list_v1"]);
    assert_eq!(
        functions_called(&b, "pop_list_set_v1", &pids, 100).await,
        ["pop_claim_v1", "pop_list_set_v1", "pop_list_v1", "seed_cursor_v1"]
    );

    // p0's cursor row locked by another transaction: 'busy' from the set pass.
    let c = common::cluster();
    let other = c.connect(&b.db).await;
    other.batch_execute("BEGIN").await.unwrap();
    other.execute("SELECT 1 FROM queen.consumers WHERE partition_id = $1 FOR UPDATE", &[&pids[0]]).await.unwrap();
    let each = claim_and_roll_back(&sql, "pop_list_v1", &pids, (100, 0, false)).await;
    for set_based in SET_BASED {
        let v = claim_and_roll_back(&sql, set_based, &pids, (100, 0, false)).await;
        assert_eq!(v, each, "{set_based}");
        assert!(v.0.iter().any(|r| r.starts_with(&format!("{} None \"busy\"", pids[0]))), "{set_based}: {:#?}", v.0);
    }
    other.batch_execute("ROLLBACK").await.unwrap();
}

/// A claim through a function of the per-partition list's arguments
/// (`pop_list_v2`, `pop_list_v3`): its rows in the order they came (blobs as
/// digests, `held` for one left out), then the group's cursor rows as it left
/// them. Rolled back.
async fn listed_claim_and_roll_back(
    sql: &tokio_postgres::Client,
    function: &str,
    pids: &[i64],
    cached: &[Option<i64>],
    (budget, max_partitions, auto_ack): (i32, i32, bool),
) -> (Vec<String>, Vec<String>) {
    sql.batch_execute("BEGIN").await.unwrap();
    let rows = sql
        .query(
            &format!(
                "SELECT format('%s %s %s %s %s %s %s %s %s %s %s %s', o_partition_id,
                        CASE WHEN o_kind = 'busy' THEN NULL ELSE o_partition END, o_kind, o_base_offset, o_start_idx,
                        o_take, o_created_at, CASE WHEN o_kind = 'segment' THEN COALESCE(md5(o_blob), 'held') END,
                        o_first, o_last, o_attempt, o_msg_count)
                 FROM queen.{function}($1, $2, 'g', 'me', 30, $3, $4, $5, NULL, NULL)"
            ),
            &[&pids, &cached, &auto_ack, &budget, &max_partitions],
        )
        .await
        .unwrap();
    let answer = rows.iter().map(|r| r.get(0)).collect();
    let cursors = cursor_rows(sql).await;
    sql.batch_execute("ROLLBACK").await.unwrap();
    (answer, cursors)
}

/// `pop_list_v3` (0051) claims a plain first candidate in one statement and
/// hands everything else to `pop_list_v2`; it must answer what `pop_list_v2`
/// answers, rows, their order and cursor rows alike, whatever the first
/// candidate is: plain, a cursor inside a segment, a claim past its head
/// segment, leased, locked elsewhere ('busy'), without a cursor row, of a
/// gated queue; with the budget ending inside it or going on to the next
/// candidate, the partition cap, autoAck and a held segment. A plain first
/// candidate costs one statement; the second candidate, when the budget
/// reaches it, goes through `pop_list_v2`.
#[tokio::test]
async fn the_one_statement_claim_answers_what_the_per_partition_list_answers() {
    let b = Broker::start().await;
    let (sql, id) = claim_fixture(&b, &[3, 4, 5, 6, 7]).await;
    let ids = |names: &[&str]| -> Vec<i64> { names.iter().map(|n| id[*n]).collect() };
    let lists = [ids(&["p0", "p4"]), ids(&["p1", "p4"]), ids(&["p2", "p4"]), ids(&["p3", "p4"]), ids(&["late", "p4"]), ids(&["g0", "p4"]), ids(&["p2"])];
    let scenarios = [(1, 0, false), (1, 0, true), (3, 0, false), (6, 0, false), (8, 0, false), (8, 1, false), (100, 0, true), (100, 2, false)];
    let mut claimed_first = 0;
    for pids in &lists {
        // p0's and p2's head segments start at offset 0: held, and not.
        for held in [None, Some(0)] {
            let cached: Vec<Option<i64>> = std::iter::once(held).chain(std::iter::repeat(None)).take(pids.len()).collect();
            for scenario in scenarios {
                let each = listed_claim_and_roll_back(&sql, "pop_list_v2", pids, &cached, scenario).await;
                let one = listed_claim_and_roll_back(&sql, "pop_list_v3", pids, &cached, scenario).await;
                assert_eq!(one, each, "candidates {pids:?}, held {held:?}, (budget, cap, autoAck) = {scenario:?}");
                claimed_first += usize::from(one.0.iter().any(|r| r.starts_with(&format!("{} ", pids[0])) && r.contains(" claimed ")));
            }
        }
    }
    assert!(claimed_first >= 3 * 2 * scenarios.len(), "p0, p1 and p2 claimed first every time: {claimed_first}");
    let (p2_past_head, _) = listed_claim_and_roll_back(&sql, "pop_list_v3", &ids(&["p2"]), &[Some(0)], (100, 0, false)).await;
    assert_eq!(p2_past_head.len(), 3, "p2's two segments, the first held, then the claim: {p2_past_head:#?}");
    assert!(p2_past_head[0].contains(" held ") && !p2_past_head[1].contains(" held "), "{p2_past_head:#?}");

    // What each claim called (per-transaction function statistics).
    let counted = b.sql().await;
    let called = |pids: Vec<i64>, budget: i32| {
        let counted = &counted;
        async move {
            counted.batch_execute("SET track_functions = 'pl'; BEGIN").await.unwrap();
            let cached = vec![None::<i64>; pids.len()];
            counted
                .query("SELECT * FROM queen.pop_list_v3($1, $2, 'g', 'me', 30, false, $3, 0, NULL, NULL)", &[&pids, &cached, &budget])
                .await
                .unwrap();
            let rows = counted.query("SELECT funcname::text FROM pg_stat_xact_user_functions ORDER BY 1", &[]).await.unwrap();
            counted.batch_execute("ROLLBACK; RESET track_functions").await.unwrap();
            rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>()
        }
    };
    assert_eq!(called(ids(&["p0", "p4"]), 1).await, ["pop_list_v3"], "a plain first candidate: one statement");
    assert_eq!(called(ids(&["p0", "p4"]), 5).await, ["pop_list_v2", "pop_list_v3"], "budget left: on to p4");
    assert_eq!(called(ids(&["p3", "p4"]), 1).await, ["pop_list_v2", "pop_list_v3"], "leased first: the list says busy");

    // p0's cursor row locked by another transaction: 'busy', then p4.
    let other = common::cluster().connect(&b.db).await;
    other.batch_execute("BEGIN").await.unwrap();
    other.execute("SELECT 1 FROM queen.consumers WHERE partition_id = $1 FOR UPDATE", &[&id["p0"]]).await.unwrap();
    let pids = ids(&["p0", "p4"]);
    let each = listed_claim_and_roll_back(&sql, "pop_list_v2", &pids, &[None, None], (1, 0, false)).await;
    let one = listed_claim_and_roll_back(&sql, "pop_list_v3", &pids, &[None, None], (1, 0, false)).await;
    assert_eq!(one, each);
    assert!(one.0[0].starts_with(&format!("{}  busy", id["p0"])), "{:#?}", one.0);
    assert!(one.0.iter().any(|r| r.starts_with(&format!("{} p4 claimed", id["p4"]))), "{:#?}", one.0);
    other.batch_execute("ROLLBACK").await.unwrap();
}

/// One slot of a shared claim, as `pop::share` sends it: candidates, the
/// segment base it holds of each, lease id, budget, partition cap, autoAck.
type Slot<'a> = (&'a [i64], Vec<Option<i64>>, &'a str, i32, i32, bool);

/// A shared claim's rows, each as one line (blobs as digests, `held` for a
/// segment whose blob was left out), in the order they came, in the
/// caller's transaction. Slot i's lease time is 30 + i seconds.
async fn shared_claim(sql: &tokio_postgres::Client, function: &str, slots: &[Slot<'_>]) -> Vec<String> {
    let (mut ends, mut pids, mut cached) = (Vec::new(), Vec::new(), Vec::new());
    for (p, c, ..) in slots {
        pids.extend_from_slice(p);
        cached.extend_from_slice(c);
        ends.push(pids.len() as i32);
    }
    let n = slots.len();
    let workers: Vec<&str> = slots.iter().map(|s| s.2).collect();
    let leases: Vec<i32> = (0..n as i32).map(|i| 30 + i).collect();
    let budgets: Vec<i32> = slots.iter().map(|s| s.3).collect();
    let caps: Vec<i32> = slots.iter().map(|s| s.4).collect();
    let auto: Vec<bool> = slots.iter().map(|s| s.5).collect();
    let rows = sql
        .query(
            &format!(
                "SELECT format('%s %s %s %s %s %s %s %s %s %s %s %s %s', o_slot, o_partition_id,
                        CASE WHEN o_kind = 'busy' THEN NULL ELSE o_partition END, o_kind, o_base_offset, o_start_idx,
                        o_take, o_created_at, CASE WHEN o_kind = 'segment' THEN COALESCE(md5(o_blob), 'held') END,
                        o_first, o_last, o_attempt, o_msg_count)
                 FROM queen.{function}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
            ),
            &[&ends, &pids, &cached, &vec!["g"; n], &workers, &leases, &auto, &budgets, &caps, &vec![None::<&str>; n],
              &vec![None::<chrono::DateTime<chrono::Utc>>; n]],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// A shared claim's answer in comparable form: each slot's rows in the order
/// they came, then the group's cursor rows as the claim left them. Rolled
/// back.
async fn shared_claim_and_roll_back(sql: &tokio_postgres::Client, function: &str, slots: &[Slot<'_>]) -> (Vec<String>, Vec<String>) {
    sql.batch_execute("BEGIN").await.unwrap();
    let mut answer: Vec<(i64, usize, String)> = shared_claim(sql, function, slots)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, line)| (line.split(' ').next().unwrap().parse().unwrap(), i, line))
        .collect();
    answer.sort(); // by slot, keeping each slot's own order
    let cursors = cursor_rows(sql).await;
    sql.batch_execute("ROLLBACK").await.unwrap();
    (answer.into_iter().map(|(.., l)| l).collect(), cursors)
}

/// `pop_list_shared_v3` (0050) claims every slot's first candidate in one
/// set-based statement; each slot must get what `pop_list_shared_v2` (which
/// runs `pop_list_v2` slot by slot) gives it, rows, order and cursor rows
/// alike: a plain first candidate, a cursor inside a segment, a leased one
/// and one locked elsewhere ('busy', then the next candidate), one without a
/// cursor row and a gated queue (handed to the per-partition path), a slot
/// without candidates, two slots with one first candidate (the ring never
/// checks a partition out twice; the first slot has it), a held segment, a
/// budget past one segment, the partition cap, autoAck, per-slot lease ids
/// and lease times.
#[tokio::test]
async fn the_shared_set_claim_answers_what_each_slot_claimed_alone_answers() {
    let b = Broker::start().await;
    let (sql, id) = claim_fixture(&b, &[3, 4, 5, 6, 7, 2]).await;
    sql.batch_execute(
        "UPDATE queen.consumers c SET committed = 4 FROM queen.partitions p
             WHERE p.id = c.partition_id AND p.name = 'p2';",
    )
    .await
    .unwrap();
    let ids = |names: &[&str]| -> Vec<i64> { names.iter().map(|n| id[*n]).collect() };
    let (a, bb, c, d, e, p0) = (ids(&["p0", "p5"]), ids(&["p3", "p1"]), ids(&["late", "p4"]), ids(&["g0"]), ids(&["p2"]), ids(&["p0"]));
    let held = |n: usize| vec![None; n];
    for (budget, cap, auto) in [(1, 0, false), (1, 0, true), (3, 0, false), (8, 0, false), (8, 1, false), (2, 2, true)] {
        let slots: Vec<Slot<'_>> = vec![
            (&a, held(2), "w1", budget, cap, auto),
            (&[], vec![], "w2", budget, cap, auto),
            (&bb, held(2), "w3", budget, cap, auto),
            (&c, held(2), "w4", budget, cap, auto),
            (&d, held(1), "w5", budget, cap, auto),
            (&e, vec![Some(5)], "w6", budget, cap, auto),
            (&p0, held(1), "w7", budget, cap, auto),
        ];
        let each = shared_claim_and_roll_back(&sql, "pop_list_shared_v2", &slots).await;
        let set = shared_claim_and_roll_back(&sql, "pop_list_shared_v3", &slots).await;
        assert_eq!(set, each, "(budget, cap, autoAck) = {:?}", (budget, cap, auto));
        let lines = |slot: usize, kind: &str| set.0.iter().filter(|r| r.starts_with(&format!("{slot} ")) && r.contains(&format!(" {kind} "))).count();
        assert_eq!((lines(3, "busy"), lines(3, "claimed")), (1, 1), "p3 leased, then p1: {:#?}", set.0);
        // p0 is slot 1's: leased to it, or (autoAck) its next message is slot 7's.
        assert_eq!((lines(7, "busy"), lines(7, "claimed")), if auto { (0, 1) } else { (1, 0) }, "{:#?}", set.0);
        assert_eq!((lines(1, "claimed"), lines(5, "deferred"), lines(6, "claimed")), (1 + usize::from(budget > 3 && cap != 1), 1, 1), "{:#?}", set.0);
        let p2 = format!("6 {} p2 segment 5 0 ", id["p2"]);
        assert!(set.0.iter().any(|r| r.starts_with(&p2) && r.contains(" held ")), "p2's head, which slot 6 holds, left out: {:#?}", set.0);
    }

    // Plain first candidates of batch-1 slots: one statement, no per-slot call.
    let (p1, p4) = (ids(&["p1"]), ids(&["p4"]));
    let plain: Vec<Slot<'_>> = vec![(&p0, held(1), "w1", 1, 0, false), (&p1, held(1), "w2", 1, 0, false), (&p4, held(1), "w3", 1, 0, false)];
    let counted = b.sql().await;
    counted.batch_execute("SET track_functions = 'pl'; BEGIN").await.unwrap();
    let rows = shared_claim(&counted, "pop_list_shared_v3", &plain).await;
    let called = counted.query("SELECT funcname::text FROM pg_stat_xact_user_functions ORDER BY 1", &[]).await.unwrap();
    counted.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(rows.iter().filter(|r| r.contains(" claimed ")).count(), 3, "{rows:#?}");
    assert_eq!(called.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(), ["pop_list_shared_v3"]);

    // p0's cursor row locked by another transaction: 'busy', then p5.
    let other = common::cluster().connect(&b.db).await;
    other.batch_execute("BEGIN").await.unwrap();
    other.execute("SELECT 1 FROM queen.consumers WHERE partition_id = $1 FOR UPDATE", &[&id["p0"]]).await.unwrap();
    let slots: Vec<Slot<'_>> = vec![(&a, held(2), "w1", 1, 0, false), (&bb, held(2), "w3", 1, 0, false)];
    let each = shared_claim_and_roll_back(&sql, "pop_list_shared_v2", &slots).await;
    let set = shared_claim_and_roll_back(&sql, "pop_list_shared_v3", &slots).await;
    assert_eq!(set, each);
    assert!(set.0[0].starts_with(&format!("1 {}  busy", id["p0"])), "{:#?}", set.0);
    assert!(set.0.iter().any(|r| r.starts_with(&format!("1 {} p5 claimed", id["p5"]))), "{:#?}", set.0);
    other.batch_execute("ROLLBACK").await.unwrap();
}

/// With `QUEEN_POP_AUTOACK_ASYNC_COMMIT` on, an autoAck claim commits without
/// waiting for the WAL flush; by default it waits (at-most-once, API.md). A
/// leased claim waits unless `QUEEN_POP_LEASE_ASYNC_COMMIT` is on (a lease a
/// crash loses goes to a second consumer). The setting ends with the claim's
/// own transaction: the pooled connection's next statement (a push's commit,
/// say) waits for the disk again. Driven through the broker's claim
/// statements on a pooled client.
#[tokio::test]
async fn an_autoack_claim_skips_the_disk_wait_only_when_configured_to() {
    use queen::pop::claim::claim_route;
    use queen::pop::params::{PopParams, Route};

    let b = Broker::start().await;
    b.push_to("ac", "p", &[json!(1), json!(2), json!(3), json!(4)]).await;
    let mut pg = tokio_postgres::Config::new();
    pg.host_path(common::cluster().socket_dir.clone()).port(queen::embedded_pg::SOCKET_PORT).user("postgres").dbname(&b.db);
    let manager = deadpool_postgres::Manager::new(pg, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager).max_size(1).build().unwrap();
    let client = pool.get().await.unwrap();
    // The test cluster runs with it off for speed; a production one has it on.
    client.batch_execute("SET synchronous_commit = on").await.unwrap();
    let setting = || async { client.query_one("SHOW synchronous_commit", &[]).await.unwrap().get::<_, String>(0) };
    let route = Route::Specific { queue: "ac".into(), partition: "p".into() };
    let params = |auto_ack: &str, env: Option<&str>| {
        let key = if auto_ack == "true" { "QUEEN_POP_AUTOACK_ASYNC_COMMIT" } else { "QUEEN_POP_LEASE_ASYNC_COMMIT" };
        let cfg = queen::config::Config::from_lookup(|k| (k == key).then(|| env.map(String::from)).flatten()).unwrap();
        let pairs = [("autoAck".to_string(), auto_ack.to_string()), ("batch".to_string(), "1".to_string())];
        PopParams::parse(&pairs, &cfg.pop).unwrap()
    };
    // The leased claims last, and only the last committed: its lease holds
    // the partition afterwards.
    let cases = [("true", Some("true"), "off"), ("true", None, "on"), ("false", Some("true"), "off"), ("false", None, "on")];
    for (i, (auto_ack, env, inside)) in cases.into_iter().enumerate() {
        let p = params(auto_ack, env);
        assert_eq!(p.async_commit, inside == "off");
        // Inside a transaction block, to read the setting the claim's COMMIT
        // would read; by partition and by queue (the SQL candidate scan).
        for r in [&route, &Route::Wildcard { queue: "ac".into() }] {
            client.batch_execute("BEGIN").await.unwrap();
            let claimed = claim_route(&client, r, &p, "w").await.unwrap().claimed;
            assert_eq!(claimed.len(), 1, "autoAck={auto_ack}, {r:?}: one message claimed");
            assert_eq!(setting().await, inside, "autoAck={auto_ack}, the async setting {env:?}, {r:?}");
            client.batch_execute("ROLLBACK").await.unwrap();
        }
        if auto_ack == "false" && i + 1 < cases.len() {
            continue;
        }
        // As the broker runs it: its own implicit transaction, committed.
        let r = claim_route(&client, &route, &p, "w").await.unwrap();
        assert_eq!(r.claimed.len(), 1);
        assert_eq!(setting().await, "on", "the setting outlived the claim's transaction");
    }
    let sql = b.sql().await;
    let row = sql
        .query_one("SELECT c.committed, c.worker_id FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id WHERE p.name = 'p' AND c.consumer_group = $1", &[&params("true", None).group])
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, Option<String>>(1)), (1, Some("w".into())), "two committed autoAck claims, then a lease");

    // A shared claim (`pop::share`) skips the wait only when all its pops may.
    b.push_to("ac", "p1", &[json!(1)]).await;
    b.push_to("ac", "p2", &[json!(2)]).await;
    let pid = |name: &'static str| {
        let sql = &sql;
        async move { sql.query_one("SELECT id FROM queen.partitions WHERE name = $1", &[&name]).await.unwrap().get::<_, i64>(0) }
    };
    let (p1, p2) = ([pid("p1").await], [pid("p2").await]);
    let held = queen::pop::claim::Held::default();
    let (lease_async, lease_sync) = (params("false", Some("true")), params("false", None));
    for (second, inside) in [(&lease_async, "off"), (&lease_sync, "on")] {
        let slots = [
            queen::pop::claim::ClaimSlot { pids: &p1, p: &lease_async, worker: "w1", held: &held },
            queen::pop::claim::ClaimSlot { pids: &p2, p: second, worker: "w2", held: &held },
        ];
        client.batch_execute("BEGIN").await.unwrap();
        let results = queen::pop::claim::claim_shared(&client, &slots).await.unwrap();
        assert_eq!(results.iter().map(|r| r.claimed.len()).collect::<Vec<_>>(), [1, 1]);
        assert_eq!(setting().await, inside, "the second pop's async_commit {}", second.async_commit);
        client.batch_execute("ROLLBACK").await.unwrap();
    }
}

#[tokio::test]
async fn a_trace_id_comes_back_on_the_popped_message() {
    let b = Broker::start().await;
    let trace = "0198f2c1-9a7b-7d20-8e31-4c5d6e7f8a90";
    let items = json!({"items": [{"queue": "traced", "payload": 1, "traceId": trace}, {"queue": "traced", "payload": 2}]});
    assert_eq!(b.post("/api/v1/push", items).await.0, 201);
    let r = b.pop("/api/v1/pop/queue/traced?batch=2&autoAck=true").await;
    let traces: Vec<Value> = r.messages().iter().map(|m| m["traceId"].clone()).collect();
    assert_eq!(traces, [json!(trace), Value::Null]);
}

/// Batch-1 pops that arrive while a claim is in flight share one claim
/// statement and transaction (`pop::share`), and each keeps its own lease:
/// 32 consumers of 40 partitions, each popping one message at a time and
/// acking it with its lease; one claim writer, so pops queue behind it.
#[tokio::test]
async fn batch_one_pops_share_a_claim_and_each_keeps_its_own_lease() {
    let mut b = common::broker_counting_calls(&[("QUEEN_HOTLIST", "true"), ("QUEEN_POP_CLAIM_WRITERS", "1")]).await;
    const PARTITIONS: usize = 40;
    const EACH: usize = 3;
    for p in 0..PARTITIONS {
        let payloads: Vec<Value> = (0..EACH).map(|i| json!(format!("{p}-{i}"))).collect();
        b.push_to("shared", &format!("p{p}"), &payloads).await;
    }
    // The group's first contact, alone (it claims on its own connection).
    let first = b.pop("/api/v1/pop/queue/shared?batch=1&consumerGroup=g&autoAck=true").await;
    let mut delivered = vec![first.data()[0].as_str().unwrap().to_string()];
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (http, url, db) = (b.http.clone(), b.url.clone(), b.db.clone());
        tasks.push(tokio::spawn(async move {
            let sql = common::cluster().connect(&db).await;
            let (mut got, mut idle) = (Vec::new(), 0);
            while idle < 10 {
                let r = http.get(format!("{url}/api/v1/pop/queue/shared?batch=1&consumerGroup=g")).send().await.unwrap();
                if r.status().as_u16() == 204 {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                idle = 0;
                let body: Value = r.json().await.unwrap();
                let lease = body["leaseId"].as_str().unwrap().to_string();
                let m = &body["messages"].as_array().unwrap()[0];
                assert_eq!(body["messages"].as_array().unwrap().len(), 1, "batch 1: {body}");
                let pid = m["partitionId"].as_str().unwrap().to_string();
                let holder: Option<String> = sql
                    .query_one("SELECT worker_id FROM queen.consumers WHERE partition_id = $1 AND consumer_group = 'g'", &[&pid.parse::<i64>().unwrap()])
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(holder.as_deref(), Some(lease.as_str()), "the partition's lease is this pop's own");
                let ack = json!({"acknowledgments": [{"transactionId": m["transactionId"], "partitionId": pid, "leaseId": lease, "status": "completed"}],
                                 "consumerGroup": "g"});
                let a: Value = http.post(format!("{url}/api/v1/ack/batch")).json(&ack).send().await.unwrap().json().await.unwrap();
                assert_eq!(a[0]["success"], true, "acked under its own lease: {a}");
                got.push((m["data"].as_str().unwrap().to_string(), lease));
            }
            got
        }));
    }
    let mut leases = HashSet::new();
    for t in tasks {
        for (data, lease) in t.await.unwrap() {
            delivered.push(data);
            assert!(leases.insert(lease), "every pop has a lease of its own");
        }
    }
    assert_eq!(delivered.len(), PARTITIONS * EACH, "every message delivered, none twice: {} of {}", delivered.len(), PARTITIONS * EACH);
    assert_eq!(delivered.iter().collect::<HashSet<_>>().len(), PARTITIONS * EACH);
    let sql = b.sql().await;
    let committed: i64 = sql
        .query_one("SELECT count(*) FROM queen.consumers WHERE consumer_group = 'g' AND committed = $1 AND worker_id IS NULL", &[&(EACH as i64 - 1)])
        .await
        .unwrap()
        .get(0);
    assert_eq!(committed, PARTITIONS as i64, "every cursor at its partition's end, no lease left");
    drop(sql);
    let shared = common::sample(&b.prometheus().await, "queen_pop_shared_claims_total").unwrap_or(0.0);
    assert!(shared >= 2.0, "concurrent pops shared a claim: {shared}");
    let calls = common::calls_after_exit(&mut b).await;
    assert!(calls("pop_list_shared_v3") >= 1, "the set-based shared claim");
}

/// A claim row as `a_claim_leaves_out_the_segment_the_broker_holds` reads it:
/// kind, blob shipped, base offset, start index, take, first, last.
type HeldRow = (String, bool, Option<i64>, Option<i32>, Option<i32>, Option<i64>, Option<i64>);

/// A claim of one partition leaves out the blob of the segment the broker
/// says it holds decompressed (`pop_list_v2`'s `p_cached`, migration 0049)
/// and ships any other; the broker answers from its own copy.
#[tokio::test]
async fn a_claim_leaves_out_the_segment_the_broker_holds() {
    let b = Broker::start().await;
    b.push_to("held", "p", &[json!(1), json!(2), json!(3), json!(4)]).await;
    let first = b.pop("/api/v1/pop/queue/held?batch=1&consumerGroup=g&autoAck=true").await;
    assert_eq!(first.data(), [json!(1)]);
    let pid: i64 = first.messages()[0]["partitionId"].as_str().unwrap().parse().unwrap();
    let sql = b.sql().await;
    for (cached, shipped) in [(None, true), (Some(0i64), false), (Some(7), true)] {
        sql.batch_execute("BEGIN").await.unwrap();
        let rows = sql
            .query(
                "SELECT o_kind, o_blob IS NOT NULL, o_base_offset, o_start_idx, o_take, o_first, o_last
                 FROM queen.pop_list_v2(ARRAY[$1::bigint], ARRAY[$2::bigint], 'g', 'w', 60, false, 1, 0, NULL, NULL)",
                &[&pid, &cached],
            )
            .await
            .unwrap();
        sql.batch_execute("ROLLBACK").await.unwrap();
        let got: Vec<HeldRow> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6))).collect();
        assert_eq!(
            got,
            [("segment".into(), shipped, Some(0), Some(1), Some(1), None, None), ("claimed".into(), false, Some(3), None, None, Some(1), Some(1))],
            "held segment {cached:?}"
        );
    }
    // Through the broker, which holds the segment since the first pop: one
    // message at a time, under a lease, each acked, in order.
    for want in 2..=4 {
        let r = b.pop("/api/v1/pop/queue/held?batch=1&consumerGroup=g").await;
        assert_eq!(r.data(), [json!(want)]);
        let m = &r.messages()[0];
        let lease = r.body.as_ref().unwrap()["leaseId"].as_str().unwrap().to_string();
        let acked = b.ack_batch(Some("g"), &[(m["transactionId"].as_str().unwrap(), m["partitionId"].as_str().unwrap(), "completed", Some(&lease))]).await;
        assert_eq!(acked[0]["success"], true);
    }
    assert_eq!(b.pop("/api/v1/pop/queue/held?batch=1&consumerGroup=g").await.status, 204);
}

/// A pop whose client hangs up while it waits for a shared claim does not
/// keep the lease that claim then takes for it: the lease goes back at once
/// (`pop::share` through `Handover::return_claim`), and the message is the
/// next pop's, not after the lease time (60 s here).
#[tokio::test]
async fn a_lease_claimed_for_a_pop_that_hung_up_goes_back_at_once() {
    let b = Broker::start_with(&[("QUEEN_HOTLIST", "true"), ("QUEEN_POP_CLAIM_WRITERS", "1")]).await;
    for p in 0..5 {
        b.push_to("gone", &format!("p{p}"), &[json!(p)]).await;
    }
    let pop = "/api/v1/pop/queue/gone?consumerGroup=g&batch=1&partitions=1&leaseSeconds=60";
    assert_eq!(b.pop(&format!("{pop}&autoAck=true")).await.status, 200, "the group's first contact");
    // A's claim waits on a lock, so B's queues behind it; B's client gives up.
    let sql = b.sql().await;
    sql.batch_execute("BEGIN; LOCK TABLE queen.consumers IN ACCESS EXCLUSIVE MODE").await.unwrap();
    let (http, url) = (b.http.clone(), format!("{}{pop}", b.url));
    let a = tokio::spawn(async move { http.get(url).send().await.unwrap().status().as_u16() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    assert!(impatient.get(format!("{}{pop}", b.url)).send().await.is_err(), "B's client gave up first");
    sql.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(a.await.unwrap(), 200, "A got its message");
    // The three messages left are all there for the next pops, B's too.
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while got.len() < 3 && tokio::time::Instant::now() < deadline {
        got.extend(b.pop("/api/v1/pop/queue/gone?consumerGroup=g&batch=10&autoAck=true").await.data());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(got.len(), 3, "the lease taken for the pop that hung up went back: {got:?}");
}
