//! Bad input never costs a crash, a 5xx or data (issue 8, item 3): every
//! route answers hostile requests with a 4xx JSON body naming the problem,
//! and the broker serves the next request normally.

mod common;

use common::Broker;
use serde_json::{json, Value};

fn qpb1(flags: u8, rest: &[u8]) -> Vec<u8> {
    let mut b = b"QPB1".to_vec();
    b.push(flags);
    b.extend_from_slice(rest);
    b
}

/// A zstd frame that inflates to `n` zero bytes.
fn zstd_of_zeros(n: usize) -> Vec<u8> {
    queen::log::compress_frames(&vec![0u8; n], 3)
}

#[tokio::test]
async fn every_route_refuses_hostile_input_with_a_4xx_json_error() {
    let b = Broker::start_with(&[("QUEEN_MAX_BODY_BYTES", "4096")]).await;
    let long = "q".repeat(300);
    let bomb = {
        let z = zstd_of_zeros(10 << 20);
        let mut rest = 16u32.to_le_bytes().to_vec(); // announces 16 raw bytes
        rest.extend_from_slice(&z);
        qpb1(4 | 1, &rest)
    };
    let lying_count = {
        let mut rest = 5u32.to_le_bytes().to_vec(); // five groups announced, none present
        rest.extend_from_slice(&[1, 0, b'q']);
        qpb1(4, &rest)
    };
    let past_the_end = {
        let mut rest = 1u32.to_le_bytes().to_vec();
        rest.extend_from_slice(&[1, 0, b'q', 1, 0, b'p']);
        rest.extend_from_slice(&1u32.to_le_bytes());
        rest.extend_from_slice(&[0, 0]);
        rest.extend_from_slice(&1000u32.to_le_bytes()); // a payload longer than the body
        rest.extend_from_slice(b"{}");
        qpb1(4, &rest)
    };
    let framed_bomb = {
        let z = zstd_of_zeros(1 << 20);
        let mut rest = 1u32.to_le_bytes().to_vec();
        rest.extend_from_slice(&[1, 0, b'q', 1, 0, b'p']);
        rest.extend_from_slice(&1u32.to_le_bytes());
        rest.extend_from_slice(&(z.len() as u32).to_le_bytes());
        rest.extend_from_slice(&z);
        qpb1(8, &rest)
    };
    let huge = vec![b' '; 5_000];
    // (method, path, content type, body)
    let cases: Vec<(&str, String, &str, Vec<u8>)> = vec![
        ("POST", "/api/v1/push".into(), "application/json", b"{".to_vec()),
        ("POST", "/api/v1/push".into(), "application/json", b"[]".to_vec()),
        ("POST", "/api/v1/push".into(), "application/json", b"".to_vec()),
        ("POST", "/api/v1/push".into(), "application/json", b"{\"items\":[{\"queue\":\"\xff\"}]}".to_vec()),
        ("POST", "/api/v1/push".into(), "application/json", json!({"items": [{"queue": long}]}).to_string().into_bytes()),
        ("POST", "/api/v1/push".into(), "application/json", json!({"items": [{"queue": "a\u{7}b"}]}).to_string().into_bytes()),
        ("POST", "/api/v1/push".into(), "application/json", json!({"items": [{"queue": "q", "partition": 12}]}).to_string().into_bytes()),
        ("POST", "/api/v1/push".into(), "application/json", huge.clone()),
        ("POST", "/api/v1/push".into(), "application/x-queen-push", b"QPB1".to_vec()),
        ("POST", "/api/v1/push".into(), "application/x-queen-push", lying_count),
        ("POST", "/api/v1/push".into(), "application/x-queen-push", past_the_end),
        ("POST", "/api/v1/push".into(), "application/x-queen-push", bomb),
        ("POST", "/api/v1/push".into(), "application/x-queen-push", framed_bomb),
        ("POST", "/api/v1/push".into(), "application/x-queen-push", qpb1(0x80, &[])),
        ("POST", "/api/v1/ack".into(), "application/json", b"{".to_vec()),
        ("POST", "/api/v1/ack".into(), "application/json", b"".to_vec()),
        ("POST", "/api/v1/ack".into(), "application/json", json!({"transactionId": 1, "partitionId": "1"}).to_string().into_bytes()),
        ("POST", "/api/v1/ack/batch".into(), "application/json", json!({"acknowledgments": "all"}).to_string().into_bytes()),
        ("POST", "/api/v1/transaction".into(), "application/json", b"{".to_vec()),
        ("POST", "/api/v1/transaction".into(), "application/json", json!({"operations": 5}).to_string().into_bytes()),
        ("POST", "/api/v1/transaction".into(), "application/x-queen-push", b"QTB1\x00\xff\xff\xff\xff".to_vec()),
        ("POST", "/api/v1/transaction".into(), "application/json", huge.clone()),
        ("POST", "/api/v1/configure".into(), "application/json", json!({"queue": 7}).to_string().into_bytes()),
        ("POST", "/api/v1/configure".into(), "application/json", json!({"queue": "q", "options": {"retryLimit": -1}}).to_string().into_bytes()),
        ("POST", "/api/v1/configure".into(), "application/json", json!({"queue": "q", "options": {"leaseTime": 1e300}}).to_string().into_bytes()),
        ("POST", "/api/v1/configure".into(), "application/json", json!({"queue": long}).to_string().into_bytes()),
        ("POST", "/api/v1/consumer-groups/g/queues/q/seek".into(), "application/json", json!({"timestamp": 5}).to_string().into_bytes()),
        ("POST", "/api/v1/consumer-groups/g/subscription".into(), "application/json", b"{".to_vec()),
        ("POST", "/api/v1/system/maintenance".into(), "application/json", json!({"enabled": "yes"}).to_string().into_bytes()),
        ("POST", "/api/v1/system/maintenance/pop".into(), "application/json", b"".to_vec()),
        ("GET", "/api/v1/pop/queue/q?batch=-5".into(), "", vec![]),
        ("GET", "/api/v1/pop/queue/q?batch=99999999999999999999".into(), "", vec![]),
        ("GET", "/api/v1/pop/queue/q?partitions=x".into(), "", vec![]),
        ("GET", "/api/v1/pop/queue/q?timeout=-1".into(), "", vec![]),
        ("GET", format!("/api/v1/pop/queue/{long}"), "", vec![]),
        ("GET", "/api/v1/pop/queue/a%01b".into(), "", vec![]),
        ("GET", "/api/v1/pop/queue/q/partition/p%00".into(), "", vec![]),
        ("GET", "/api/v1/pop".into(), "", vec![]),
        ("GET", "/api/v1/dlq?queue=q&limit=-1".into(), "", vec![]),
        ("GET", "/api/v1/messages?limit=abc".into(), "", vec![]),
        ("GET", "/api/v1/status?from=garbage".into(), "", vec![]),
        ("GET", "/api/v1/status/analytics?interval=decade".into(), "", vec![]),
        ("GET", "/api/v1/consumer-groups/lagging?minLagSeconds=x".into(), "", vec![]),
        ("GET", "/api/v1/resources/queues?limit=0".into(), "", vec![]),
        ("DELETE", "/api/v1/consumer-groups/g?deleteMetadata=maybe".into(), "", vec![]),
    ];
    for (method, path, content_type, body) in cases {
        let url = format!("{}{}", b.url, path);
        let req = match method {
            "GET" => b.http.get(url),
            "DELETE" => b.http.delete(url),
            _ => b.http.post(url).header("content-type", content_type).body(body.clone()),
        };
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let is_json = r.headers().get("content-type").is_some_and(|v| v.to_str().unwrap().starts_with("application/json"));
        let answer: Value = r.json().await.unwrap_or(Value::Null);
        let shown = String::from_utf8_lossy(&body[..body.len().min(60)]).to_string();
        assert!((400..500).contains(&status), "{method} {path} {shown:?}: {status} {answer}");
        assert!(is_json, "{method} {path}: not JSON");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(!error.is_empty(), "{method} {path}: no error text in {answer}");
    }
    // Nothing was written, and the broker serves normally.
    let segments: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get(0);
    assert_eq!(segments, 0);
    assert_eq!(b.get("/health").await.0, 200);
    let (status, _) = b.post("/api/v1/push", json!({"items": [{"queue": "q", "payload": "fine"}]})).await;
    assert_eq!(status, 201);
    assert_eq!(b.pop("/api/v1/pop/queue/q").await.data(), [json!("fine")]);
}

