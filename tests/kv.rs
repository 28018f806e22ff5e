//! KV (issue 29 §1): the operations and their verdicts, expiry, `required`,
//! concurrent writers, the limits and errors, the per-key and console
//! routes, two brokers on one database, and a crash in the middle of
//! multi-operation calls.

mod common;

use std::time::Duration;

use common::{eventually, Broker};
use serde_json::{json, Value};

async fn kv(b: &Broker, ops: Value) -> Value {
    let (status, r) = b.post("/api/v1/kv", json!({ "operations": ops })).await;
    assert_eq!(status, 200, "{r}");
    r
}

async fn one(b: &Broker, op: Value) -> Value {
    kv(b, json!([op])).await["results"][0].clone()
}

#[tokio::test]
async fn reads_and_writes_answer_their_verdicts_with_versions_that_only_grow() {
    let b = Broker::start().await;
    let w = one(&b, json!({"op": "put", "ns": "app", "key": "cfg", "value": {"mode": "a"}, "forever": true})).await;
    assert_eq!((w["applied"].clone(), w["value"].clone(), w["expiresAt"].clone()), (json!(true), json!({"mode": "a"}), Value::Null));
    let v1 = w["version"].as_i64().unwrap();
    let g = one(&b, json!({"op": "get", "ns": "app", "key": "cfg"})).await;
    assert_eq!((g["found"].clone(), g["value"].clone(), g["version"].clone()), (json!(true), json!({"mode": "a"}), json!(v1)));
    assert!(g["updatedAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(one(&b, json!({"op": "get", "ns": "app", "key": "nope"})).await, json!({"index": 0, "found": false, "key": "nope"}));

    // A fenced write: the right version applies, a stale one does not and
    // answers the current value and version.
    let w2 = one(&b, json!({"op": "put", "ns": "app", "key": "cfg", "value": {"mode": "b"}, "forever": true, "expect": v1})).await;
    assert_eq!(w2["applied"], true);
    let v2 = w2["version"].as_i64().unwrap();
    assert!(v2 > v1);
    let stale = one(&b, json!({"op": "put", "ns": "app", "key": "cfg", "value": {"mode": "c"}, "forever": true, "expect": v1})).await;
    assert_eq!((stale["applied"].clone(), stale["reason"].clone(), stale["value"].clone(), stale["version"].clone()),
               (json!(false), json!("version"), json!({"mode": "b"}), json!(v2)));
    let absent = one(&b, json!({"op": "put", "ns": "app", "key": "ghost", "value": 1, "forever": true, "expect": 5})).await;
    assert_eq!((absent["applied"].clone(), absent["reason"].clone()), (json!(false), json!("absent")), "expect N creates nothing");
    let lost = one(&b, json!({"op": "putIfAbsent", "ns": "app", "key": "cfg", "value": 0, "forever": true})).await;
    assert_eq!((lost["applied"].clone(), lost["reason"].clone(), lost["version"].clone()), (json!(false), json!("exists"), json!(v2)));

    // check writes nothing; delete with and without expect.
    let c = one(&b, json!({"op": "check", "ns": "app", "key": "cfg", "expect": v2})).await;
    assert_eq!((c["applied"].clone(), c["version"].clone()), (json!(true), json!(v2)));
    let c0 = one(&b, json!({"op": "check", "ns": "app", "key": "ghost", "expect": 0})).await;
    assert_eq!(c0["applied"], true, "expect 0: must not exist");
    let d = one(&b, json!({"op": "delete", "ns": "app", "key": "cfg", "expect": v1})).await;
    assert_eq!((d["applied"].clone(), d["reason"].clone()), (json!(false), json!("version")));
    assert_eq!(one(&b, json!({"op": "delete", "ns": "app", "key": "cfg"})).await["applied"], true);
    assert_eq!(one(&b, json!({"op": "delete", "ns": "app", "key": "cfg"})).await["reason"], "absent");
    // Re-created, it gets a version no earlier row had: no ABA.
    let again = one(&b, json!({"op": "putIfAbsent", "ns": "app", "key": "cfg", "value": 1, "forever": true})).await;
    assert!(again["version"].as_i64().unwrap() > v2);

    // getMany and getPrefix, paged.
    for k in ["u:1", "u:2", "u:3", "v:1"] {
        one(&b, json!({"op": "put", "ns": "app", "key": k, "value": {"k": k}, "ttlSeconds": 3600})).await;
    }
    let many = one(&b, json!({"op": "getMany", "ns": "app", "keys": ["u:2", "zz", "u:1"]})).await;
    let keys: Vec<&str> = many["rows"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!((keys, many["missing"].clone(), many["truncated"].clone()), (vec!["u:2", "u:1"], json!(["zz"]), json!(false)));
    let p1 = one(&b, json!({"op": "getPrefix", "ns": "app", "prefix": "u:", "limit": 2})).await;
    let keys: Vec<&str> = p1["rows"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!((keys, p1["truncated"].clone(), p1["nextAfter"].clone()), (vec!["u:1", "u:2"], json!(true), json!("u:2")));
    let p2 = one(&b, json!({"op": "getPrefix", "ns": "app", "prefix": "u:", "limit": 2, "after": "u:2", "keysOnly": true})).await;
    assert_eq!((p2["rows"].as_array().unwrap().len(), p2["truncated"].clone(), p2["nextAfter"].clone()), (1, json!(false), Value::Null));
    assert_eq!(p2["rows"][0]["key"], "u:3");
    assert!(p2["rows"][0].get("value").is_none(), "keysOnly");
    assert!(p1["rows"][0]["expiresAt"].as_str().is_some());
}

#[tokio::test]
async fn incr_counts_refuses_past_its_bounds_and_keeps_its_window() {
    let b = Broker::start().await;
    let mut last = Value::Null;
    for _ in 0..3 {
        last = one(&b, json!({"op": "incr", "ns": "rate", "key": "acme", "delta": 1, "max": 3, "ttlSeconds": 2})).await;
        assert_eq!(last["applied"], true, "{last}");
    }
    assert_eq!(last["value"], 3);
    let window = last["expiresAt"].clone();
    let refused = one(&b, json!({"op": "incr", "ns": "rate", "key": "acme", "delta": 1, "max": 3, "ttlSeconds": 2})).await;
    assert_eq!((refused["applied"].clone(), refused["reason"].clone(), refused["value"].clone()), (json!(false), json!("limit"), json!(3)));
    assert_eq!(refused["expiresAt"], window, "the TTL is create-only");
    let down = one(&b, json!({"op": "incr", "ns": "rate", "key": "acme", "delta": -5, "min": 0, "forever": true})).await;
    assert_eq!(down["reason"], "limit");
    let frac = one(&b, json!({"op": "incr", "ns": "rate", "key": "f", "delta": 0.5, "forever": true})).await;
    assert_eq!(frac["value"], 0.5);
    one(&b, json!({"op": "put", "ns": "rate", "key": "word", "value": "ten", "forever": true})).await;
    assert_eq!(one(&b, json!({"op": "incr", "ns": "rate", "key": "word", "forever": true})).await["reason"], "type");
    // The window closes: the expired counter starts again from zero.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let fresh = one(&b, json!({"op": "incr", "ns": "rate", "key": "acme", "delta": 1, "max": 3, "ttlSeconds": 2})).await;
    assert_eq!((fresh["applied"].clone(), fresh["value"].clone()), (json!(true), json!(1)));
}

#[tokio::test]
async fn an_expired_key_is_gone_at_once_and_the_sweeper_reclaims_it() {
    let b = Broker::start_with(&[("QUEEN_KV_SWEEP_INTERVAL_MS", "100")]).await;
    one(&b, json!({"op": "put", "ns": "s", "key": "brief", "value": 1, "ttlSeconds": 1})).await;
    one(&b, json!({"op": "put", "ns": "s", "key": "stays", "value": 2, "forever": true})).await;
    assert_eq!(one(&b, json!({"op": "get", "ns": "s", "key": "brief"})).await["found"], true);
    let sql = b.sql().await;
    // Stop the sweeper's view from mattering: the read alone decides.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(one(&b, json!({"op": "get", "ns": "s", "key": "brief"})).await["found"], false);
    let prefix = one(&b, json!({"op": "getPrefix", "ns": "s", "prefix": "b"})).await;
    assert_eq!(prefix["rows"], json!([]));
    eventually("the sweeper removes the expired row", Duration::from_secs(5), || async {
        sql.query_one("SELECT count(*) FROM queen.kv WHERE ns = 's'", &[]).await.unwrap().get::<_, i64>(0) == 1
    })
    .await;
    let won = one(&b, json!({"op": "putIfAbsent", "ns": "s", "key": "brief", "value": 3, "ttlSeconds": 60})).await;
    assert_eq!(won["applied"], true);
}

#[tokio::test]
async fn a_lost_required_verdict_rolls_the_whole_call_back() {
    let b = Broker::start().await;
    one(&b, json!({"op": "put", "ns": "r", "key": "lock", "value": "me", "forever": true})).await;
    let (status, r) = b
        .post("/api/v1/kv", json!({"operations": [
            {"op": "put", "ns": "r", "key": "a", "value": 1, "forever": true},
            {"op": "incr", "ns": "r", "key": "n", "forever": true},
            {"op": "check", "ns": "r", "key": "lock", "expect": 999, "required": true},
            {"op": "put", "ns": "r", "key": "b", "value": 2, "forever": true}]}))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["success"].clone(), r["reason"].clone(), r["failedIndex"].clone(), r["kvReason"].clone()),
               (json!(false), json!("kv_precondition"), json!(2), json!("version")));
    assert_eq!(r["value"], "me");
    let reasons: Vec<Value> = r["results"].as_array().unwrap().iter().map(|x| x["reason"].clone()).collect();
    assert_eq!(reasons, [json!("rolled_back"), json!("rolled_back"), json!("version"), json!("not_run")]);
    for k in ["a", "n", "b"] {
        assert_eq!(one(&b, json!({"op": "get", "ns": "r", "key": k})).await["found"], false, "{k} was rolled back");
    }
    // The same call with the right version commits all four.
    let v = one(&b, json!({"op": "get", "ns": "r", "key": "lock"})).await["version"].clone();
    let ok = kv(&b, json!([{"op": "put", "ns": "r", "key": "a", "value": 1, "forever": true},
                          {"op": "check", "ns": "r", "key": "lock", "expect": v, "required": true}])).await;
    assert_eq!(ok["success"], true);
    assert_eq!(one(&b, json!({"op": "get", "ns": "r", "key": "a"})).await["found"], true);
}

#[tokio::test]
async fn concurrent_writers_are_ordered_across_two_brokers() {
    let a = Broker::start().await;
    let b = a.peer().await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let (http, url) = if i % 2 == 0 { (a.http.clone(), a.url.clone()) } else { (b.http.clone(), b.url.clone()) };
        tasks.push(tokio::spawn(async move {
            let body = json!({"operations": [
                {"op": "putIfAbsent", "ns": "c", "key": "leader", "value": i, "ttlSeconds": 60},
                {"op": "incr", "ns": "c", "key": "count", "forever": true}]});
            let r: Value = http.post(format!("{url}/api/v1/kv")).json(&body).send().await.unwrap().json().await.unwrap();
            r["results"][0]["applied"].as_bool().unwrap()
        }));
    }
    let mut winners = 0;
    for t in tasks {
        winners += t.await.unwrap() as i32;
    }
    assert_eq!(winners, 1, "exactly one putIfAbsent applies");
    assert_eq!(one(&b, json!({"op": "get", "ns": "c", "key": "count"})).await["value"], 40);
    let leader = one(&a, json!({"op": "get", "ns": "c", "key": "leader"})).await;
    assert_eq!(one(&b, json!({"op": "get", "ns": "c", "key": "leader"})).await, leader, "both brokers read one truth");
}

#[tokio::test]
async fn bad_calls_are_refused_whole_with_the_kv_envelope() {
    let b = Broker::start().await;
    let (status, r) = b
        .post("/api/v1/kv", json!({"operations": [
            {"op": "put", "ns": "e", "key": "ok", "value": 1, "forever": true},
            {"op": "put", "ns": "e", "key": "k", "value": 1}]}))
        .await;
    assert_eq!(status, 400);
    assert_eq!((r["error"].clone(), r["reason"].clone()), (json!("kv_bad_request"), json!("kv_expiry_not_specified")));
    assert_eq!(r["detail"], "operations[1]: exactly one of ttlSeconds and forever:true is required");
    assert_eq!(one(&b, json!({"op": "get", "ns": "e", "key": "ok"})).await["found"], false, "nothing of a refused call ran");
    let (status, r) = b.post("/api/v1/kv", json!({"operations": [{"op": "put", "ns": "e", "key": "k", "value": "x".repeat(70_000), "forever": true}]})).await;
    assert_eq!((status, r["error"].clone()), (413, json!("kv_value_too_large")));
    let (status, r) = b.post("/api/v1/kv", json!({"nothing": true})).await;
    assert_eq!((status, r["reason"].clone()), (400, json!("invalid_body")));
    let (status, r) = b.post("/api/v1/kv", json!([{"op": "get", "ns": "bad ns!", "key": "k"}])).await;
    assert_eq!((status, r["reason"].clone()), (400, json!("invalid_namespace")));
    let raw = b.http.post(format!("{}/api/v1/kv", b.url)).header("content-type", "application/json").body("{oops").send().await.unwrap();
    assert_eq!(raw.status().as_u16(), 400);
    assert_eq!(raw.json::<Value>().await.unwrap()["error"], "kv_bad_request");

    let off = Broker::start_with(&[("QUEEN_KV_ENABLED", "false")]).await;
    let r = off.http.post(format!("{}/api/v1/kv", off.url)).json(&json!({"operations": []})).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string())), (503, Some("1".into())));
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "kv_disabled");
}

