//! Choosing a request's tenant (issue 49, `tenancy`): the header a trusted
//! proxy sets, the token's claim, the refusals, and the boot interlock.
//! No route family keeps its data per tenant yet, so every request of a
//! tenant other than the default is refused on them, never served from the
//! default tenant's data.

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
    // Another tenant: nothing of its own exists yet, so it is refused, not
    // served from the default tenant's data.
    let (status, body) = send(&b, "POST", "/api/v1/push", Some(OTHER), None).await;
    assert_eq!((status, &body["code"]), (403, &json!("tenant_unsupported")), "{body}");
    assert_eq!(send(&b, "GET", "/api/v1/resources/queues", Some(OTHER), None).await.0, 403);
    assert_eq!(queues(&b).await, 0, "no refused request created anything");
    // No header, a blank one, or the default tenant named: served.
    for t in [None, Some(" "), Some(DEFAULT), Some("00000000-0000-0000-0000-000000000001 ")] {
        assert_eq!(send(&b, "POST", "/api/v1/push", t, None).await.0, 201, "{t:?}");
    }
    assert_eq!(queues(&b).await, 1);
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
    assert_eq!(send(&b, "POST", "/api/v1/push", None, Some(&other)).await.1["code"], "tenant_unsupported");
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
