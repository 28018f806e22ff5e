//! Authentication and roles (API.md §1.1, §5.5; issue 8 item 5).

mod common;

use common::{stored_messages, Broker};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const SECRET: &str = "test-secret-only-for-tests";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn hs256(claims: Value) -> String {
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap()
}

fn token(role: &str, sub: &str) -> String {
    hs256(json!({"sub": sub, "role": role, "exp": now() + 300}))
}

async fn jwt_broker(extra: &[(&str, &str)]) -> Broker {
    let mut env = vec![("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)];
    env.extend_from_slice(extra);
    Broker::start_with(&env).await
}

/// Status of `method path` with an optional token (and a small valid body for POSTs).
async fn call(b: &Broker, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let url = format!("{}{}", b.url, path);
    let mut req = match method {
        "GET" => b.http.get(url),
        "DELETE" => b.http.delete(url),
        _ => b.http.post(url).json(&json!({"items": [{"queue": "authq", "payload": 1}]})),
    };
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn every_level_against_a_route_of_each_class() {
    let b = jwt_broker(&[]).await;
    // (method, path, roles allowed)
    let routes = [
        ("POST", "/api/v1/push", vec!["write-only", "read-write", "admin"]),
        ("GET", "/api/v1/resources/queues", vec!["read-only", "read-write", "admin"]),
        ("GET", "/api/v1/pop/queue/authq", vec!["read-write", "admin"]),
        ("GET", "/api/v1/pop/queue/authq/partition/p", vec!["read-write", "admin"]),
        ("GET", "/api/v1/pop?namespace=authq", vec!["read-write", "admin"]),
        ("POST", "/api/v1/stats/refresh", vec!["admin"]),
    ];
    for (method, path, allowed) in &routes {
        for role in ["read-only", "write-only", "read-write", "admin", "nobody"] {
            let (status, body) = call(&b, method, path, Some(&token(role, "svc"))).await;
            if allowed.contains(&role) {
                assert!(status < 400, "{role} on {method} {path}: {status} {body}");
            } else {
                assert_eq!((status, body), (403, json!({"error": "Insufficient permissions"})), "{role} on {method} {path}");
            }
        }
        let (status, body) = call(&b, method, path, None).await;
        assert_eq!((status, body), (401, json!({"error": "Authentication required"})), "{method} {path}");
    }
    // Public routes need nothing.
    assert_eq!(call(&b, "GET", "/health", None).await.0, 200);
    assert_eq!(call(&b, "GET", "/metrics", None).await.0, 200);
    // Roles may also come as an array, and a raw token without "Bearer " works.
    let t = hs256(json!({"sub": "x", "roles": ["read-only", "write-only"], "exp": now() + 60}));
    let r = b.http.get(format!("{}/api/v1/resources/queues", b.url)).header("authorization", t).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test]
async fn expired_tampered_and_foreign_tokens_are_refused() {
    let b = jwt_broker(&[("JWT_ISSUER", "queen-tests"), ("JWT_AUDIENCE", "brokers"), ("JWT_CLOCK_SKEW", "5")]).await;
    let good = json!({"sub": "s", "role": "admin", "iss": "queen-tests", "aud": "brokers", "exp": now() + 60});
    assert_eq!(call(&b, "GET", "/api/v1/resources/queues", Some(&hs256(good.clone()))).await.0, 200);
    let mut expired = good.clone();
    expired["exp"] = json!(now() - 60);
    assert_eq!(call(&b, "GET", "/api/v1/resources/queues", Some(&hs256(expired))).await, (401, json!({"error": "Token expired"})));
    let mut within_skew = good.clone();
    within_skew["exp"] = json!(now() - 2);
    assert_eq!(call(&b, "GET", "/api/v1/resources/queues", Some(&hs256(within_skew))).await.0, 200, "clock skew");
    // Flip a character well inside the signature (the last one may only carry padding bits).
    let signed = hs256(good.clone());
    let at = signed.len() - 10;
    let flipped = if &signed[at..at + 1] == "A" { "B" } else { "A" };
    let tampered = format!("{}{}{}", &signed[..at], flipped, &signed[at + 1..]);
    let (status, body) = call(&b, "GET", "/api/v1/resources/queues", Some(&tampered)).await;
    assert_eq!(status, 401);
    assert!(body["error"].as_str().unwrap().starts_with("Invalid token"), "{body}");
    let mut wrong_issuer = good.clone();
    wrong_issuer["iss"] = json!("elsewhere");
    assert_eq!(call(&b, "GET", "/api/v1/resources/queues", Some(&hs256(wrong_issuer))).await, (401, json!({"error": "Invalid token issuer"})));
    let mut wrong_audience = good;
    wrong_audience["aud"] = json!("others");
    assert_eq!(call(&b, "GET", "/api/v1/resources/queues", Some(&hs256(wrong_audience))).await, (401, json!({"error": "Invalid token audience"})));
    let foreign = encode(&Header::new(Algorithm::HS256), &json!({"role": "admin", "exp": now() + 60}), &EncodingKey::from_secret(b"other")).unwrap();
    assert_eq!(call(&b, "GET", "/api/v1/resources/queues", Some(&foreign)).await.1, json!({"error": "Invalid token signature"}));
}

#[tokio::test]
async fn rs256_and_eddsa_tokens_verify_against_the_public_key() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt/");
    for (alg, private, public, name) in [
        (Algorithm::RS256, "rsa_private.pem", "rsa_public.pem", "RS256"),
        (Algorithm::EdDSA, "ed25519_private.pem", "ed25519_public.pem", "EdDSA"),
    ] {
        let public_pem = std::fs::read_to_string(format!("{dir}{public}")).unwrap();
        let private_pem = std::fs::read(format!("{dir}{private}")).unwrap();
        let b = Broker::start_with(&[("JWT_ENABLED", "true"), ("JWT_ALGORITHM", name), ("JWT_PUBLIC_KEY", &public_pem)]).await;
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&private_pem).unwrap(),
            _ => EncodingKey::from_ed_pem(&private_pem).unwrap(),
        };
        let t = encode(&Header::new(alg), &json!({"sub": "k", "role": "read-only", "exp": now() + 60}), &key).unwrap();
        assert_eq!(call(&b, "GET", "/api/v1/resources/queues", Some(&t)).await.0, 200, "{name}");
        assert_eq!(call(&b, "GET", "/api/v1/resources/queues", Some(&token("admin", "x"))).await.0, 401, "{name}: an HS256 token is refused");
    }
}