#[tokio::test]
async fn the_per_key_routes_and_the_console_reads() {
    let b = Broker::start().await;
    let put = b.http.put(format!("{}/api/v1/kv/cfg/feature/flags/dark", b.url)).json(&json!({"value": true, "forever": true})).send().await.unwrap();
    assert_eq!(put.status().as_u16(), 200);
    let v = put.json::<Value>().await.unwrap();
    assert_eq!((v["applied"].clone(), v["key"].clone()), (json!(true), json!("feature/flags/dark")), "the key may hold slashes");
    let (status, got) = b.get("/api/v1/kv/cfg/feature/flags/dark").await;
    assert_eq!((status, got["value"].clone()), (200, json!(true)));
    assert_eq!(b.get("/api/v1/kv/cfg/missing").await, (404, json!({"found": false, "key": "missing"})));
    let bad = b.http.put(format!("{}/api/v1/kv/cfg/k", b.url)).json(&json!({"value": 1})).send().await.unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    for k in ["a", "b", "c"] {
        one(&b, json!({"op": "put", "ns": "cfg", "key": k, "value": k, "forever": true})).await;
    }
    let (_, ns) = b.get("/api/v1/resources/kv/namespaces").await;
    assert_eq!((ns["namespaces"][0]["ns"].clone(), ns["namespaces"][0]["keys"].clone()), (json!("cfg"), json!(4)));
    let (status, page) = b.post("/api/v1/resources/kv/list", json!({"ns": "cfg", "limit": 2})).await;
    assert_eq!(status, 200, "{page}");
    let keys: Vec<&str> = page["keys"].as_array().unwrap().iter().map(|k| k["key"].as_str().unwrap()).collect();
    assert_eq!((keys, page["nextAfter"].clone()), (vec!["a", "b"], json!("b")));
    let (_, rest) = b.post("/api/v1/resources/kv/list", json!({"ns": "cfg", "after": "b"})).await;
    assert_eq!(rest["keys"].as_array().unwrap().len(), 2);
    assert_eq!(b.post("/api/v1/resources/kv/list", json!({})).await.0, 400);
    let del = b.http.delete(format!("{}/api/v1/kv/cfg/a?expect=1", b.url)).send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!((del["applied"].clone(), del["reason"].clone()), (json!(false), json!("version")));
    let del = b.http.delete(format!("{}/api/v1/kv/cfg/a", b.url)).send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(del["applied"], true);
}

