//! Timers (issue 29 §3): schedule, reschedule, cancel and their verdicts;
//! a due timer becomes an ordinary message, wakes its long-polls, and fires
//! exactly once across two brokers and a `kill -9` mid-fire; timers ride
//! transactions; bad input and the kill switch.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use base64::Engine as _;
use common::{eventually, stored_messages, Broker};
use serde_json::{json, Value};

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(v.to_string())
}

fn schedule(queue: &str, key: &str, payload: Value, delay_ms: i64, txn: &str) -> Value {
    json!({"op": "schedule", "queue": queue, "timerKey": key, "payload": b64(&payload), "delayMs": delay_ms, "txn": txn})
}

async fn timers(b: &Broker, ops: Value) -> Vec<Value> {
    let (status, r) = b.post("/api/v1/timers", json!({ "operations": ops })).await;
    assert_eq!(status, 200, "{r}");
    r["results"].as_array().unwrap().clone()
}

async fn pending(b: &Broker) -> i64 {
    b.sql().await.query_one("SELECT count(*) FROM queen.timers", &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_timer_fires_once_as_the_message_it_promised() {
    let b = Broker::start().await;
    let r = timers(&b, json!([schedule("orders", "o:1:expire", json!({"order": 1}), 400, "txn-1")])).await.remove(0);
    assert_eq!((r["ok"].clone(), r["status"].clone(), r["txn"].clone(), r["timerKey"].clone()), (json!(true), json!("scheduled"), json!("txn-1"), json!("o:1:expire")));
    let promised = r["messageId"].as_str().unwrap().to_string();
    assert!(r["deliverAt"].as_str().unwrap().ends_with('Z'));
    // A retry with the same txn changes nothing.
    let again = timers(&b, json!([schedule("orders", "o:1:expire", json!({"order": 1}), 400, "txn-1")])).await.remove(0);
    assert_eq!((again["status"].clone(), again["messageId"].clone()), (json!("scheduled"), json!(promised)));
    let (_, peek) = b.get("/api/v1/timers/orders/o:1:expire").await;
    assert_eq!((peek["found"].clone(), peek["payload"].clone(), peek["partition"].clone()), (json!(true), json!({"order": 1}), json!("Default")));
    let (_, listed) = b.get("/api/v1/timers/orders").await;
    assert_eq!((listed["rows"][0]["timerKey"].clone(), listed["truncated"].clone()), (json!("o:1:expire"), json!(false)));
    let (_, counted) = b.get("/api/v1/timers/orders?mode=count&prefix=o:").await;
    assert_eq!(counted["count"], 1);
    assert!(b.pop("/api/v1/pop/queue/orders?wait=false").await.messages().is_empty(), "not before it is due");

    // A parked long-poll is woken by the fire.
    let started = std::time::Instant::now();
    let popped = b.pop("/api/v1/pop/queue/orders?wait=true&timeout=5000").await;
    let m = popped.messages();
    assert_eq!(m.len(), 1, "the due timer arrives as a message");
    assert!(started.elapsed() < Duration::from_millis(2000), "woken, not timed out: {:?}", started.elapsed());
    assert_eq!((m[0]["id"].clone(), m[0]["transactionId"].clone(), m[0]["data"].clone()), (json!(promised), json!("txn-1"), json!({"order": 1})));
    assert_eq!(pending(&b).await, 0);
    let (_, gone) = b.get("/api/v1/timers/orders/o:1:expire").await;
    assert_eq!(gone["found"], false);
    // Fired once: nothing else arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stored_messages(&b.sql().await, "orders", "Default").await.len(), 1);
}

#[tokio::test]
async fn reschedule_replaces_and_cancel_answers_its_verdicts() {
    let b = Broker::start().await;
    timers(&b, json!([schedule("q", "k", json!("first"), 60_000, "t1")])).await;
    let r = timers(&b, json!([{"op": "reschedule", "queue": "q", "timerKey": "k", "payload": b64(&json!("second")), "delayMs": 100, "txn": "t2", "partition": "p"}])).await.remove(0);
    assert_eq!((r["status"].clone(), r["txn"].clone()), (json!("rescheduled"), json!("t2")));
    eventually("the rescheduled timer fires", Duration::from_secs(5), || async { pending(&b).await == 0 }).await;
    let sql = b.sql().await;
    let fired = stored_messages(&sql, "q", "p").await;
    assert_eq!((fired.len(), fired[0].transaction_id.as_str(), fired[0].payload.as_str()), (1, "t2", "\"second\""));

    timers(&b, json!([schedule("q", "c", json!(1), 60_000, "tc")])).await;
    let delete = |path: String| {
        let http = b.http.clone();
        async move { http.delete(path).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let wrong = delete(format!("{}/api/v1/timers/q/c?txn=other", b.url)).await;
    assert_eq!((wrong["ok"].clone(), wrong["status"].clone(), wrong["txn"].clone()), (json!(false), json!("absent"), json!("other")));
    let ok = delete(format!("{}/api/v1/timers/q/c", b.url)).await;
    assert_eq!((ok["ok"].clone(), ok["status"].clone(), ok["txn"].clone()), (json!(true), json!("cancelled"), json!("tc")));
    assert_eq!(delete(format!("{}/api/v1/timers/q/c", b.url)).await["status"], "absent");

    // A fire holding the row: too_late, not a wait.
    timers(&b, json!([schedule("q", "held", json!(1), 60_000, "th")])).await;
    let mut locker = b.sql().await;
    let tx = locker.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM queen.timers WHERE timer_key = 'held' FOR UPDATE", &[]).await.unwrap();
    assert_eq!(delete(format!("{}/api/v1/timers/q/held", b.url)).await["status"], "too_late");
    let r = timers(&b, json!([schedule("q", "held", json!(2), 10, "th2")])).await.remove(0);
    assert_eq!((r["ok"].clone(), r["status"].clone()), (json!(false), json!("too_late")));
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn two_brokers_fire_two_thousand_timers_each_exactly_once() {
    let a = Broker::start_with(&[("QUEEN_TIMERS_BATCH_SIZE", "50")]).await;
    let b = Broker::spawn(a.db.clone(), vec![
        ("QUEEN_DATABASE_URL".into(), common::cluster().url(&a.db)),
        ("QUEEN_TIMERS_BATCH_SIZE".into(), "50".into()),
    ])
    .await;
    for chunk in 0..4 {
        let ops: Vec<Value> = (0..500).map(|i| {
            let n = chunk * 500 + i;
            schedule("burst", &format!("k{n}"), json!({"n": n}), 300 + (n % 200) as i64, &format!("t{n}"))
        })
        .collect();
        let target = if chunk % 2 == 0 { &a } else { &b };
        assert!(timers(target, json!(ops)).await.iter().all(|r| r["status"] == "scheduled"));
    }
    eventually("every timer fired", Duration::from_secs(30), || async { pending(&a).await == 0 }).await;
    let messages = stored_messages(&a.sql().await, "burst", "Default").await;
    let txns: HashSet<&str> = messages.iter().map(|m| m.transaction_id.as_str()).collect();
    assert_eq!((messages.len(), txns.len()), (2000, 2000), "each exactly once");
}

#[tokio::test]
async fn a_kill_mid_fire_loses_none_and_delivers_none_twice() {
    let mut b = Broker::start_with(&[("QUEEN_TIMERS_BATCH_SIZE", "20"), ("QUEEN_TIMERS_INTERVAL_MS", "1000")]).await;
    let ops: Vec<Value> = (0..1000).map(|n| schedule("crash", &format!("k{n}"), json!(n), 1500, &format!("t{n}"))).collect();
    timers(&b, json!(ops)).await;
    eventually("the fire is under way", Duration::from_secs(10), || async { pending(&b).await < 1000 }).await;
    b.kill();
    b.restart().await;
    eventually("the restarted broker fires the rest", Duration::from_secs(30), || async { pending(&b).await == 0 }).await;
    let messages = stored_messages(&b.sql().await, "crash", "Default").await;
    let txns: HashSet<&str> = messages.iter().map(|m| m.transaction_id.as_str()).collect();
    assert_eq!((messages.len(), txns.len()), (1000, 1000));
}

#[tokio::test]
async fn timers_ride_transactions_all_or_nothing() {
    let b = Broker::start().await;
    let (_, body) = b
        .post("/api/v1/transaction", json!({
            "operations": [{"type": "push", "items": [{"queue": "steps", "payload": "now", "transactionId": "s1"}]}],
            "timers": [schedule("steps", "timeout:s1", json!("later"), 60_000, "s1-timeout")]}))
        .await;
    assert_eq!(body["success"], true, "{body}");
    let r = body["results"].as_array().unwrap();
    assert_eq!((r[1]["type"].clone(), r[1]["status"].clone(), r[1]["index"].clone()), (json!("timer"), json!("scheduled"), json!(1)));
    assert_eq!(pending(&b).await, 1);
    // A bundle refused by its guard schedules nothing.
    let (_, body) = b
        .post("/api/v1/transaction", json!({
            "operations": [{"type": "push", "items": [{"queue": "steps", "payload": "x", "transactionId": "s2"}]}],
            "kv": [{"op": "check", "ns": "locks", "key": "none", "expect": 5, "required": true}],
            "timers": [schedule("steps", "timeout:s2", json!("later"), 60_000, "s2-timeout"),
                       {"op": "cancel", "queue": "steps", "timerKey": "timeout:s1"}]}))
        .await;
    assert_eq!(body["reason"], "kv_precondition");
    assert_eq!(pending(&b).await, 1, "neither the schedule nor the cancel happened");
    let (_, body) = b
        .post("/api/v1/transaction", json!({"operations": [],
            "timers": [{"op": "cancel", "queue": "steps", "timerKey": "timeout:s1"}]}))
        .await;
    assert_eq!(body["results"][0]["status"], "cancelled", "{body}");
    assert_eq!(pending(&b).await, 0);
}

#[tokio::test]
async fn bad_timer_calls_are_400_and_the_kill_switch_stops_scheduling_but_not_cancels() {
    let b = Broker::start().await;
    let (status, r) = b.post("/api/v1/timers", json!({"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "payload": b64(&json!(1)), "delayMs": 5, "deliverAt": "soon"}]})).await;
    assert_eq!((status, r["error"].clone()), (400, json!("timers_bad_request")));
    assert_eq!(r["detail"], "operations[0].deliverAt: server-owned; it cannot be supplied");
    let (status, r) = b.post("/api/v1/timers", json!([{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "bm90IGpzb24=", "delayMs": 5}])).await;
    assert_eq!(status, 400);
    assert!(r["detail"].as_str().unwrap().starts_with("operations[0].payload: the decoded bytes are not JSON"));
    assert_eq!(pending(&b).await, 0, "nothing of a refused call ran");
    timers(&b, json!([schedule("q", "keep", json!(1), 60_000, "t")])).await;
    assert_eq!(b.post("/api/v1/system/kv-timers", json!({"timers": false})).await.0, 200);
    let (status, r) = b.post("/api/v1/timers", json!([schedule("q", "k2", json!(1), 10, "t2")])).await;
    assert_eq!((status, r["error"].clone()), (503, json!("timers_disabled")));
    let (status, _) = b.post("/api/v1/transaction", json!({"operations": [], "timers": [schedule("q", "k3", json!(1), 10, "t3")]})).await;
    assert_eq!(status, 403);
    let cancel = b.http.delete(format!("{}/api/v1/timers/q/keep", b.url)).send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(cancel["status"], "cancelled", "a cancel is never switched off");
}

/// Issue 44 §4: one timer key may appear at most once per call. A batch that
/// names the same (queue, timerKey) twice, scheduled twice or scheduled and
/// cancelled, is a 400 `timers_bad_request` naming the key and both
/// positions, and nothing of it is applied; so is such a transaction rider.
/// The same key in two queues is two timers.
#[tokio::test]
async fn a_timer_key_twice_in_one_call_is_refused_whole() {
    let b = Broker::start().await;
    timers(&b, json!([schedule("q", "existing", json!(0), 60_000, "t0")])).await;
    for second in [schedule("q", "order:1", json!(2), 60_000, "t2"), json!({"op": "cancel", "queue": "q", "timerKey": "order:1"})] {
        let ops = json!([schedule("q", "fresh", json!(0), 60_000, "f"), json!({"op": "cancel", "queue": "q", "timerKey": "existing"}),
                         schedule("q", "order:1", json!(1), 60_000, "t1"), second]);
        let (status, r) = b.post("/api/v1/timers", json!({ "operations": ops })).await;
        assert_eq!((status, r["error"].clone()), (400, json!("timers_bad_request")), "{r}");
        let detail = r["detail"].as_str().unwrap();
        assert!(detail.starts_with("operations[3].timerKey:") && detail.contains("\"order:1\"") && detail.contains("operations[2]"), "{detail}");
        let keys: Vec<String> = b.sql().await.query("SELECT timer_key FROM queen.timers ORDER BY 1", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(keys, ["existing"], "nothing of the call was applied, the cancel included");
        let (status, r) = b.post("/api/v1/transaction", json!({"operations": [], "timers": ops})).await;
        assert_eq!(status, 400, "{r}");
        assert!(r["error"].as_str().unwrap().contains("\"order:1\""), "{r}");
    }
    let both = timers(&b, json!([schedule("q", "same", json!(1), 60_000, "a"), schedule("other", "same", json!(1), 60_000, "b")])).await;
    assert_eq!(both.iter().map(|r| r["status"].clone()).collect::<Vec<_>>(), [json!("scheduled"), json!("scheduled")]);
}

/// Issue 45: one timer that cannot fire rolled back the whole fire batch,
/// and the next tick picked the same rows: every timer behind it waited
/// forever. Now the bad ones are set aside (attempts, last_error, pushed
/// back; parked when they can never fire) and the rest fire.
#[tokio::test]
async fn a_timer_that_cannot_fire_holds_back_no_other() {
    let b = Broker::start_with(&[("QUEEN_TIMERS_BATCH_SIZE", "10")]).await;
    let sql = b.sql().await;
    // Bad rows, as a bug or a hand edit could leave them, due in the same
    // partition and the same tick as five good ones (one statement: one batch).
    sql.execute(
        "INSERT INTO queen.timers (queue, timer_key, partition, payload, txn, message_id, deliver_at)
         SELECT 'later', 'ok-' || i, 'Default', i::text, 't' || i, gen_random_uuid(), now() - interval '30 seconds' FROM generate_series(0, 4) i
         UNION ALL VALUES
           ('later', 'bad-json', 'Default', 'not json', 'tj', gen_random_uuid(), now() - interval '1 minute'),
           ('later', 'bad-txn', 'Default', '1', repeat('x', 70000), gen_random_uuid(), now() - interval '1 minute')",
        &[],
    )
    .await
    .unwrap();
    eventually("the good timers to fire", Duration::from_secs(10), || async { stored_messages(&sql, "later", "Default").await.len() == 5 }).await;
    let mut got: Vec<String> = stored_messages(&sql, "later", "Default").await.into_iter().map(|m| m.payload).collect();
    got.sort();
    assert_eq!(got, ["0", "1", "2", "3", "4"]);
    let (_, hopeless) = b.get("/api/v1/timers/later/bad-json").await;
    assert_eq!((hopeless["attempts"].clone(), hopeless["lastError"].clone()), (json!(10), json!("payload is not JSON")), "parked at once: {hopeless}");
    assert!(hopeless["deliverAt"].as_str().unwrap().starts_with("9999-"), "parked: {hopeless}");
    eventually("the too-long txn to be counted", Duration::from_secs(10), || async {
        let (_, t) = b.get("/api/v1/timers/later/bad-txn").await;
        t["attempts"].as_i64().unwrap_or(0) >= 1 && t["lastError"].as_str().is_some_and(|e| e.contains("transactionId"))
    })
    .await;
    let (_, t) = b.get("/api/v1/timers/later/bad-txn").await;
    let next = chrono::DateTime::parse_from_rfc3339(t["deliverAt"].as_str().unwrap()).unwrap();
    assert!(next > chrono::Utc::now(), "pushed back, not retried every tick: {t}");
    // A reschedule revives a parked timer with a good payload.
    let r = timers(&b, json!([schedule("later", "bad-json", json!("fixed"), 0, "tj2")])).await.remove(0);
    assert_eq!(r["status"], "rescheduled");
    eventually("the revived timer to fire", Duration::from_secs(10), || async { stored_messages(&sql, "later", "Default").await.len() == 6 }).await;
}
