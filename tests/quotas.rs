//! Quotas per tenant (issue 49, `tenancy::quota`): each limit refuses what
//! passes it with its code (429 `rate_limited` with `Retry-After`, 403
//! `quota_exceeded` naming the limit), takes nothing from a refused
//! request, and leaves the other tenants alone; who may set them; the
//! share of a rate across brokers; the tenant purge.

mod common;

use std::time::Duration;

use common::{cluster, Broker};
use serde_json::{json, Value};

const OTHER: &str = "6f1c2a34-0000-4000-8000-00000000abcd";
const DEFAULT: &str = "00000000-0000-0000-0000-000000000001";

/// A broker with tenancy by header, its admins acting across tenants, and
/// quotas sampled every 200 ms.
async fn broker(extra: &[(&str, &str)]) -> Broker {
    let mut env = vec![("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true"), ("QUEEN_TENANCY_ADMIN_ALL", "true"), ("QUEEN_QUOTA_SAMPLE_MS", "200")];
    env.extend_from_slice(extra);
    Broker::start_with(&env).await
}

/// `method path` as `tenant`: status, `Retry-After`, JSON answer.
async fn call(b: &Broker, method: &str, path: &str, tenant: &str, body: Option<Value>) -> (u16, Option<String>, Value) {
    let url = format!("{}{}", b.url, path);
    let req = match method {
        "GET" => b.http.get(url),
        "DELETE" => b.http.delete(url),
        _ => b.http.post(url).json(&body.unwrap_or(Value::Null)),
    };
    let r = req.header("x-queen-tenant", tenant).send().await.unwrap();
    let status = r.status().as_u16();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

async fn push(b: &Broker, tenant: &str, queue: &str, n: usize, payload: Value) -> (u16, Option<String>, Value) {
    let items: Vec<Value> = (0..n).map(|_| json!({"queue": queue, "payload": payload})).collect();
    call(b, "POST", "/api/v1/push", tenant, Some(json!({"items": items}))).await
}

async fn set(b: &Broker, tenant: &str, body: Value) -> Value {
    let mut body = body;
    body["tenant"] = json!(tenant);
    let (status, _, answer) = call(b, "POST", "/api/v1/resources/quota", DEFAULT, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

async fn stored(b: &Broker, tenant: &str) -> i64 {
    let sql = "SELECT COALESCE(sum(p.last_offset + 1 - p.log_start), 0)::bigint FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.tenant_id = $1::text::uuid";
    b.sql().await.query_one(sql, &[&tenant]).await.unwrap().get(0)
}

#[tokio::test]
async fn push_rates_stored_bytes_and_queue_counts_refuse_with_their_codes_and_take_nothing() {
    let b = broker(&[]).await;
    let set_answer = set(&b, OTHER, json!({"kind": "queues", "maxMessagesPerSecond": 10, "max_queues": 2})).await;
    assert_eq!((&set_answer["maxQueues"], &set_answer["effective"]["maxMessagesPerSecond"]), (&json!(2), &json!(10)), "{set_answer}");
    // One second's worth passes, the next message waits.
    assert_eq!(push(&b, OTHER, "a", 10, json!(1)).await.0, 201);
    let (status, retry, refused) = push(&b, OTHER, "a", 1, json!(1)).await;
    assert_eq!((status, &refused["code"], &refused["limit"]), (429, &json!("rate_limited"), &json!("pushMessagesPerSecond")), "{refused}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(stored(&b, OTHER).await, 10, "the refused push wrote nothing");
    // Timers are messages to come: scheduled, they spend the same rate.
    let payload = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode("1")
    };
    let timer = json!({"operations": [{"op": "schedule", "queue": "a", "timerKey": "t", "payload": payload, "delayMs": 60_000}]});
    let (status, _, refused) = call(&b, "POST", "/api/v1/timers", OTHER, Some(timer)).await;
    assert_eq!((status, &refused["limit"]), (429, &json!("pushMessagesPerSecond")), "{refused}");
    // Another tenant is not limited by it.
    assert_eq!(push(&b, DEFAULT, "a", 50, json!(1)).await.0, 201);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(push(&b, OTHER, "b", 1, json!(1)).await.0, 201, "refilled");
    // A third queue passes the count: 403 naming it, nothing created.
    let (status, _, refused) = push(&b, OTHER, "c", 1, json!(1)).await;
    assert_eq!((status, &refused["code"], &refused["limit"], &refused["quota"], &refused["usage"]),
               (403, &json!("quota_exceeded"), &json!("queues"), &json!(2), &json!(2)), "{refused}");
    let (status, _, refused) = call(&b, "POST", "/api/v1/configure", OTHER, Some(json!({"queue": "c", "options": {}}))).await;
    assert_eq!((status, &refused["limit"]), (403, &json!("queues")), "configure creates a queue too: {refused}");
    let (_, _, listed) = call(&b, "GET", "/api/v1/resources/queues", OTHER, None).await;
    assert_eq!(listed["total"], 2, "{listed}");
    // Bytes per second.
    set(&b, OTHER, json!({"kind": "queues", "maxBytesPerSecond": 100})).await;
    let big = json!("x".repeat(60));
    assert_eq!(push(&b, OTHER, "a", 1, big.clone()).await.0, 201, "the message rate is back to unlimited: the row replaced it");
    let (status, _, refused) = push(&b, OTHER, "a", 1, big).await;
    assert_eq!((status, &refused["limit"]), (429, &json!("pushBytesPerSecond")), "{refused}");
    // Stored bytes, as sampled.
    set(&b, OTHER, json!({"kind": "queues", "maxStoredBytes": 1})).await;
    let mut refused = Value::Null;
    for _ in 0..50 {
        let (status, _, answer) = push(&b, OTHER, "a", 1, json!(1)).await;
        if status == 403 {
            refused = answer;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((&refused["code"], &refused["limit"], &refused["quota"]), (&json!("quota_exceeded"), &json!("storedBytes"), &json!(1)), "{refused}");
    assert!(refused["usage"].as_i64().unwrap() > 1, "{refused}");
    // A transaction's pushes pass the same gate.
    let (status, _, txn) = call(&b, "POST", "/api/v1/transaction", OTHER, Some(json!({"operations": [{"type": "push", "items": [{"queue": "a", "payload": 1}]}]}))).await;
    assert_eq!((status, &txn["limit"]), (403, &json!("storedBytes")), "{txn}");
    // `enabled: false` refuses the kind.
    set(&b, OTHER, json!({"kind": "queues", "enabled": false})).await;
    let (status, _, refused) = push(&b, OTHER, "a", 1, json!(1)).await;
    assert_eq!((status, &refused["limit"]), (403, &json!("queues.enabled")), "{refused}");
    assert_eq!(push(&b, DEFAULT, "a", 1, json!(1)).await.0, 201);
    // The read route shows what is in force and the usage.
    let (status, _, q) = call(&b, "GET", &format!("/api/v1/resources/quota?tenant={OTHER}"), DEFAULT, None).await;
    assert_eq!(status, 200, "{q}");
    assert_eq!((&q["quotas"]["queues"]["enabled"], &q["quotas"]["queues"]["configured"], &q["quotas"]["kv"]["configured"]),
               (&json!(false), &json!(true), &json!(false)), "{q}");
    assert_eq!(q["usage"]["queues"], 2, "{q}");
    assert!(q["usage"]["storedBytes"].as_i64().unwrap() > 0, "{q}");
    // Bad input: 400 naming the field, nothing stored.
    for (bad, field) in [(json!({"kind": "nope"}), "kind"), (json!({"kind": "kv", "maxQueues": 1}), "maxQueues"),
                         (json!({"kind": "kv", "maxReadsPerSecond": -1}), "maxReadsPerSecond"), (json!({"kind": "kv", "tenant": "x"}), "tenant")] {
        let (status, _, e) = call(&b, "POST", "/api/v1/resources/quota", DEFAULT, Some(bad)).await;
        assert_eq!(status, 400, "{e}");
        assert!(e["error"].as_str().unwrap().starts_with(field), "{e}");
    }
    let (_, _, tenants) = call(&b, "GET", "/api/v1/resources/tenants", DEFAULT, None).await;
    let other = tenants["tenants"].as_array().unwrap().iter().find(|t| t["tenant"] == OTHER).expect("listed");
    assert_eq!((&other["queues"], &other["quotas"]), (&json!(2), &json!(["queues"])), "{tenants}");
}

#[tokio::test]
async fn kv_and_ephemeral_limits_refuse_with_their_codes() {
    let b = broker(&[("QUEEN_QUOTA_KV_WRITES_PER_SECOND", "3")]).await;
    // The configured default applies to every tenant without a row of its own.
    for tenant in [DEFAULT, OTHER] {
        let ops: Vec<Value> = (0..3).map(|i| json!({"op": "put", "ns": "app", "key": format!("k{i}"), "value": i, "forever": true})).collect();
        assert_eq!(call(&b, "POST", "/api/v1/kv", tenant, Some(json!({"operations": ops}))).await.0, 200);
        let (status, retry, refused) = call(&b, "POST", "/api/v1/kv", tenant, Some(json!({"operations": [{"op": "put", "ns": "app", "key": "z", "value": 1, "forever": true}]}))).await;
        assert_eq!((status, &refused["limit"]), (429, &json!("kvWritesPerSecond")), "{refused}");
        assert!(retry.is_some());
        assert_eq!(call(&b, "GET", "/api/v1/kv/app/k0", tenant, None).await.0, 200, "reads have their own limit");
    }
    assert_eq!(call(&b, "GET", "/api/v1/kv/app/z", OTHER, None).await.0, 404, "the refused write wrote nothing");
    set(&b, OTHER, json!({"kind": "kv", "maxReadsPerSecond": 2, "maxWritesPerSecond": null})).await;
    for _ in 0..2 {
        assert_eq!(call(&b, "GET", "/api/v1/kv/app/k0", OTHER, None).await.0, 200);
    }
    let (status, _, refused) = call(&b, "GET", "/api/v1/kv/app/k0", OTHER, None).await;
    assert_eq!((status, &refused["limit"]), (429, &json!("kvReadsPerSecond")), "{refused}");
    let (status, _, _) = call(&b, "POST", "/api/v1/locks", OTHER, Some(json!({"operations": [{"op": "acquire", "name": "L", "ttlSeconds": 5}]}))).await;
    assert_eq!(status, 200, "writes are unlimited for OTHER now (null), and a lock is a write");
    // Ephemeral: messages per second and memory.
    set(&b, OTHER, json!({"kind": "ephemeral", "maxMessagesPerSecond": 3, "maxBytes": 1000})).await;
    let msgs = |n: usize, size: usize| json!({"queue": "live", "messages": (0..n).map(|_| json!({"payload": "y".repeat(size)})).collect::<Vec<_>>()});
    assert_eq!(call(&b, "POST", "/api/v1/ephemeral/push", OTHER, Some(msgs(3, 10))).await.0, 200);
    let (status, _, refused) = call(&b, "POST", "/api/v1/ephemeral/push", OTHER, Some(msgs(1, 10))).await;
    assert_eq!((status, &refused["limit"]), (429, &json!("ephemeralMessagesPerSecond")), "{refused}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _, refused) = call(&b, "POST", "/api/v1/ephemeral/push", OTHER, Some(msgs(1, 2000))).await;
    assert_eq!((status, &refused["code"], &refused["limit"]), (403, &json!("quota_exceeded"), &json!("ephemeralBytes")), "{refused}");
    let (_, _, depth) = call(&b, "GET", "/api/v1/ephemeral/queues/live/depth", OTHER, None).await;
    assert_eq!(depth["depth"], 3, "{depth}");
    assert_eq!(call(&b, "POST", "/api/v1/ephemeral/push", DEFAULT, Some(msgs(5, 10))).await.0, 200);
}

/// Only an admin across tenants sets quotas, lists tenants or purges
/// another tenant; a tenant reads its own quotas.
#[tokio::test]
async fn without_an_admin_across_tenants_quotas_and_tenants_are_refused() {
    let b = Broker::start_with(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).await;
    let (status, _, e) = call(&b, "POST", "/api/v1/resources/quota", OTHER, Some(json!({"kind": "kv", "maxReadsPerSecond": 1000000}))).await;
    assert_eq!((status, &e["code"]), (403, &json!("tenant_forbidden")), "a tenant does not raise its own limits: {e}");
    assert_eq!(call(&b, "GET", "/api/v1/resources/tenants", DEFAULT, None).await.0, 403);
    assert_eq!(call(&b, "GET", &format!("/api/v1/resources/quota?tenant={OTHER}"), DEFAULT, None).await.0, 403);
    assert_eq!(call(&b, "DELETE", &format!("/api/v1/resources/tenant?tenant={OTHER}"), DEFAULT, None).await.0, 403);
    let (status, _, own) = call(&b, "GET", "/api/v1/resources/quota", OTHER, None).await;
    assert_eq!((status, &own["tenant"]), (200, &json!(OTHER)), "{own}");
    let rows: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.tenant_quotas", &[]).await.unwrap().get(0);
    assert_eq!(rows, 0);
}

/// A rate is the tenant's across the brokers: each of two brokers admits
/// half of it.
#[tokio::test]
async fn two_brokers_share_a_rate() {
    let db = cluster().create_db().await;
    let env = |extra: &[(&str, &str)]| {
        let mut all = vec![("QUEEN_DATABASE_URL".to_string(), cluster().url(&db))];
        for (k, v) in [("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true"), ("QUEEN_TENANCY_ADMIN_ALL", "true"), ("QUEEN_QUOTA_SAMPLE_MS", "200")]
            .iter()
            .chain(extra)
        {
            all.push((k.to_string(), v.to_string()));
        }
        all
    };
    let a = Broker::spawn(db.clone(), env(&[])).await;
    let b = Broker::spawn(db.clone(), env(&[])).await;
    set(&a, OTHER, json!({"kind": "queues", "maxMessagesPerSecond": 20})).await;
    // Both brokers have counted two live brokers and read the row.
    for x in [&a, &b] {
        let mut brokers = Value::Null;
        for _ in 0..50 {
            let (_, _, q) = call(x, "GET", "/api/v1/resources/quota", OTHER, None).await;
            brokers = q["usage"]["brokers"].clone();
            if brokers == 2 && q["quotas"]["queues"]["maxMessagesPerSecond"] == 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(brokers, 2);
    }
    for x in [&a, &b] {
        assert_eq!(push(x, OTHER, "q", 10, json!(1)).await.0, 201, "half the rate on each");
        assert_eq!(push(x, OTHER, "q", 1, json!(1)).await.0, 429);
    }
}

/// The purge removes everything a tenant holds and nothing of another's;
/// the default tenant is refused.
#[tokio::test]
async fn a_tenant_purge_removes_its_data_only() {
    use base64::Engine as _;
    let b = broker(&[]).await;
    for tenant in [DEFAULT, OTHER] {
        assert_eq!(push(&b, tenant, "orders", 3, json!({"t": tenant})).await.0, 201);
        assert_eq!(call(&b, "POST", "/api/v1/kv", tenant, Some(json!([{"op": "put", "ns": "app", "key": "k", "value": 1, "forever": true}]))).await.0, 200);
        let payload = base64::engine::general_purpose::STANDARD.encode("1");
        let timer = json!({"operations": [{"op": "schedule", "queue": "orders", "timerKey": "t", "payload": payload, "delayMs": 3_600_000}]});
        assert_eq!(call(&b, "POST", "/api/v1/timers", tenant, Some(timer)).await.0, 200);
        let (_, _, pop) = call(&b, "GET", "/api/v1/pop/queue/orders?batch=1", tenant, None).await;
        let m = &pop["messages"][0];
        let trace = json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "traceNames": ["n"], "data": 1});
        assert_eq!(call(&b, "POST", "/api/v1/traces", tenant, Some(trace)).await.0, 200);
        assert_eq!(call(&b, "POST", "/api/v1/ephemeral/push", tenant, Some(json!({"queue": "live", "messages": [{"payload": 1}]}))).await.0, 200);
    }
    set(&b, OTHER, json!({"kind": "kv", "maxReadsPerSecond": 100})).await;
    // A Kafka producer of each tenant (tests/kafka/test_sasl.py makes them through the listener).
    b.sql()
        .await
        .execute("INSERT INTO queen.kafka_producers (producer_id, epoch, tenant_id) VALUES (1, 0, $1::text::uuid), (2, 0, $2::text::uuid)", &[&DEFAULT, &OTHER])
        .await
        .unwrap();
    let (status, _, e) = call(&b, "DELETE", "/api/v1/resources/tenant", DEFAULT, None).await;
    assert_eq!(status, 400, "{e}");
    let (status, _, purged) = call(&b, "DELETE", &format!("/api/v1/resources/tenant?tenant={OTHER}"), DEFAULT, None).await;
    assert_eq!(status, 200, "{purged}");
    assert_eq!((&purged["done"], &purged["queuesDeleted"], &purged["messagesDeleted"], &purged["kvKeysDeleted"], &purged["timersDeleted"],
                &purged["traceNamesDeleted"], &purged["ephemeralQueuesDeleted"], &purged["kafkaProducersDeleted"]),
               (&json!(true), &json!(1), &json!(3), &json!(1), &json!(1), &json!(1), &json!(1), &json!(1)), "{purged}");
    let sql = b.sql().await;
    let count = |q: &'static str| {
        let sql = &sql;
        async move { sql.query_one(q, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(count("SELECT count(*) FROM queen.queues").await, 1, "the default tenant's queue stays");
    assert_eq!(count("SELECT count(*) FROM queen.kv WHERE ns = 'app'").await, 1);
    assert_eq!(count("SELECT count(*) FROM queen.timers").await, 1);
    assert_eq!(count("SELECT count(*) FROM queen.traces").await, 1);
    assert_eq!(count("SELECT count(*) FROM queen.tenant_quotas").await, 0);
    assert_eq!(count("SELECT count(*) FROM queen.kafka_producers WHERE producer_id = 1").await, 1, "the default tenant's producer stays");
    assert_eq!(count("SELECT count(*) FROM queen.kafka_producers").await, 1);
    assert_eq!(stored(&b, DEFAULT).await, 3);
    let (_, _, listed) = call(&b, "GET", "/api/v1/resources/queues", OTHER, None).await;
    assert_eq!(listed["total"], 0);
    let (_, _, again) = call(&b, "DELETE", &format!("/api/v1/resources/tenant?tenant={OTHER}"), DEFAULT, None).await;
    assert_eq!((&again["done"], &again["queuesDeleted"]), (&json!(true), &json!(0)), "a second purge finds nothing: {again}");
}