#[tokio::test]
async fn a_broker_killed_mid_call_leaves_every_call_whole_or_absent() {
    let mut b = Broker::start().await;
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
    let mut tasks = Vec::new();
    for i in 0..400 {
        let (http, url, answered) = (b.http.clone(), b.url.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            // Each call: a counter and a log row, both or neither.
            let body = json!({"operations": [
                {"op": "incr", "ns": "crash", "key": "count", "forever": true},
                {"op": "put", "ns": "crash", "key": format!("log:{i}"), "value": i, "forever": true}]});
            if let Ok(r) = http.post(format!("{url}/api/v1/kv")).json(&body).send().await {
                if r.status().as_u16() == 200 && r.json::<Value>().await.is_ok_and(|v| v["success"] == true) {
                    answered.lock().unwrap().push(i);
                }
            }
        }));
    }
    // Single puts beside them, which share commits (kv::share): each one
    // answered is stored too.
    let singles = std::sync::Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
    for i in 0..400 {
        let (http, url, singles) = (b.http.clone(), b.url.clone(), singles.clone());
        tasks.push(tokio::spawn(async move {
            let body = json!({"operations": [{"op": "put", "ns": "crash", "key": format!("single:{i}"), "value": i, "forever": true}]});
            if let Ok(r) = http.post(format!("{url}/api/v1/kv")).json(&body).send().await {
                if r.status().as_u16() == 200 && r.json::<Value>().await.is_ok_and(|v| v["success"] == true) {
                    singles.lock().unwrap().push(i);
                }
            }
        }));
    }
    eventually("some calls are answered", Duration::from_secs(20), || {
        let answered = answered.clone();
        async move { answered.lock().unwrap().len() >= 50 }
    })
    .await;
    b.kill();
    for t in tasks {
        t.await.unwrap();
    }
    let sql = b.sql().await;
    let logs: i64 = sql.query_one("SELECT count(*) FROM queen.kv WHERE ns = 'crash' AND key LIKE 'log:%'", &[]).await.unwrap().get(0);
    let count: String = sql.query_one("SELECT value::text FROM queen.kv WHERE ns = 'crash' AND key = 'count'", &[]).await.unwrap().get(0);
    assert_eq!(count.parse::<i64>().unwrap(), logs, "the counter and the log rows moved together");
    let answered = answered.lock().unwrap().clone();
    for i in &answered {
        let n: i64 = sql.query_one("SELECT count(*) FROM queen.kv WHERE ns = 'crash' AND key = $1", &[&format!("log:{i}")]).await.unwrap().get(0);
        assert_eq!(n, 1, "answered call {i} is stored");
    }
    let singles = singles.lock().unwrap().clone();
    for i in &singles {
        let n: i64 = sql.query_one("SELECT count(*) FROM queen.kv WHERE ns = 'crash' AND key = $1", &[&format!("single:{i}")]).await.unwrap().get(0);
        assert_eq!(n, 1, "answered single put {i} is stored");
    }
}

