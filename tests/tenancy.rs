//! Tenants (issue 49, `tenancy`): choosing a request's tenant (the header a
//! trusted proxy sets, the token's claim, the refusals, the boot
//! interlock), and the isolation of what is per tenant so far: push, the
//! named pops, acks, transactions, queues and groups. Every other route refuses a
//! tenant other than the default, never serving it the default's data.

mod common;

use std::process::Command;

use common::{cluster, Broker};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const OTHER: &str = "6f1c2a34-0000-4000-8000-00000000abcd";
const DEFAULT: &str = "00000000-0000-0000-0000-000000000001";
const SECRET: &str = "tenancy-test-secret";

async fn send(b: &Broker, method: &str, path: &str, tenant: Option<&str>, token: Option<&str>) -> (u16, Value) {
    let url = format!("{}{}", b.url, path);
    let mut req = match method {
        "GET" => b.http.get(url),
        _ => b.http.post(url).json(&json!({"items": [{"queue": "tq", "payload": 1}]})),
    };
    if let Some(t) = tenant {
        req = req.header("x-queen-tenant", t);
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// `method path` as `tenant`, with a JSON body for other methods than GET
/// and DELETE: the status and the JSON answer (null when none).
fn as_tenant(b: &Broker, method: &str, path: String, tenant: &str, body: Option<Value>) -> impl std::future::Future<Output = (u16, Value)> {
    let url = format!("{}{}", b.url, path);
    let req = match method {
        "GET" => b.http.get(url),
        "DELETE" => b.http.delete(url),
        "PUT" => b.http.put(url).json(&body.unwrap_or(Value::Null)),
        _ => b.http.post(url).json(&body.unwrap_or(Value::Null)),
    };
    let req = req.header("x-queen-tenant", tenant);
    async move {
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or(Value::Null))
    }
}

async fn queues(b: &Broker) -> i64 {
    b.sql().await.query_one("SELECT count(*) FROM queen.queues", &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn the_header_chooses_the_tenant_and_what_it_cannot_serve_is_refused_and_changes_nothing() {
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    // Malformed: 400 naming the header; reserved: 403; both change nothing.
    for bad in ["nope", "00000000000000000000000000000001", "{00000000-0000-0000-0000-000000000001}"] {
        let (status, body) = send(&b, "POST", "/api/v1/push", Some(bad), None).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"].as_str().unwrap().starts_with("x-queen-tenant"), "{body}");
    }
    for reserved in ["00000000-0000-0000-0000-00000000fffd", "00000000-0000-0000-0000-00000000FFFE"] {
        let (status, body) = send(&b, "POST", "/api/v1/push", Some(reserved), None).await;
        assert_eq!((status, &body["code"]), (403, &json!("reserved_tenant")), "{body}");
    }
    assert_eq!(queues(&b).await, 0, "no refused request created anything");
    // The queue listing, per tenant: another tenant's queue is not in it.
    assert_eq!(send(&b, "POST", "/api/v1/push", Some(OTHER), None).await.0, 201);
    for t in [Some(OTHER), None, Some(DEFAULT)] {
        let (status, body) = send(&b, "GET", "/api/v1/resources/queues", t, None).await;
        assert_eq!((status, body["total"].as_i64()), (200, Some(t.map_or(0, |t| (t == OTHER) as i64))), "{t:?}: {body}");
    }
    assert_eq!(queues(&b).await, 1);
    // A route the tenancy rules do not know (none of the router's: see
    // tests/api_reference.rs) is refused, never served across tenants.
    let (status, body) = send(&b, "GET", "/api/v1/not-a-route", Some(OTHER), None).await;
    assert_eq!((status, &body["code"]), (403, &json!("tenant_unsupported")), "{body}");
    // No header, a blank one, or the default tenant named: served.
    for t in [None, Some(" "), Some(DEFAULT), Some("00000000-0000-0000-0000-000000000001 ")] {
        assert_eq!(send(&b, "POST", "/api/v1/push", t, None).await.0, 201, "{t:?}");
    }
    assert_eq!(queues(&b).await, 2, "OTHER's tq and the default tenant's");
    // Broker-wide routes do not look at it.
    assert_eq!(send(&b, "GET", "/health", Some("nope"), None).await.0, 200);
    assert_eq!(send(&b, "GET", "/api/v1/system/brokers", Some(OTHER), None).await.0, 200);
    // /auth/me names the tenant chosen.
    let (status, me) = send(&b, "GET", "/auth/me", Some(&OTHER.to_uppercase()), None).await;
    assert_eq!((status, &me["tenant"], &me["clusters"][0]["tenant_id"]), (200, &json!(OTHER), &json!(OTHER)));
    assert_eq!(send(&b, "GET", "/auth/me", Some("nope"), None).await.0, 400);
}

#[tokio::test]
async fn without_the_switch_the_header_is_ignored() {
    let b = Broker::start().await;
    assert_eq!(send(&b, "POST", "/api/v1/push", Some("nope"), None).await.0, 201);
    assert_eq!(send(&b, "POST", "/api/v1/push", Some(OTHER), None).await.0, 201);
    assert_eq!(send(&b, "GET", "/auth/me", Some(OTHER), None).await.1["tenant"], DEFAULT);
}

#[tokio::test]
async fn a_tenant_claim_names_the_tenant_and_a_header_that_disagrees_is_refused() {
    let b = Broker::start_with(&[
        ("JWT_ENABLED", "true"),
        ("JWT_SECRET", SECRET),
        ("QUEEN_TENANT_CLAIM", "tid"),
        ("QUEEN_TENANCY_HEADER", "true"),
        ("QUEEN_TRUSTED_PROXY", "true"),
    ])
    .await;
    let token = |claims: Value| encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap();
    let exp = chrono::Utc::now().timestamp() + 300;
    let default = token(json!({"sub": "a", "role": "admin", "tid": DEFAULT, "exp": exp}));
    let other = token(json!({"sub": "b", "role": "admin", "tid": OTHER, "exp": exp}));
    let none = token(json!({"sub": "c", "role": "admin", "exp": exp}));
    let junk = token(json!({"sub": "d", "role": "admin", "tid": 7, "exp": exp}));
    assert_eq!(send(&b, "POST", "/api/v1/push", None, Some(&default)).await.0, 201);
    assert_eq!(send(&b, "POST", "/api/v1/push", Some(DEFAULT), Some(&default)).await.0, 201, "a header that agrees");
    let (status, body) = send(&b, "POST", "/api/v1/push", Some(OTHER), Some(&default)).await;
    assert_eq!((status, &body["code"]), (403, &json!("tenant_mismatch")), "{body}");
    assert_eq!(send(&b, "POST", "/api/v1/push", None, Some(&none)).await.1["code"], "tenant_claim_missing");
    assert_eq!(send(&b, "POST", "/api/v1/push", None, Some(&junk)).await.1["code"], "tenant_claim_invalid");
    assert_eq!(send(&b, "GET", "/api/v1/not-a-route", None, Some(&other)).await.1["code"], "tenant_unsupported");
    assert_eq!(send(&b, "POST", "/api/v1/push", None, Some(&other)).await.0, 201, "push is per tenant");
    let (status, me) = send(&b, "GET", "/auth/me", None, Some(&other)).await;
    assert_eq!((status, &me["tenant"], &me["subject"]), (200, &json!(OTHER), &json!("b")));
    assert_eq!(send(&b, "GET", "/auth/me", Some(DEFAULT), Some(&other)).await.1["code"], "tenant_mismatch");
}

#[tokio::test]
async fn the_header_without_a_trusted_proxy_stops_the_boot_with_a_clear_message() {
    let c = cluster();
    let db = c.create_db().await;
    let out = Command::new(env!("CARGO_BIN_EXE_queen"))
        .arg("serve")
        .env("QUEEN_DATABASE_URL", c.url(&db))
        .env("PORT", "0")
        .env("QUEEN_TENANCY_HEADER", "true")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("QUEEN_TENANCY_HEADER") && said.contains("QUEEN_TRUSTED_PROXY=true"), "{said}");
}

/// The same scenario in three tenants of one broker, with the same queue,
/// partition and group names: each sees only its own messages, queues and
/// cursors, and a partition id of another tenant answers as an unknown one.
#[tokio::test]
async fn push_pop_ack_and_the_queue_listing_are_per_tenant() {
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    let third = "6f1c2a34-0000-4000-8000-0000000000ff";
    let call = |method: &'static str, path: String, tenant: &'static str, body: Option<Value>| as_tenant(&b, method, path, tenant, body);
    for (tenant, n) in [(DEFAULT, 2), (OTHER, 3), (third, 1)] {
        let items: Vec<Value> = (0..n).map(|i| json!({"queue": "orders", "partition": "p", "transactionId": format!("t{i}"), "payload": {"tenant": tenant, "i": i}})).collect();
        let (status, body) = call("POST", "/api/v1/push".into(), tenant, Some(json!({"items": items}))).await;
        assert_eq!(status, 201, "{body}");
        assert!(body.as_array().unwrap().iter().all(|r| r["status"] == "queued" && r["queueName"] == "orders"), "{body}");
    }
    // The same transactionId in another tenant is its own message, not a duplicate.
    assert_eq!(queues(&b).await, 3);
    // Prometheus: another tenant's series carry its tenant and the name it gave.
    let text = b.http.get(format!("{}/metrics/prometheus", b.url)).send().await.unwrap().text().await.unwrap();
    assert!(text.contains(&format!("queen_push_messages_total{{queue=\"orders\",tenant=\"{OTHER}\"}} 3")), "{text}");
    assert!(text.contains("queen_push_messages_total{queue=\"orders\"} 2"), "the default tenant's as before");
    assert!(!text.contains('\u{1}'), "no stored name shows");
    let mut leases = Vec::new();
    for (tenant, n) in [(DEFAULT, 2), (OTHER, 3), (third, 1)] {
        let (status, body) = call("GET", "/api/v1/pop/queue/orders?batch=10&consumerGroup=g".into(), tenant, None).await;
        assert_eq!(status, 200);
        assert_eq!(body["queue"], "orders");
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), n, "{tenant}: only its own messages");
        assert!(msgs.iter().all(|m| m["data"]["tenant"] == tenant));
        let (_, list) = call("GET", "/api/v1/resources/queues".into(), tenant, None).await;
        assert_eq!((list["total"].as_i64(), &list["queues"][0]["name"], list["queues"][0]["messages"].as_i64()), (Some(1), &json!("orders"), Some(n as i64)));
        let (status, q) = call("GET", "/api/v1/resources/queues/orders".into(), tenant, None).await;
        assert_eq!((status, &q["name"], q["messages"].as_i64()), (200, &json!("orders"), Some(n as i64)));
        leases.push((tenant, body["leaseId"].as_str().unwrap().to_string(), msgs[0]["partitionId"].as_str().unwrap().to_string(),
                     msgs[0]["transactionId"].as_str().unwrap().to_string()));
    }
    let ids: std::collections::HashSet<&str> = leases.iter().map(|l| l.2.as_str()).collect();
    assert_eq!(ids.len(), 3, "three partitions");
    // Another tenant's partition id, lease and transactionId: answered as
    // an ack of a partition that does not exist, and changing nothing.
    let (_, ref lease, ref pid, ref txn) = leases[1];
    let ack = |pid: &str| json!({"transactionId": txn, "partitionId": pid, "leaseId": lease, "status": "completed", "consumerGroup": "g"});
    let (s1, foreign) = call("POST", "/api/v1/ack".into(), third, Some(ack(pid))).await;
    let (s2, unknown) = call("POST", "/api/v1/ack".into(), third, Some(ack("987654321"))).await;
    assert_eq!((s1, &foreign), (s2, &unknown), "a foreign partition answers as an unknown one");
    assert_eq!(foreign[0]["success"], false, "{foreign}");
    let (s3, batch) = call("POST", "/api/v1/ack/batch".into(), DEFAULT, Some(json!({"consumerGroup": "g", "acknowledgments": [ack(pid)]}))).await;
    assert_eq!((s3, &batch[0]["success"]), (200, &json!(false)), "{batch}");
    // Its own tenant acks it.
    let (_, own) = call("POST", "/api/v1/ack".into(), OTHER, Some(ack(pid))).await;
    assert_eq!(own[0]["success"], true, "{own}");
    // Its lease: extended by its tenant, unknown to the others.
    let extend = |tenant: &'static str| call("POST", format!("/api/v1/lease/{lease}/extend"), tenant, Some(json!({"seconds": 30})));
    let (status, other_extends) = extend(third).await;
    assert_eq!((status, &other_extends["success"], &other_extends["renewed"]), (200, &json!(false), &json!(0)), "{other_extends}");
    assert_eq!(extend(OTHER).await.1["success"], true);
    // Configure reaches the tenant's own queue only.
    let (status, conf) = call("POST", "/api/v1/configure".into(), OTHER, Some(json!({"queue": "orders", "options": {"leaseTime": 77}}))).await;
    assert_eq!((status, &conf["queue"]), (200, &json!("orders")), "{conf}");
    assert_eq!(call("GET", "/api/v1/resources/queues/orders".into(), OTHER, None).await.1["options"]["leaseTime"], 77);
    assert_ne!(call("GET", "/api/v1/resources/queues/orders".into(), DEFAULT, None).await.1["options"]["leaseTime"], 77);
    // The routes of one named queue act on the tenant's own.
    let (status, depth) = call("GET", "/api/v1/resources/queues/orders/depth?group=g".into(), OTHER, None).await;
    assert_eq!((status, &depth["queue"]), (200, &json!("orders")), "{depth}");
    let (status, seek) = call("POST", "/api/v1/consumer-groups/g/queues/orders/seek".into(), third, Some(json!({"toEnd": true}))).await;
    assert_eq!((status, &seek["queueName"], &seek["partitionsUpdated"]), (200, &json!("orders"), &json!(1)), "{seek}");
    let (status, gone) = call("DELETE", "/api/v1/resources/queues/orders".into(), third, None).await;
    assert_eq!((status, &gone["queue"], &gone["deleted"]), (200, &json!("orders"), &json!(true)), "{gone}");
    assert_eq!(call("GET", "/api/v1/resources/queues/orders".into(), third, None).await.0, 404);
    for tenant in [DEFAULT, OTHER] {
        assert_eq!(call("GET", "/api/v1/resources/queues/orders".into(), tenant, None).await.0, 200, "{tenant} keeps its queue");
    }
    // A tenant's lookup of a name only another tenant has: 404.
    let (_, _) = call("POST", "/api/v1/push".into(), OTHER, Some(json!({"items": [{"queue": "only-other", "payload": 1}]}))).await;
    assert_eq!(call("GET", "/api/v1/resources/queues/only-other".into(), DEFAULT, None).await.0, 404);
    assert_eq!(call("GET", "/api/v1/resources/queues/only-other".into(), OTHER, None).await.0, 200);
    // Spelling another tenant's stored name reaches nothing of it.
    let spelled = format!("/api/v1/resources/queues/%01{OTHER}%01only-other");
    assert_eq!(call("GET", spelled.clone(), DEFAULT, None).await.0, 404);
    assert_eq!(call("DELETE", spelled, DEFAULT, None).await.1["existed"], false);
    assert_eq!(call("GET", "/api/v1/resources/queues/only-other".into(), OTHER, None).await.0, 200, "still there");
    assert_eq!(call("GET", "/api/v1/pop/queue/only-other?batch=10&wait=false".into(), third, None).await.0, 204);
    // Consumer groups: each tenant lists and deletes its own `g` only.
    let (_, groups) = call("GET", "/api/v1/consumer-groups".into(), OTHER, None).await;
    let g = groups.as_array().unwrap().iter().find(|g| g["name"] == "g").expect("OTHER's group g");
    assert_eq!(g["queues"], json!(["orders"]), "{groups}");
    let (_, one) = call("GET", "/api/v1/consumer-groups/g".into(), OTHER, None).await;
    assert_eq!(one.as_object().unwrap().keys().collect::<Vec<_>>(), vec!["orders"], "{one}");
    let (status, deleted) = call("DELETE", "/api/v1/consumer-groups/g".into(), DEFAULT, None).await;
    assert_eq!((status, &deleted["deletedPartitions"]), (200, &json!(1)), "{deleted}");
    let (_, after) = call("GET", "/api/v1/consumer-groups/g".into(), OTHER, None).await;
    assert_eq!(after["orders"]["partitions"].as_array().map(Vec::len), Some(1), "OTHER's cursors stay: {after}");
    assert_eq!(call("GET", "/api/v1/consumer-groups/g".into(), DEFAULT, None).await.1, json!({}));
    let tenants: Vec<(uuid::Uuid, i64)> = b
        .sql()
        .await
        .query("SELECT tenant_id, count(*) FROM queen.queues GROUP BY 1 ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let t = |s: &str| uuid::Uuid::parse_str(s).unwrap();
    // The third tenant deleted its `orders`; its pop made its own (empty)
    // `only-other`, as a pop does.
    assert_eq!(tenants, vec![(t(DEFAULT), 1), (t(third), 1), (t(OTHER), 2)], "each queue carries its tenant");
}

/// Transactions in two tenants with the same names: each bundle pushes to
/// its own tenant's queues and acks its own messages; another tenant's
/// partition id (with its lease) rolls the bundle back with the very text
/// an unknown partition gets, and changes nothing.
#[tokio::test]
async fn transactions_are_per_tenant() {
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    let call = |method: &'static str, path: &str, tenant: &'static str, body: Option<Value>| as_tenant(&b, method, path.into(), tenant, body);
    let mut popped = Vec::new();
    for tenant in [DEFAULT, OTHER] {
        let (status, _) = call("POST", "/api/v1/push", tenant, Some(json!({"items": [{"queue": "in", "partition": "p", "payload": {"t": tenant}}]}))).await;
        assert_eq!(status, 201);
        let (_, pop) = call("GET", "/api/v1/pop/queue/in?batch=1&consumerGroup=g", tenant, None).await;
        let m = &pop["messages"][0];
        popped.push((m["transactionId"].as_str().unwrap().to_string(), m["partitionId"].as_str().unwrap().to_string(),
                     pop["leaseId"].as_str().unwrap().to_string()));
    }
    let bundle = |(txn, pid, lease): &(String, String, String), out: &str| {
        json!({"operations": [
            {"type": "ack", "transactionId": txn, "partitionId": pid, "leaseId": lease, "consumerGroup": "g", "status": "completed"},
            {"type": "push", "items": [{"queue": "out", "partition": "p", "payload": {"to": out}}]}]})
    };
    // DEFAULT acks OTHER's message with OTHER's lease: rolled back exactly
    // as an ack of a partition no one has.
    let (s1, foreign) = call("POST", "/api/v1/transaction", DEFAULT, Some(bundle(&popped[1], "x"))).await;
    let unknown_pid = (popped[1].0.clone(), "987654321".to_string(), popped[1].2.clone());
    let (s2, unknown) = call("POST", "/api/v1/transaction", DEFAULT, Some(bundle(&unknown_pid, "x"))).await;
    assert_eq!((s1, &foreign["success"]), (200, &json!(false)), "{foreign}");
    let text = |v: &Value, pid: &str| v["error"].as_str().unwrap().replace(&format!("on partition {pid} "), "on partition <pid> ");
    assert_eq!(text(&foreign, &popped[1].1), text(&unknown, "987654321"), "foreign and unknown read alike");
    assert_eq!(s2, 200);
    assert!(foreign["error"].as_str().unwrap().contains(&format!("on partition {} ", popped[1].1)), "names the partition as given: {foreign}");
    assert_eq!(call("GET", "/api/v1/resources/queues/out", DEFAULT, None).await.0, 404, "the rolled-back push wrote nothing");
    // Each tenant's own bundle commits, in its own queues.
    for (i, tenant) in [DEFAULT, OTHER].into_iter().enumerate() {
        let (status, done) = call("POST", "/api/v1/transaction", tenant, Some(bundle(&popped[i], tenant))).await;
        assert_eq!((status, &done["success"]), (200, &json!(true)), "{done}");
        assert_eq!(done["results"][1]["queueName"], "out", "shown without its tenant's prefix: {done}");
    }
    for tenant in [DEFAULT, OTHER] {
        let (_, out) = call("GET", "/api/v1/pop/queue/out?batch=10&autoAck=true", tenant, None).await;
        let got: Vec<&Value> = out["messages"].as_array().unwrap().iter().map(|m| &m["data"]["to"]).collect();
        assert_eq!(got, vec![&json!(tenant)], "{tenant} reads its own push only");
        let (_, depth) = call("GET", "/api/v1/resources/queues/in", tenant, None).await;
        assert_eq!(depth["messages"].as_i64(), Some(1), "{depth}");
        let (status, again) = call("GET", "/api/v1/pop/queue/in?batch=1&consumerGroup=g&wait=false", tenant, None).await;
        assert_eq!(status, 204, "{tenant}: its message acked by its own bundle: {again}");
    }
}

/// KV and locks in two tenants with the same namespaces, keys and lock
/// names: each reads, lists and writes its own; another tenant's version,
/// lock token and guard act as ones that do not exist.
#[tokio::test]
async fn kv_and_locks_are_per_tenant() {
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    let call = |method: &'static str, path: &str, tenant: &'static str, body: Option<Value>| as_tenant(&b, method, path.into(), tenant, body);
    let mut versions = Vec::new();
    for tenant in [DEFAULT, OTHER] {
        let (status, put) = call("PUT", "/api/v1/kv/app/k", tenant, Some(json!({"value": {"t": tenant}, "forever": true}))).await;
        assert_eq!((status, &put["applied"]), (200, &json!(true)), "{put}");
        versions.push(put["version"].as_i64().unwrap());
    }
    call("PUT", "/api/v1/kv/only-other/x", OTHER, Some(json!({"value": 1, "forever": true}))).await;
    for tenant in [DEFAULT, OTHER] {
        let (status, got) = call("GET", "/api/v1/kv/app/k", tenant, None).await;
        assert_eq!((status, &got["value"]["t"]), (200, &json!(tenant)), "{got}");
        let (_, page) = call("POST", "/api/v1/kv", tenant, Some(json!({"operations": [{"op": "getPrefix", "ns": "app", "prefix": "k"}]}))).await;
        assert_eq!(page["results"][0]["rows"].as_array().map(Vec::len), Some(1), "{page}");
        let (_, listed) = call("POST", "/api/v1/resources/kv/list", tenant, Some(json!({"ns": "app"}))).await;
        assert_eq!((&listed["ns"], listed["keys"].as_array().map(Vec::len)), (&json!("app"), Some(1)), "{listed}");
        let (_, spaces) = call("GET", "/api/v1/resources/kv/namespaces", tenant, None).await;
        let names: Vec<&str> = spaces["namespaces"].as_array().unwrap().iter().map(|n| n["ns"].as_str().unwrap()).collect();
        assert_eq!(names, if tenant == OTHER { vec!["app", "only-other"] } else { vec!["app"] }, "{spaces}");
    }
    assert_eq!(call("GET", "/api/v1/kv/only-other/x", DEFAULT, None).await.0, 404);
    // Deleting with the other tenant's version deletes nothing of it.
    let (_, del) = call("DELETE", &format!("/api/v1/kv/app/k?expect={}", versions[1]), DEFAULT, None).await;
    assert_eq!(del["applied"], false, "{del}");
    assert_eq!(call("GET", "/api/v1/kv/app/k", OTHER, None).await.1["value"]["t"], OTHER);
    // Locks: one name, two tenants, two locks.
    let lock = |op: Value| json!({"operations": [op]});
    let mut held = Vec::new();
    for tenant in [DEFAULT, OTHER] {
        let (_, got) = call("POST", "/api/v1/locks", tenant, Some(lock(json!({"op": "acquire", "name": "L", "ttlSeconds": 60})))).await;
        assert_eq!(got["results"][0]["acquired"], true, "{tenant}: {got}");
        held.push(got["results"][0].clone());
    }
    let other = &held[1];
    let (_, renew) = call("POST", "/api/v1/locks", DEFAULT, Some(lock(json!({"op": "renew", "name": "L", "token": other["token"], "ttlSeconds": 60})))).await;
    assert_eq!(renew["results"][0]["renewed"], false, "{renew}");
    let (_, release) = call("POST", "/api/v1/locks", DEFAULT, Some(lock(json!({"op": "release", "name": "L", "token": other["token"]})))).await;
    assert_eq!(release["results"][0]["released"], false, "{release}");
    let (_, get) = call("POST", "/api/v1/locks", OTHER, Some(lock(json!({"op": "get", "name": "L"})))).await;
    assert_eq!(get["results"][0]["holders"].as_array().map(Vec::len), Some(1), "still held by OTHER: {get}");
    // Its guard holds in its own transaction and nowhere else.
    let guarded = |out: &str| json!({"operations": [{"type": "push", "items": [{"queue": "guarded", "payload": {"by": out}}]}], "kv": [other["guard"]]});
    let (_, refused) = call("POST", "/api/v1/transaction", DEFAULT, Some(guarded("default"))).await;
    assert_eq!((&refused["success"], &refused["reason"]), (&json!(false), &json!("kv_precondition")), "{refused}");
    assert_eq!(refused["version"], Value::Null, "no token shown: {refused}");
    let (_, done) = call("POST", "/api/v1/transaction", OTHER, Some(guarded("other"))).await;
    assert_eq!(done["success"], true, "{done}");
    // A transaction's kv rider writes the tenant's own key.
    let rider = json!({"operations": [], "kv": [{"op": "put", "ns": "app", "key": "rider", "value": 7, "forever": true}]});
    assert_eq!(call("POST", "/api/v1/transaction", OTHER, Some(rider)).await.1["success"], true);
    assert_eq!(call("GET", "/api/v1/kv/app/rider", OTHER, None).await.1["value"], 7);
    assert_eq!(call("GET", "/api/v1/kv/app/rider", DEFAULT, None).await.0, 404);
    // Direct KV access to the locks' namespace stays refused for every tenant.
    let (status, _) = call("GET", "/api/v1/kv/queen-locks/L%230", OTHER, None).await;
    assert_eq!(status, 403);
}

/// Timers in two tenants on one queue name and one key: each schedules,
/// lists, peeks and cancels its own, and a fired timer is a message of its
/// own tenant's queue; a transaction's timers rider too.
#[tokio::test]
async fn timers_are_per_tenant() {
    use base64::Engine as _;
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    let call = |method: &'static str, path: &str, tenant: &'static str, body: Option<Value>| as_tenant(&b, method, path.into(), tenant, body);
    let schedule = |key: &str, tenant: &str, delay: i64| {
        let payload = base64::engine::general_purpose::STANDARD.encode(json!({"t": tenant}).to_string());
        json!({"op": "schedule", "queue": "tq", "timerKey": key, "payload": payload, "delayMs": delay})
    };
    for tenant in [DEFAULT, OTHER] {
        let (status, r) = call("POST", "/api/v1/timers", tenant, Some(json!({"operations": [schedule("soon", tenant, 300), schedule("late", tenant, 3_600_000)]}))).await;
        assert_eq!((status, &r["results"][0]["status"], &r["results"][0]["queue"]), (200, &json!("scheduled"), &json!("tq")), "{r}");
    }
    let rider = json!({"operations": [], "timers": [schedule("rider", OTHER, 3_600_000)]});
    let (_, done) = call("POST", "/api/v1/transaction", OTHER, Some(rider)).await;
    assert_eq!(done["success"], true, "{done}");
    // DEFAULT cancels its own `late`: OTHER's stays.
    let (_, cancel) = call("DELETE", "/api/v1/timers/tq/late", DEFAULT, None).await;
    assert_eq!((&cancel["ok"], &cancel["queue"]), (&json!(true), &json!("tq")), "{cancel}");
    assert_eq!(call("GET", "/api/v1/timers/tq/late", DEFAULT, None).await.1["found"], false);
    let (_, peek) = call("GET", "/api/v1/timers/tq/late", OTHER, None).await;
    assert_eq!((&peek["found"], &peek["queue"]), (&json!(true), &json!("tq")), "{peek}");
    assert_eq!(call("GET", "/api/v1/timers/tq/rider", DEFAULT, None).await.1["found"], false);
    let (_, count) = call("GET", "/api/v1/timers/tq?mode=count", OTHER, None).await;
    assert_eq!(count["count"].as_i64(), Some(3), "soon, late and the rider's: {count}");
    // Fired: each tenant's queue holds its own message.
    for tenant in [DEFAULT, OTHER] {
        let mut got = Vec::new();
        for _ in 0..200 {
            let (status, body) = call("GET", "/api/v1/pop/queue/tq?batch=10&autoAck=true&wait=false", tenant, None).await;
            if status == 200 {
                got.extend(body["messages"].as_array().unwrap().iter().map(|m| m["data"]["t"].clone()));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(got, vec![json!(tenant)], "{tenant} gets its own timer's message only");
    }
}

/// Dead letters, messages, traces and the status reads in two tenants with
/// the same queue, partition, transactionIds and trace names: each lists,
/// reads, replays and deletes its own; another tenant's partition id or
/// dead-letter id answers 404 as an unknown one, and changes nothing.
#[tokio::test]
async fn dead_letters_messages_traces_and_status_are_per_tenant() {
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    let call = |method: &'static str, path: String, tenant: &'static str, body: Option<Value>| as_tenant(&b, method, path, tenant, body);
    // In each tenant: `poison` and `other` dead-lettered, `fine` consumed.
    let mut pids = Vec::new();
    for tenant in [DEFAULT, OTHER] {
        let items: Vec<Value> = ["fine", "poison", "other"].iter().map(|t| json!({"queue": "dq", "partition": "p", "transactionId": t, "payload": {"t": tenant}})).collect();
        assert_eq!(call("POST", "/api/v1/push".into(), tenant, Some(json!({"items": items}))).await.0, 201);
        let mut pid = String::new();
        for _ in 0..3 {
            let (_, pop) = call("GET", "/api/v1/pop/queue/dq?batch=1&consumerGroup=g".into(), tenant, None).await;
            let m = &pop["messages"][0];
            pid = m["partitionId"].as_str().unwrap().to_string();
            let status = if m["transactionId"] == "fine" { "completed" } else { "dlq" };
            let ack = json!({"transactionId": m["transactionId"], "partitionId": pid, "status": status, "error": "bad", "consumerGroup": "g", "leaseId": pop["leaseId"]});
            let (_, acked) = call("POST", "/api/v1/ack".into(), tenant, Some(ack)).await;
            assert_eq!(acked[0]["success"], true, "{acked}");
        }
        let trace = json!({"transactionId": "fine", "partitionId": pid, "traceNames": ["order-1"], "data": {"t": tenant}});
        assert_eq!(call("POST", "/api/v1/traces".into(), tenant, Some(trace)).await.0, 200);
        pids.push(pid);
    }
    let (default_pid, other_pid) = (pids[0].clone(), pids[1].clone());
    for (tenant, pid) in [(DEFAULT, &default_pid), (OTHER, &other_pid)] {
        let (_, dlq) = call("GET", "/api/v1/dlq?queue=dq".into(), tenant, None).await;
        assert_eq!(dlq["total"], 2, "{tenant}: {dlq}");
        assert!(dlq["messages"].as_array().unwrap().iter().all(|m| m["queue"] == "dq" && m["data"]["t"] == tenant), "{dlq}");
        let (_, listed) = call("GET", "/api/v1/messages?queue=dq".into(), tenant, None).await;
        assert_eq!(listed["total"], 3, "{listed}");
        assert!(listed["messages"].as_array().unwrap().iter().all(|m| m["queue"] == "dq" && m["data"]["t"] == tenant), "{listed}");
        let (_, all) = call("GET", "/api/v1/messages".into(), tenant, None).await;
        assert_eq!(all["total"], 3, "no other tenant's messages without a queue filter: {all}");
        let (status, one) = call("GET", format!("/api/v1/messages/{pid}/fine"), tenant, None).await;
        assert_eq!((status, &one["queue"]), (200, &json!("dq")), "{one}");
        let (_, traces) = call("GET", format!("/api/v1/traces/{pid}/fine"), tenant, None).await;
        assert_eq!((traces["count"].as_i64(), &traces["queue"]), (Some(1), &json!("dq")), "{traces}");
        let (_, named) = call("GET", "/api/v1/traces/by-name/order-1".into(), tenant, None).await;
        assert_eq!(named["traces"].as_array().map(Vec::len), Some(1), "{named}");
        assert_eq!((&named["traceName"], &named["traces"][0]["data"]["t"], &named["traces"][0]["traceNames"]), (&json!("order-1"), &json!(tenant), &json!(["order-1"])));
        let (_, names) = call("GET", "/api/v1/traces/names?search=order".into(), tenant, None).await;
        assert_eq!((&names["total"], &names["names"][0]["name"]), (&json!(1), &json!("order-1")), "{names}");
        let (_, queues) = call("GET", "/api/v1/status/queues".into(), tenant, None).await;
        assert_eq!((&queues["total"], &queues["queues"][0]["name"]), (&json!(1), &json!("dq")), "{queues}");
        let (_, overview) = call("GET", "/api/v1/resources/overview".into(), tenant, None).await;
        assert_eq!((&overview["queues"], &overview["deadLetters"]), (&json!(1), &json!(2)), "{overview}");
        let (_, lag) = call("GET", "/api/v1/analytics/queue-lag".into(), tenant, None).await;
        assert!(lag.to_string().contains("\"dq\"") && !lag.to_string().contains("\\u0001"), "{lag}");
    }
    // Another tenant's partition id: as unknown.
    let foreign = other_pid.clone();
    assert_eq!(call("GET", format!("/api/v1/messages/{foreign}/fine"), DEFAULT, None).await.0, 404);
    assert_eq!(call("GET", format!("/api/v1/traces/{foreign}/fine"), DEFAULT, None).await.0, 404);
    let (s1, t1) = call("POST", "/api/v1/traces".into(), DEFAULT, Some(json!({"transactionId": "fine", "partitionId": foreign, "data": 1}))).await;
    let (s2, t2) = call("POST", "/api/v1/traces".into(), DEFAULT, Some(json!({"transactionId": "fine", "partitionId": "987654321", "data": 1}))).await;
    assert_eq!((s1, s2), (404, 404), "{t1} {t2}");
    assert_eq!(call("POST", format!("/api/v1/messages/{foreign}/poison/retry"), DEFAULT, Some(json!({}))).await.0, 404);
    assert_eq!(call("DELETE", format!("/api/v1/messages/{foreign}/other"), DEFAULT, None).await.0, 404);
    let (_, other_dlq) = call("GET", "/api/v1/dlq?queue=dq".into(), OTHER, None).await;
    let other_id = other_dlq["messages"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(call("POST", format!("/api/v1/dlq/{other_id}/replay"), DEFAULT, Some(json!({}))).await.0, 404);
    assert_eq!(call("GET", "/api/v1/dlq?queue=dq".into(), OTHER, None).await.1["total"], 2, "nothing of OTHER's changed");
    // Each replays and deletes its own; a purge takes only the caller's.
    let (status, replayed) = call("POST", format!("/api/v1/messages/{other_pid}/poison/retry"), OTHER, Some(json!({}))).await;
    assert_eq!((status, &replayed["queue"], &replayed["replayedAs"]["queueName"]), (200, &json!("dq"), &json!("dq")), "{replayed}");
    assert_eq!(call("DELETE", format!("/api/v1/messages/{other_pid}/other"), OTHER, None).await.0, 200);
    assert_eq!(call("GET", "/api/v1/dlq?queue=dq".into(), OTHER, None).await.1["total"], 0);
    let (_, purged) = call("DELETE", "/api/v1/dlq?queue=dq".into(), DEFAULT, None).await;
    assert_eq!((&purged["deleted"], &purged["queue"]), (&json!(2), &json!("dq")), "{purged}");
    let (_, again) = call("GET", "/api/v1/pop/queue/dq?batch=10&consumerGroup=g&wait=false".into(), OTHER, None).await;
    assert_eq!(again["messages"][0]["data"]["t"], OTHER, "the replay went to OTHER's queue: {again}");
}

/// A pop by namespace claims from the caller's tenant's queues only, though
/// both tenants label theirs alike; the label roll-ups count only the
/// caller's.
#[tokio::test]
async fn discovery_pops_are_per_tenant() {
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    let call = |method: &'static str, path: &str, tenant: &'static str, body: Option<Value>| as_tenant(&b, method, path.into(), tenant, body);
    for tenant in [DEFAULT, OTHER] {
        for q in ["a", "b"] {
            let (status, _) = call("POST", "/api/v1/configure", tenant, Some(json!({"queue": q, "namespace": "billing", "options": {}}))).await;
            assert_eq!(status, 200);
            let items: Vec<Value> = (0..3).map(|i| json!({"queue": q, "partition": format!("p{i}"), "payload": {"t": tenant}})).collect();
            assert_eq!(call("POST", "/api/v1/push", tenant, Some(json!({"items": items}))).await.0, 201);
        }
    }
    for tenant in [DEFAULT, OTHER] {
        let mut got = 0;
        for _ in 0..10 {
            let (status, body) = call("GET", "/api/v1/pop?namespace=billing&batch=100&autoAck=true&wait=false", tenant, None).await;
            if status == 204 {
                break;
            }
            let msgs = body["messages"].as_array().unwrap();
            assert!(msgs.iter().all(|m| m["data"]["t"] == tenant), "{tenant}: {body}");
            assert!(!body.to_string().contains("\\u0001"), "{body}");
            got += msgs.len();
        }
        assert_eq!(got, 6, "{tenant} drains its own six");
        let (_, labels) = call("GET", "/api/v1/resources/namespaces", tenant, None).await;
        assert_eq!(labels["namespaces"][0]["queues"], 2, "{labels}");
        assert_eq!(labels["namespaces"][0]["queueNames"], json!(["a", "b"]), "{labels}");
    }
}

/// Streams and ephemeral queues in two tenants with one query name and one
/// queue name: each registers, cycles, reads state and pops its own;
/// another tenant's query id or partition id answers as an unknown one.
#[tokio::test]
async fn streams_and_ephemeral_queues_are_per_tenant() {
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    let call = |method: &'static str, path: &str, tenant: &'static str, body: Option<Value>| as_tenant(&b, method, path.into(), tenant, body);
    let mut runs = Vec::new();
    for tenant in [DEFAULT, OTHER] {
        let reg = json!({"name": "totals", "source_queue": "src", "sink_queue": "sink", "config_hash": tenant});
        let (status, r) = call("POST", "/streams/v1/queries", tenant, Some(reg)).await;
        assert_eq!((status, &r["fresh"], &r["name"]), (200, &json!(true), &json!("totals")), "a name of its own: {r}");
        call("POST", "/api/v1/push", tenant, Some(json!({"items": [{"queue": "src", "partition": "p", "payload": {"t": tenant}}]}))).await;
        let (_, pop) = call("GET", "/api/v1/pop/queue/src/partition/p?consumerGroup=streams.totals&batch=1&wait=false", tenant, None).await;
        let m = &pop["messages"][0];
        runs.push((r["query_id"].as_str().unwrap().to_string(), m["partitionId"].as_str().unwrap().to_string(),
                   pop["leaseId"].as_str().unwrap().to_string(), m["transactionId"].as_str().unwrap().to_string()));
    }
    assert_ne!(runs[0].0, runs[1].0, "two queries");
    let cycle = |(q, pid, lease, txn): &(String, String, String, String), to: &str| json!({"query_id": q, "partition_id": pid,
        "consumer_group": "streams.totals", "state_ops": [{"type": "upsert", "key": "sum", "value": to}],
        "push_items": [{"queue": "sink", "partition": "p", "payload": {"to": to}}],
        "ack": {"transactionId": txn, "leaseId": lease, "status": "completed", "count": 1}, "release_lease": true});
    // DEFAULT on OTHER's query: unregistered; on its own query with OTHER's
    // partition and lease: refused as on an unknown partition.
    let (_, foreign_query) = call("POST", "/streams/v1/cycle", DEFAULT, Some(cycle(&runs[1], "x"))).await;
    assert_eq!(foreign_query, json!({"success": false, "error": format!("query_id {} is not registered", runs[1].0)}));
    let mixed = (runs[0].0.clone(), runs[1].1.clone(), runs[1].2.clone(), runs[1].3.clone());
    let (_, foreign_pid) = call("POST", "/streams/v1/cycle", DEFAULT, Some(cycle(&mixed, "x"))).await;
    let unknown = (runs[0].0.clone(), "987654321".to_string(), runs[1].2.clone(), runs[1].3.clone());
    let (_, unknown_pid) = call("POST", "/streams/v1/cycle", DEFAULT, Some(cycle(&unknown, "x"))).await;
    assert_eq!(foreign_pid["success"], false, "{foreign_pid}");
    let text = |v: &Value, pid: &str| v["error"].as_str().unwrap().replace(&format!("on partition {pid} "), "on partition <pid> ");
    assert_eq!(text(&foreign_pid, &runs[1].1), text(&unknown_pid, "987654321"));
    let (_, state) = call("POST", "/streams/v1/state/get", DEFAULT, Some(json!({"query_id": runs[1].0, "partition_id": runs[1].1, "keys": []}))).await;
    assert_eq!(state["rows"], json!([]), "{state}");
    // Each cycles its own.
    for (i, tenant) in [DEFAULT, OTHER].into_iter().enumerate() {
        let (_, done) = call("POST", "/streams/v1/cycle", tenant, Some(cycle(&runs[i], tenant))).await;
        assert_eq!((&done["success"], &done["push_results"][0]["queueName"]), (&json!(true), &json!("sink")), "{done}");
        let (_, state) = call("POST", "/streams/v1/state/get", tenant, Some(json!({"query_id": runs[i].0, "partition_id": runs[i].1, "keys": ["sum"]}))).await;
        assert_eq!(state["rows"][0]["value"], tenant, "{state}");
        let (_, sink) = call("GET", "/api/v1/pop/queue/sink?batch=10&autoAck=true&wait=false", tenant, None).await;
        let got: Vec<Value> = sink["messages"].as_array().unwrap().iter().map(|m| m["data"]["to"].clone()).collect();
        assert_eq!(got, vec![json!(tenant)]);
    }
    // Ephemeral: one queue name, two queues.
    for tenant in [DEFAULT, OTHER] {
        let (status, r) = call("POST", "/api/v1/ephemeral/push", tenant, Some(json!({"queue": "live", "messages": [{"payload": {"t": tenant}}]}))).await;
        assert_eq!((status, &r["queue"]), (200, &json!("live")), "{r}");
    }
    call("POST", "/api/v1/ephemeral/push", OTHER, Some(json!({"queue": "only-other", "messages": [{"payload": 1}]}))).await;
    let (_, listed) = call("GET", "/api/v1/ephemeral/queues", DEFAULT, None).await;
    let names: Vec<&Value> = listed["queues"].as_array().unwrap().iter().map(|q| &q["queue"]).collect();
    assert_eq!(names, vec![&json!("live")], "{listed}");
    assert_eq!(call("GET", "/api/v1/ephemeral/queues/only-other/depth", DEFAULT, None).await.0, 404);
    let (_, depth) = call("GET", "/api/v1/ephemeral/queues/only-other/depth", OTHER, None).await;
    assert_eq!((&depth["queue"], &depth["depth"]), (&json!("only-other"), &json!(1)), "{depth}");
    let (_, popped) = call("GET", "/api/v1/ephemeral/pop?queue=live&batch=10", OTHER, None).await;
    let msgs = popped["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 1, "{popped}");
    assert_eq!(msgs[0]["payload"]["t"], OTHER);
    let id = msgs[0]["id"].as_str().unwrap();
    let (_, foreign_ack) = call("POST", "/api/v1/ephemeral/ack", DEFAULT, Some(json!({"queue": "live", "acks": [{"id": id}]}))).await;
    // A made-up id of the same shape: what an id no delivery of the caller's queue has answers.
    let made_up = format!("{}.999999", id.rsplit_once('.').unwrap().0);
    let (_, unknown_ack) = call("POST", "/api/v1/ephemeral/ack", DEFAULT, Some(json!({"queue": "live", "acks": [{"id": made_up}]}))).await;
    assert_eq!(foreign_ack["results"][0]["outcome"], unknown_ack["results"][0]["outcome"], "{foreign_ack} {unknown_ack}");
    let (_, own_ack) = call("POST", "/api/v1/ephemeral/ack", OTHER, Some(json!({"queue": "live", "acks": [{"id": id}]}))).await;
    assert_ne!(own_ack["results"][0]["outcome"], foreign_ack["results"][0]["outcome"], "{own_ack}");
    let (_, mine) = call("GET", "/api/v1/ephemeral/pop?queue=live&batch=10&autoAck=true", DEFAULT, None).await;
    assert_eq!(mine["messages"][0]["payload"]["t"], DEFAULT, "{mine}");
}

/// A database of the schema before 0039, holding a queue with messages,
/// upgraded by a broker's boot: the queue and its messages belong to the
/// default tenant, which keeps serving them, and no other tenant sees them.
#[tokio::test]
async fn the_upgrade_gives_existing_queues_to_the_default_tenant() {
    let c = cluster();
    let db = c.create_db().await;
    let sql = c.connect(&db).await;
    sql.batch_execute(
        "CREATE SCHEMA queen; CREATE TABLE queen.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
         applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await
    .unwrap();
    for m in queen::db::migrations::MIGRATIONS.iter().filter(|m| m.version < 39) {
        sql.batch_execute(m.sql).await.unwrap();
        sql.execute("INSERT INTO queen.schema_migrations (version, name) VALUES ($1, $2)", &[&m.version, &m.name]).await.unwrap();
    }
    // Data written by the previous schema: a queue, a partition, a segment.
    let old = Broker::spawn(db.clone(), vec![
        ("QUEEN_DATABASE_URL".into(), c.url(&db)),
        ("QUEEN_APPLY_SCHEMA".into(), "false".into()),
    ])
    .await;
    let (status, _) = old.post("/api/v1/push", json!({"items": [{"queue": "legacy", "partition": "p", "payload": {"n": 1}}]})).await;
    assert_eq!(status, 201);
    drop(old);
    let b = Broker::spawn(db.clone(), vec![
        ("QUEEN_DATABASE_URL".into(), c.url(&db)),
        ("QUEEN_TENANCY_HEADER".into(), "true".into()),
        ("QUEEN_TRUSTED_PROXY".into(), "true".into()),
    ])
    .await;
    let tenant: uuid::Uuid = b.sql().await.query_one("SELECT tenant_id FROM queen.queues WHERE name = 'legacy'", &[]).await.unwrap().get(0);
    assert_eq!(tenant.to_string(), DEFAULT);
    assert_eq!(send(&b, "GET", "/api/v1/resources/queues/legacy", Some(OTHER), None).await.0, 404);
    let r = b.http.get(format!("{}/api/v1/pop/queue/legacy?batch=5&autoAck=true", b.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["messages"][0]["data"], json!({"n": 1}));
}