/// A pop's JSON answer, with an admin's token.
async fn pop_as_admin(b: &Broker, path: &str) -> Value {
    let admin = token("admin", "ops");
    let r = b.http.get(format!("{}{path}", b.url)).header("authorization", format!("Bearer {admin}")).send().await.unwrap();
    r.json().await.unwrap()
}

#[tokio::test]
async fn the_token_subject_is_stamped_as_producer_sub_and_a_client_value_ignored() {
    let b = jwt_broker(&[]).await;
    let t = token("write-only", "billing-service");
    let r = b
        .http
        .post(format!("{}/api/v1/push", b.url))
        .header("authorization", format!("Bearer {t}"))
        .json(&json!({"items": [{"queue": "stamped", "payload": 1, "producerSub": "someone-else"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let stored = stored_messages(&b.sql().await, "stamped", "Default").await;
    assert_eq!(stored.len(), 1);
    let popped = pop_as_admin(&b, "/api/v1/pop/queue/stamped").await;
    assert_eq!(popped["messages"][0]["producerSub"], "billing-service");
}

#[tokio::test]
async fn a_subject_too_long_for_a_frame_is_refused_at_the_door_and_the_broker_lives() {
    let b = jwt_broker(&[]).await;
    // 70,000 bytes would overflow a frame's 16-bit string length; 1025 is past the bound.
    for len in [70_000usize, 1025] {
        let t = token("write-only", &"s".repeat(len));
        let (status, body) = call(&b, "POST", "/api/v1/push", Some(&t)).await;
        assert_eq!((status, body), (401, json!({"error": "Invalid token: sub is longer than 1024 bytes"})));
    }
    assert!(stored_messages(&b.sql().await, "authq", "Default").await.is_empty(), "nothing was written");
    // The bound itself is accepted and the broker still answers.
    let t = token("write-only", &"s".repeat(1024));
    assert_eq!(call(&b, "POST", "/api/v1/push", Some(&t)).await.0, 201);
    let popped = pop_as_admin(&b, "/api/v1/pop/queue/authq").await;
    assert_eq!(popped["messages"][0]["producerSub"].as_str().map(str::len), Some(1024));
}

#[tokio::test]
async fn a_timer_fires_as_a_message_of_the_subject_that_scheduled_it() {
    use base64::Engine as _;
    let b = jwt_broker(&[]).await;
    let writer = token("write-only", "timer-service");
    let op = json!({"operations": [{"op": "schedule", "queue": "later", "timerKey": "k", "delayMs": 0, "txn": "t1",
                                    "payload": base64::engine::general_purpose::STANDARD.encode("{\"x\":1}")}]});
    let r = b.http.post(format!("{}/api/v1/timers", b.url)).header("authorization", format!("Bearer {writer}")).json(&op).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let unauthenticated = b.http.post(format!("{}/api/v1/timers", b.url)).json(&op).send().await.unwrap();
    assert_eq!(unauthenticated.status().as_u16(), 401);
    let popped = pop_as_admin(&b, "/api/v1/pop/queue/later?wait=true&timeout=5000").await;
    assert_eq!((popped["messages"][0]["producerSub"].clone(), popped["messages"][0]["data"].clone()), (json!("timer-service"), json!({"x": 1})));
}

/// `POST path body` with a token of `role`: status and body.
async fn post_as(b: &Broker, role: &str, path: &str, body: Value) -> (u16, Value) {
    let r = b.http.post(format!("{}{path}", b.url)).header("authorization", format!("Bearer {}", token(role, "svc"))).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Issue 45: each destructive action is admin (or read-write where its
/// durable twin is), also when the route's level depends on the body.
#[tokio::test]
async fn destructive_actions_need_the_level_of_their_durable_twin() {
    use base64::Engine as _;
    let b = jwt_broker(&[]).await;
    let payload = base64::engine::general_purpose::STANDARD.encode("1");
    let schedule = json!({"operations": [{"op": "schedule", "queue": "later", "timerKey": "k", "delayMs": 600000, "txn": "t1", "payload": payload}]});
    assert_eq!(post_as(&b, "write-only", "/api/v1/timers", schedule).await.0, 200, "a producer schedules");
    // A write-only producer cannot cancel another's timer; read-write can, as with DELETE.
    let cancel = json!({"operations": [{"op": "cancel", "queue": "later", "timerKey": "k"}]});
    let (status, body) = post_as(&b, "write-only", "/api/v1/timers", cancel.clone()).await;
    assert_eq!((status, body), (403, json!({"error": "Insufficient permissions", "detail": "operations[0]: a cancel needs read-write"})));
    let (status, peek) = call(&b, "GET", "/api/v1/timers/later/k", Some(&token("read-only", "svc"))).await;
    assert_eq!((status, peek["timerKey"].clone()), (200, json!("k")), "the timer is still there: {peek}");
    let (status, body) = post_as(&b, "read-write", "/api/v1/timers", cancel).await;
    assert_eq!((status, body["results"][0]["status"].clone()), (200, json!("cancelled")), "{body}");
    // Ephemeral reset and delete are admin, as a durable queue's delete.
    assert_eq!(post_as(&b, "write-only", "/api/v1/ephemeral/push", json!({"queue": "ram", "messages": [{"payload": 1}]})).await.0, 200);
    assert_eq!(post_as(&b, "read-write", "/api/v1/ephemeral/reset", json!({"queue": "ram"})).await.0, 403);
    let del = |role: &'static str| {
        let (http, url) = (b.http.clone(), format!("{}/api/v1/ephemeral/queue/ram", b.url));
        async move { http.delete(url).header("authorization", format!("Bearer {}", token(role, "svc"))).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(del("read-write").await, 403);
    let (status, body) = post_as(&b, "admin", "/api/v1/ephemeral/reset", json!({"queue": "ram"})).await;
    assert_eq!((status, body["dropped"].clone()), (200, json!(1)), "{body}");
    assert_eq!(del("admin").await, 200);
    // A stream registration that resets deletes a consumer group: admin.
    let register = |reset: bool, hash: &str| json!({"name": "totals", "source_queue": "src", "config_hash": hash, "reset": reset});
    assert_eq!(post_as(&b, "read-write", "/streams/v1/queries", register(false, "h1")).await.0, 200);
    let (status, body) = post_as(&b, "read-write", "/streams/v1/queries", register(true, "h2")).await;
    assert_eq!((status, body["detail"].clone()), (403, json!("reset: discarding a query's state and cursors needs admin")));
    let (status, body) = post_as(&b, "read-write", "/streams/v1/queries", register(false, "h2")).await;
    assert_eq!(status, 409, "still registered with h1: {body}");
    let (status, body) = post_as(&b, "admin", "/streams/v1/queries", register(true, "h2")).await;
    assert_eq!((status, body["reset"].clone()), (200, json!(true)), "{body}");
}

#[tokio::test]
async fn metrics_need_a_reader_when_metrics_public_is_off() {
    let closed = jwt_broker(&[("METRICS_PUBLIC", "false")]).await;
    for path in ["/metrics", "/metrics/prometheus"] {
        assert_eq!(call(&closed, "GET", path, None).await.0, 401, "{path}");
        assert_eq!(call(&closed, "GET", path, Some(&token("write-only", "svc"))).await.0, 403, "{path}");
        assert_eq!(call(&closed, "GET", path, Some(&token("read-only", "svc"))).await.0, 200, "{path}");
    }
    assert_eq!(call(&closed, "GET", "/health", None).await.0, 200, "health stays public");
    let open = jwt_broker(&[]).await;
    assert_eq!(call(&open, "GET", "/metrics/prometheus", None).await.0, 200, "public by default, as upstream");
}

/// The identity routes (issue 49): `/auth/me` names the token's caller, or
/// answers 401 `auth_required`; without JWT, upstream's standalone admin.
/// `/auth/login` and `/auth/logout` are public and keep nothing.
#[tokio::test]
async fn auth_me_names_the_caller_and_login_and_logout_are_public() {
    let b = jwt_broker(&[]).await;
    let (status, body) = call(&b, "GET", "/auth/me", None).await;
    assert_eq!((status, body), (401, json!({"error": "auth_required", "code": "auth_required"})));
    let (status, body) = call(&b, "GET", "/auth/me", Some("not-a-token")).await;
    assert_eq!((status, &body["code"]), (401, &json!("auth_required")));
    assert!(body["detail"].as_str().unwrap().starts_with("Invalid token"), "{body}");
    let t = hs256(json!({"sub": "alice", "roles": ["read-only", "write-only"], "email": "a@example.org", "exp": now() + 300}));
    let (status, me) = call(&b, "GET", "/auth/me", Some(&t)).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["user_id"], "alice");
    assert_eq!(me["subject"], "alice");
    assert_eq!(me["email"], "a@example.org");
    assert_eq!(me["roles"], json!(["read-only", "write-only"]));
    assert_eq!(me["role"], "read-only", "the highest level the roles reach");
    assert_eq!(me["tenant"], "00000000-0000-0000-0000-000000000001");
    assert_eq!(me["standalone"], false);
    assert_eq!(me["is_operator"], false);
    let (_, admin) = call(&b, "GET", "/auth/me", Some(&token("admin", "root"))).await;
    assert_eq!((&admin["role"], &admin["clusters"][0]["role"], &admin["is_operator"]), (&json!("admin"), &json!("admin"), &json!(true)));
    let expired = hs256(json!({"sub": "late", "role": "admin", "exp": now() - 3600}));
    assert_eq!(call(&b, "GET", "/auth/me", Some(&expired)).await.0, 401);
    // Login explains where sign-in happens; logout ends nothing, for anyone.
    let page = b.http.get(format!("{}/auth/login", b.url)).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.text().await.unwrap().contains("Authorization: Bearer"));
    assert_eq!(call(&b, "POST", "/auth/logout", None).await, (200, json!({"ok": true})));

    let open = Broker::start().await;
    let (status, me) = open.get("/auth/me").await;
    assert_eq!(status, 200);
    assert_eq!((&me["user_id"], &me["role"], &me["standalone"], &me["subject"]), (&json!("standalone"), &json!("admin"), &json!(true), &Value::Null));
    assert_eq!(me["clusters"][0]["tenant_id"], "00000000-0000-0000-0000-000000000001");
    let no_redirects = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let r = no_redirects.get(format!("{}/auth/login", open.url)).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["location"].to_str().unwrap()), (303, "/"));
}