#[tokio::test]
async fn the_kill_switch_is_kept_in_the_database_and_every_broker_honours_it() {
    let a = Broker::start_with(&[("QUEEN_CACHE_REFRESH_INTERVAL_MS", "200")]).await;
    let b = Broker::spawn(a.db.clone(), vec![
        ("QUEEN_DATABASE_URL".into(), common::cluster().url(&a.db)),
        ("QUEEN_CACHE_REFRESH_INTERVAL_MS".into(), "200".into()),
    ])
    .await;
    let op = json!({"operations": [{"op": "put", "ns": "s", "key": "k", "value": 1, "forever": true}]});
    assert_eq!(b.post("/api/v1/kv", op.clone()).await.0, 200);
    let (status, r) = a.post("/api/v1/system/kv-timers", json!({"kv": false})).await;
    assert_eq!((status, r["kv"].clone(), r["timers"].clone(), r["enabled"].clone()), (200, json!(false), json!(true), json!(false)));
    let (status, r) = a.post("/api/v1/kv", op.clone()).await;
    assert_eq!((status, r["error"].clone()), (503, json!("kv_disabled")), "at once on the broker that took it");
    eventually("the other broker honours the switch", Duration::from_secs(5), || async { b.post("/api/v1/kv", op.clone()).await.0 == 503 }).await;
    assert_eq!(b.post("/api/v1/locks", json!([{"op": "get", "name": "x"}])).await.0, 503, "locks are KV");
    let (status, _) = b
        .post("/api/v1/transaction", json!({"operations": [{"type": "push", "queue": "q", "payload": 1}], "kv": [{"op": "get", "ns": "s", "key": "k"}]}))
        .await;
    assert_eq!(status, 403, "a rider of a switched-off family");
    let (_, state) = b.get("/api/v1/system/kv-timers").await;
    assert_eq!(state["kv"], false);
    assert_eq!(a.post("/api/v1/system/kv-timers", json!({"enabled": "yes"})).await.0, 400);
    assert_eq!(a.post("/api/v1/system/kv-timers", json!({})).await.0, 400);
    assert_eq!(a.post("/api/v1/system/kv-timers", json!({"enabled": true})).await.0, 200);
    eventually("both brokers serve KV again", Duration::from_secs(5), || async {
        a.post("/api/v1/kv", op.clone()).await.0 == 200 && b.post("/api/v1/kv", op.clone()).await.0 == 200
    })
    .await;
}

