//! The operator CLI (issue 31 §2), end to end: the real `queen` binary's
//! operator commands against a real broker, checking what they print, what
//! they change and how they exit.

mod common;

use std::process::Output;

use common::Broker;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// Runs `queen ARGS` against `url` (with `stdin` fed to it), waiting for it.
async fn queen(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let (url, args, stdin) = (url.to_string(), args.iter().map(|s| s.to_string()).collect::<Vec<_>>(), stdin.map(str::to_string));
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_queen"))
            .args(&args)
            .env("QUEEN_URL", &url)
            .env_remove("QUEEN_TOKEN")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("queen runs");
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn json_of(o: &Output) -> Value {
    assert!(o.status.success(), "exit {:?}: {}", o.status.code(), err(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", out(o)))
}

#[tokio::test]
async fn push_tail_and_the_queue_commands_do_what_they_say() {
    let b = Broker::start().await;
    let u = b.url.as_str();
    // One message, then JSON lines from standard input.
    let o = queen(u, &["push", "orders", r#"{"n": 0}"#, "--partition", "p1"], None).await;
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).starts_with("pushed 1 messages to orders/p1"), "{}", out(&o));
    let lines: String = (1..=100).map(|i| format!("{{\"n\": {i}}}\n")).collect();
    let pushed = json_of(&queen(u, &["push", "orders", "--partition", "p1", "--file", "-", "--batch", "30", "--json"], Some(&lines)).await);
    assert_eq!(pushed["pushed"], 100);
    // A line that is not JSON stops the push with its line number.
    let o = queen(u, &["push", "orders", "--file", "-"], Some("{\"ok\": 1}\n{\"ok\": 2}\nnot json\n")).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("line 3: not JSON"), "{}", err(&o));
    // The queue as the commands see it.
    let list = json_of(&queen(u, &["queues", "list", "--json"], None).await);
    let orders = list["queues"].as_array().unwrap().iter().find(|q| q["name"] == "orders").unwrap().clone();
    assert_eq!(orders["messages"], 101);
    let table = out(&queen(u, &["queues", "list"], None).await);
    assert!(table.contains("QUEUE") && table.contains("orders") && table.contains("101"), "{table}");
    let o = queen(u, &["queues", "configure", "orders", "--set", "leaseTime=45", "--set", "retryLimit=2"], None).await;
    assert!(o.status.success(), "{}", err(&o));
    let shown = json_of(&queen(u, &["queues", "show", "orders", "--json"], None).await);
    assert_eq!((shown["options"]["leaseTime"].clone(), shown["options"]["retryLimit"].clone()), (json!(45), json!(2)));
    let o = queen(u, &["queues", "show", "nope"], None).await;
    assert_eq!(o.status.code(), Some(4), "{}", err(&o));
    // tail reads everything with a throwaway group, which it removes.
    let o = queen(u, &["tail", "orders", "--from-beginning", "--limit", "101", "--raw", "--seconds", "20"], None).await;
    assert!(o.status.success(), "{}", err(&o));
    let ns: Vec<i64> = out(&o).lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["data"]["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, (0..=100).collect::<Vec<_>>());
    let groups = json_of(&queen(u, &["groups", "list", "--json"], None).await);
    assert!(groups.as_array().unwrap().iter().all(|g| !g["name"].as_str().unwrap().starts_with("queen-tail-")), "{groups}");
    // A named, leased tail commits what it printed.
    let o = queen(u, &["tail", "orders", "--group", "audit", "--leased", "--limit", "5", "--seconds", "20"], None).await;
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).lines().count(), 5);
    let audit = json_of(&queen(u, &["groups", "show", "audit", "--json"], None).await);
    assert_eq!(audit["orders"]["partitions"][0]["offsetLag"], 96);
    // Seek to the end: nothing left to read.
    let o = queen(u, &["groups", "seek", "audit", "orders", "--to-end"], None).await;
    assert!(o.status.success(), "{}", err(&o));
    let audit = json_of(&queen(u, &["groups", "show", "audit", "--json"], None).await);
    assert_eq!(audit["orders"]["partitions"][0]["offsetLag"], 0);
    let table = out(&queen(u, &["groups", "list"], None).await);
    assert!(table.contains("audit"), "{table}");
    // Deleting asks for --yes.
    let o = queen(u, &["groups", "delete", "audit"], None).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(queen(u, &["groups", "delete", "audit", "--yes"], None).await.status.success());
    let o = queen(u, &["queues", "delete", "orders"], None).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("--yes"));
    assert!(queen(u, &["queues", "delete", "orders", "--yes"], None).await.status.success());
    assert_eq!(queen(u, &["queues", "show", "orders"], None).await.status.code(), Some(4));
}