/// Issue 45, found by the API fuzzer: a NUL character (`\u0000`) reached
/// PostgreSQL, which stores it in neither `text` nor `jsonb`, and the
/// answer was a 500 (a trace, a KV value) or a message that could never be
/// dead-lettered. Every such field is refused with a 400 naming it, and
/// nothing is written.
#[tokio::test]
async fn a_nul_character_is_refused_where_postgresql_could_not_store_it() {
    let b = Broker::start().await;
    b.push_to("q", "p", &[serde_json::json!(1)]).await;
    let m = b.pop("/api/v1/pop/queue/q?batch=1&autoAck=true").await.messages()[0].clone();
    let nul = "a\u{0}b";
    for (path, body, field) in [
        ("/api/v1/push", serde_json::json!({"items": [{"queue": "q", "payload": {"k": nul}}]}), "items[0].payload"),
        ("/api/v1/push", serde_json::json!({"items": [{"queue": "q", "payload": 1, "transactionId": nul}]}), "items[0].transactionId"),
        ("/api/v1/traces", serde_json::json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "data": [nul]}), "data"),
        ("/api/v1/traces", serde_json::json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "traceNames": [nul], "data": 1}), "traceNames[0]"),
        ("/api/v1/kv", serde_json::json!({"operations": [{"op": "put", "ns": "n", "key": "k", "value": nul, "forever": true}]}), "operations[0].value"),
    ] {
        let (status, r) = b.post(path, body).await;
        let error = r["detail"].as_str().or(r["error"].as_str()).unwrap_or_default().to_string();
        assert_eq!(status, 400, "{path}: {r}");
        assert!(error.contains(field) && error.contains("NUL"), "{path}: {r}");
    }
    let sql = b.sql().await;
    assert_eq!(common::stored_messages(&sql, "q", "p").await.len(), 1, "no push landed");
    let kv: i64 = sql.query_one("SELECT count(*) FROM queen.kv WHERE ns = 'n'", &[]).await.unwrap().get(0);
    assert_eq!(kv, 0);
}