#[tokio::test]
async fn supervised_consumers_are_listed_from_what_they_publish() {
    use base64::Engine as _;
    let b = Broker::start().await;
    let publish = |group: &str, instance: &str, write: &str, doc: Value| {
        let data = base64::engine::general_purpose::STANDARD.encode(doc.to_string());
        json!([{"op": "put", "ns": "queen-supervisor", "key": format!("{group}/{instance}/head"), "ttlSeconds": 60,
                "value": {"format": "queen.supervisor.remote-status/v1", "write": write, "chunks": 1, "bytes": data.len()}},
               {"op": "put", "ns": "queen-supervisor", "key": format!("{group}/{instance}/chunk/0000"), "ttlSeconds": 60,
                "value": {"write": write, "index": 0, "data": data}}])
    };
    let doc = |id: &str| json!({"schema": "queen.consumer.status/v1", "instance_id": id, "engine": "python", "hostname": "h1",
                                "pid": 42, "state": "running", "uptime_seconds": 5,
                                "pool_status": [{"queue": "orders", "consumer_group": "billing", "running": 1}]});
    let r = kv(&b, publish("billing-app", "i1", "w1", doc("i1"))).await;
    assert!(r["results"].as_array().unwrap().iter().all(|x| x["applied"] == true));
    kv(&b, publish("other-app", "i2", "w1", doc("i2"))).await;
    // A head whose chunk belongs to another write is a publication in progress: not shown.
    kv(&b, json!([{"op": "put", "ns": "queen-supervisor", "key": "torn/i3/head", "ttlSeconds": 60,
                   "value": {"write": "new", "chunks": 1}},
                  {"op": "put", "ns": "queen-supervisor", "key": "torn/i3/chunk/0000", "ttlSeconds": 60,
                   "value": {"write": "old", "index": 0, "data": "e30="}}])).await;
    let (status, all) = b.get("/api/v1/consumers").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["total"], 2);
    let c = &all["consumers"][0];
    assert_eq!((c["group"].clone(), c["instanceId"].clone(), c["state"].clone(), c["pid"].clone()), (json!("billing-app"), json!("i1"), json!("running"), json!(42)));
    assert_eq!(c["pools"][0]["queue"], "orders");
    let (_, one) = b.get("/api/v1/consumers?group=other-app").await;
    assert_eq!((one["total"].clone(), one["consumers"][0]["instanceId"].clone()), (json!(1), json!("i2")));
}