#[tokio::test]
async fn the_dlq_commands_list_show_retry_and_purge() {
    let b = Broker::start().await;
    let u = b.url.as_str();
    for t in ["a", "b"] {
        b.post("/api/v1/push", json!({"items": [{"queue": "risky", "partition": "p", "payload": {"t": t}, "transactionId": t}]})).await;
        let body = b.pop("/api/v1/pop/queue/risky?batch=1&consumerGroup=g").await.body.unwrap();
        let m = &body["messages"][0];
        let (_, r) = b
            .post("/api/v1/ack", json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "dlq",
                                        "error": format!("boom {t}"), "consumerGroup": "g", "leaseId": body["leaseId"]}))
            .await;
        assert_eq!(r[0]["dlq"], true);
    }
    let list = json_of(&queen(u, &["dlq", "list", "risky", "--json"], None).await);
    assert_eq!(list["total"], 2);
    let id = list["messages"][0]["id"].as_str().unwrap().to_string();
    let table = out(&queen(u, &["dlq", "list", "risky"], None).await);
    assert!(table.contains("boom b") && table.contains("boom a"), "{table}");
    let shown = out(&queen(u, &["dlq", "show", "risky", &id], None).await);
    assert!(shown.contains("boom b") && shown.contains("\"t\": \"b\""), "{shown}");
    assert_eq!(queen(u, &["dlq", "show", "risky", "999999"], None).await.status.code(), Some(4));
    let o = queen(u, &["dlq", "retry", &id], None).await;
    assert!(o.status.success(), "{}", err(&o));
    let again = b.pop("/api/v1/pop/queue/risky?batch=10&consumerGroup=other").await.body.unwrap();
    assert_eq!(again["messages"].as_array().unwrap().len(), 3, "the retried letter is a new message of the queue");
    assert_eq!(queen(u, &["dlq", "purge", "risky"], None).await.status.code(), Some(2));
    let purged = json_of(&queen(u, &["dlq", "purge", "risky", "--yes", "--json"], None).await);
    assert_eq!(purged["deleted"], 1);
}

#[tokio::test]
async fn status_completions_exit_codes_and_tokens() {
    let b = Broker::start_with(&[("JWT_ENABLED", "true"), ("JWT_SECRET", "cli-test-secret")]).await;
    let u = b.url.as_str();
    // Refused without a token (401: exit 1), served with one.
    let o = queen(u, &["status"], None).await;
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    let claims = json!({"sub": "ops", "role": "admin", "exp": chrono::Utc::now().timestamp() + 300});
    let token = encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(b"cli-test-secret")).unwrap();
    let status = json_of(&queen(u, &["status", "--json", "--token", &token], None).await);
    assert_eq!(status["health"]["status"], "healthy");
    assert_eq!(status["status"]["queues"], 0);
    let human = out(&queen(u, &["status", "--token", &token], None).await);
    assert!(human.contains("broker") && human.contains("healthy"), "{human}");
    // Nothing listening: exit 3.
    let o = queen("http://127.0.0.1:9", &["status"], None).await;
    assert_eq!(o.status.code(), Some(3));
    assert!(err(&o).contains("cannot reach the broker"), "{}", err(&o));
    let o = queen(u, &["completions", "bash"], None).await;
    assert!(o.status.success());
    assert!(out(&o).contains("_queen()"), "a bash completion function");
}
