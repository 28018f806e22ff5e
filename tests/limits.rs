//! Limits that protect the broker (issue 8, item 6): each one holds under
//! abuse while the broker keeps serving everyone else.

mod common;

use std::time::{Duration, Instant};

use common::Broker;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(b: &Broker) -> String {
    b.url.trim_start_matches("http://").to_string()
}

/// Reads until EOF or `limit`; what the server sent, and when it closed.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (String, Option<Duration>) {
    let started = Instant::now();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit.saturating_sub(started.elapsed()), s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&buf).into(), Some(started.elapsed())),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return (String::from_utf8_lossy(&buf).into(), None),
        }
    }
}

#[tokio::test]
async fn a_slowloris_connection_is_dropped_and_others_are_served() {
    let b = Broker::start_with(&[("QUEEN_HEADER_TIMEOUT_MS", "300")]).await;
    let mut slow = TcpStream::connect(addr(&b)).await.unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").await.unwrap(); // never finishes its headers
    assert_eq!(b.get("/health").await.0, 200, "served while the slow one dangles");
    let (_, closed) = read_until_closed(&mut slow, Duration::from_secs(5)).await;
    let closed = closed.expect("the server closed the slow connection");
    assert!(closed < Duration::from_secs(2), "after {closed:?}");
}

#[tokio::test]
async fn a_body_that_never_arrives_answers_408() {
    let b = Broker::start_with(&[("QUEEN_BODY_TIMEOUT_MS", "300")]).await;
    let mut s = TcpStream::connect(addr(&b)).await.unwrap();
    s.write_all(b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"items\":").await.unwrap();
    let (answer, _) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request body not received within 300 ms"), "{answer}");
    assert_eq!(b.post("/api/v1/push", json!({"items": [{"queue": "q", "payload": 1}]})).await.0, 201);
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once_and_service_resumes() {
    let b = Broker::start_with(&[("QUEEN_MAX_CONNECTIONS", "4"), ("QUEEN_HEADER_TIMEOUT_MS", "500")]).await;
    let mut hogs = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr(&b)).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
        hogs.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut over = TcpStream::connect(addr(&b)).await.unwrap();
    let _ = over.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let (answer, closed) = read_until_closed(&mut over, Duration::from_secs(2)).await;
    assert!(answer.is_empty() && closed.is_some(), "the fifth connection is closed unanswered: {answer:?}");
    // The hogs time out on their headers, and the broker serves again.
    let started = Instant::now();
    loop {
        if let Ok(r) = reqwest::get(format!("{}/health", b.url)).await {
            if r.status().as_u16() == 200 {
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(5), "service did not resume");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(hogs);
}

#[tokio::test]
async fn a_flood_of_long_polls_cannot_starve_pushes() {
    let b = Broker::start_with(&[("QUEEN_MAX_INFLIGHT_POP", "3")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/flood").await.status, 204);
    let mut parked = Vec::new();
    for _ in 0..3 {
        let url = format!("{}/api/v1/pop/queue/flood?wait=true&timeout=3000", b.url);
        parked.push(tokio::spawn(async move { reqwest::get(url).await.unwrap().status().as_u16() }));
    }
    b.until_parked(3).await;
    let r = b.http.get(format!("{}/api/v1/pop/queue/flood", b.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "overloaded");
    assert_eq!(b.post("/api/v1/push", json!({"items": [{"queue": "other", "payload": 1}]})).await.0, 201, "pushes are their own family");
    assert_eq!(b.get("/health").await.0, 200);
    for p in parked {
        assert_eq!(p.await.unwrap(), 204);
    }
    assert_eq!(b.pop("/api/v1/pop/queue/flood").await.status, 204, "capacity is back");
}

/// First contacts (connection, then work) and ring pops (permit, then
/// connection) at once on a small pool: nobody holds a connection while
/// queueing for a permit, so every pop is served instead of timing out with
/// `500 pool`.
#[tokio::test]
async fn a_burst_of_first_contacts_and_ring_pops_on_a_small_pool_is_served() {
    let b = Broker::start_with(&[("DB_POOL_SIZE", "4"), ("DB_CONNECTION_TIMEOUT", "3000")]).await;
    const QUEUES: usize = 60;
    for q in 0..QUEUES {
        let (status, _) = b.get(&format!("/api/v1/pop/queue/burst.old.{q}")).await;
        assert_eq!(status, 204, "first contact of queue {q}");
    }
    let mut tasks = Vec::new();
    for q in 0..QUEUES {
        for path in [format!("/api/v1/pop/queue/burst.old.{q}"), format!("/api/v1/pop/queue/burst.new.{q}")] {
            let (http, url) = (b.http.clone(), format!("{}{path}", b.url));
            tasks.push(tokio::spawn(async move { http.get(&url).send().await.unwrap().status().as_u16() }));
        }
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let failed = statuses.iter().filter(|s| **s >= 500).count();
    assert_eq!(failed, 0, "{failed} of {} pops failed: {statuses:?}", statuses.len());
}