/// Issue 44 §4: a conditional put that expects a version of a key that does
/// not exist creates nothing and answers `absent` at version 0 (not null),
/// in a batch, through the per-key route, and as a lost `required` verdict;
/// a delete of an absent key answers version 0 too.
#[tokio::test]
async fn expect_on_an_absent_key_creates_nothing_and_answers_version_0() {
    let b = Broker::start().await;
    let r = one(&b, json!({"op": "put", "ns": "saga", "key": "order-7", "value": "refund", "forever": true, "expect": 5})).await;
    assert_eq!((r["applied"].clone(), r["reason"].clone(), r["version"].clone()), (json!(false), json!("absent"), json!(0)), "{r}");
    assert_eq!(r["value"], Value::Null);
    let put = b.http.put(format!("{}/api/v1/kv/saga/order-7", b.url)).json(&json!({"value": "refund", "forever": true, "expect": 3})).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let r: Value = put.json().await.unwrap();
    assert_eq!((r["applied"].clone(), r["reason"].clone(), r["version"].clone()), (json!(false), json!("absent"), json!(0)), "{r}");
    let (status, r) = b
        .post("/api/v1/kv", json!({"operations": [{"op": "put", "ns": "saga", "key": "order-7", "value": "refund", "forever": true,
                                                    "expect": 9, "required": true}]}))
        .await;
    assert_eq!(status, 200);
    assert_eq!((r["success"].clone(), r["kvReason"].clone(), r["version"].clone()), (json!(false), json!("absent"), json!(0)), "{r}");
    assert_eq!(one(&b, json!({"op": "get", "ns": "saga", "key": "order-7"})).await["found"], false, "nothing was created");
    let d = one(&b, json!({"op": "delete", "ns": "saga", "key": "order-7"})).await;
    assert_eq!((d["applied"].clone(), d["reason"].clone(), d["version"].clone()), (json!(false), json!("absent"), json!(0)), "{d}");
    let c = one(&b, json!({"op": "check", "ns": "saga", "key": "order-7", "expect": 4})).await;
    assert_eq!((c["applied"].clone(), c["reason"].clone(), c["version"].clone()), (json!(false), json!("absent"), json!(0)), "{c}");
}

/// Issue 44 §4: a batch answers one result per operation in request order,
/// each carrying its `index`, whatever the operations' kinds; a rolled-back
/// call's results keep theirs.
#[tokio::test]
async fn a_batch_answers_each_operation_in_request_order_with_its_index() {
    let b = Broker::start().await;
    let ops = json!([
        {"op": "put", "ns": "ix", "key": "a", "value": 1, "forever": true},
        {"op": "get", "ns": "ix", "key": "a"},
        {"op": "incr", "ns": "ix", "key": "n", "forever": true},
        {"op": "getMany", "ns": "ix", "keys": ["a", "zz"]},
        {"op": "putIfAbsent", "ns": "ix", "key": "a", "value": 2, "forever": true},
        {"op": "getPrefix", "ns": "ix", "prefix": "a"},
        {"op": "delete", "ns": "ix", "key": "n"},
        {"op": "check", "ns": "ix", "key": "n", "expect": 0}
    ]);
    let r = kv(&b, ops).await;
    assert_eq!(r["success"], true, "{r}");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 8);
    for (i, x) in results.iter().enumerate() {
        assert_eq!(x["index"], json!(i), "{x}");
    }
    assert_eq!((results[0]["applied"].clone(), results[1]["found"].clone()), (json!(true), json!(true)));
    assert_eq!(results[2]["value"], json!(1));
    assert_eq!(results[3]["missing"], json!(["zz"]));
    assert_eq!(results[4]["reason"], "exists");
    assert_eq!(results[5]["rows"].as_array().unwrap().len(), 1);
    assert_eq!((results[6]["applied"].clone(), results[7]["applied"].clone()), (json!(true), json!(true)));
    let (_, lost) = b
        .post("/api/v1/kv", json!({"operations": [
            {"op": "put", "ns": "ix", "key": "b", "value": 1, "forever": true},
            {"op": "check", "ns": "ix", "key": "a", "expect": 0, "required": true},
            {"op": "put", "ns": "ix", "key": "c", "value": 1, "forever": true}]}))
        .await;
    let indexes: Vec<Value> = lost["results"].as_array().unwrap().iter().map(|x| x["index"].clone()).collect();
    assert_eq!(indexes, [json!(0), json!(1), json!(2)], "{lost}");
}

/// Issue 45: the read budget (`QUEEN_KV_MAX_READ_BYTES`) was each
/// operation's, so a call of 256 getMany's could answer 256 times the
/// budget. It is the call's: later reads get what earlier ones left (at
/// least one row each, so a call always moves forward).
#[tokio::test]
async fn the_read_budget_is_the_calls_not_each_operations() {
    let b = Broker::start_with(&[("QUEEN_KV_MAX_READ_BYTES", "1024")]).await;
    let value = "v".repeat(398); // 400 bytes of JSON + a 2-byte key: 402 a row
    let puts: Vec<Value> = (1..=3).map(|i| json!({"op": "put", "ns": "n", "key": format!("k{i}"), "value": value, "forever": true})).collect();
    kv(&b, json!(puts)).await;
    let many = json!({"op": "getMany", "ns": "n", "keys": ["k1", "k2", "k3"]});
    let r = kv(&b, json!([many.clone(), many.clone(), many])).await;
    let rows: Vec<usize> = (0..3).map(|i| r["results"][i]["rows"].as_array().unwrap().len()).collect();
    assert_eq!(rows, [2, 1, 1], "804 of 1024 bytes, then one row each: {r}");
    assert!((0..3).all(|i| r["results"][i]["truncated"] == true), "{r}");
    // A call of its own gets the whole budget again.
    let alone = kv(&b, json!([{"op": "getPrefix", "ns": "n", "prefix": "k"}])).await;
    assert_eq!(alone["results"][0]["rows"].as_array().unwrap().len(), 2);
}

/// Concurrent single-write calls share commits (`kv::share`), each
/// answered with its own verdict: of many concurrent `putIfAbsent` one
/// applies, every `incr` counts, a stale `expect` among them loses alone
/// and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_single_writes_share_commits_and_each_gets_its_own_verdict() {
    let b = Broker::start_with(&[("QUEEN_KV_GROUP_WRITERS", "1")]).await;
    let fenced = one(&b, json!({"op": "put", "ns": "s", "key": "fenced", "value": "kept", "forever": true})).await;
    let fenced_version = fenced["version"].as_i64().unwrap();
    let shared = || async { common::sample(&b.prometheus().await, "queen_kv_shared_calls_total").unwrap_or(0.0) };
    let mut rounds = 0i64;
    while shared().await == 0.0 {
        assert!(rounds < 20, "twenty rounds of concurrent single writes never shared a commit");
        let b = &b;
        let calls = (0..30).map(|i| async move {
            let op = match i % 3 {
                0 => json!({"op": "putIfAbsent", "ns": "s", "key": format!("leader:{rounds}"), "value": i, "forever": true}),
                1 => json!({"op": "incr", "ns": "s", "key": format!("count:{rounds}"), "forever": true}),
                _ => json!({"op": "put", "ns": "s", "key": "fenced", "value": i, "forever": true, "expect": fenced_version + 1000}),
            };
            (i, one(b, op).await)
        });
        let mut winners = 0;
        for (i, r) in futures_util::future::join_all(calls).await {
            match i % 3 {
                0 => winners += (r["applied"] == true) as i32,
                1 => assert_eq!(r["applied"], true, "{r}"),
                _ => assert_eq!((r["applied"].clone(), r["reason"].clone(), r["value"].clone()), (json!(false), json!("version"), json!("kept")), "{r}"),
            }
        }
        assert_eq!(winners, 1, "exactly one putIfAbsent applies");
        assert_eq!(one(&b, json!({"op": "get", "ns": "s", "key": format!("count:{rounds}")})).await["value"], 10);
        rounds += 1;
    }
    let kept = one(&b, json!({"op": "get", "ns": "s", "key": "fenced"})).await;
    assert_eq!((kept["value"].clone(), kept["version"].clone()), (json!("kept"), json!(fenced_version)));
}

/// Concurrent plain puts of distinct keys are one insert
/// (`queen.kv_put_many_v1`); a batch with a key twice takes the per-call
/// path. Either way each put is answered with its own key, value, version
/// and expiry, and what is stored is what the last answered version says.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_plain_puts_share_one_insert_and_answer_each_its_own_row() {
    let b = Broker::start_with(&[("QUEEN_KV_GROUP_WRITERS", "1")]).await;
    let shared = || async { common::sample(&b.prometheus().await, "queen_kv_shared_calls_total").unwrap_or(0.0) };
    let mut rounds = 0;
    while shared().await == 0.0 || rounds < 2 {
        assert!(rounds < 20, "twenty rounds of concurrent puts never shared a commit");
        let b = &b;
        // Odd rounds put one key ten times among the others (the per-call path).
        let calls = (0..40).map(|i| async move {
            let key = if rounds % 2 == 1 && i < 10 { format!("same:{rounds}") } else { format!("k:{rounds}:{i}") };
            let mut op = json!({"op": "put", "ns": "many", "key": key, "value": {"i": i}});
            if i % 2 == 0 {
                op["ttlSeconds"] = json!(3600);
            } else {
                op["forever"] = json!(true);
            }
            (i, key, one(b, op).await)
        });
        let answers = futures_util::future::join_all(calls).await;
        let mut last_same: Option<(i64, Value)> = None;
        for (i, key, r) in &answers {
            assert_eq!((&r["applied"], &r["key"], &r["value"]), (&json!(true), &json!(key), &json!({"i": i})), "{r}");
            assert!(r["version"].as_i64().unwrap() > 0, "{r}");
            assert_eq!(r["expiresAt"].is_string(), i % 2 == 0, "{r}");
            if key.starts_with("same:") && last_same.as_ref().is_none_or(|(v, _)| r["version"].as_i64().unwrap() > *v) {
                last_same = Some((r["version"].as_i64().unwrap(), r["value"].clone()));
            }
        }
        for (_, key, r) in &answers {
            let stored = one(b, json!({"op": "get", "ns": "many", "key": key})).await;
            match (&last_same, key.starts_with("same:")) {
                (Some((version, value)), true) => assert_eq!((&stored["version"], &stored["value"]), (&json!(version), value), "{stored}"),
                _ => assert_eq!((&stored["version"], &stored["value"]), (&r["version"], &r["value"]), "{stored}"),
            }
        }
        rounds += 1;
    }
}
