//! `/metrics` (JSON) and `/metrics/prometheus` (text), issue 5.

mod common;

use common::Broker;
use serde_json::json;

#[tokio::test]
async fn both_metric_endpoints_report_real_traffic() {
    let b = Broker::start().await;
    b.push_to("mq", "p", &[json!(1), json!(2), json!(3)]).await;
    let body = b.pop("/api/v1/pop/queue/mq?batch=2").await.body.unwrap();
    let acks: Vec<(&str, &str, &str, Option<&str>)> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["transactionId"].as_str().unwrap(), m["partitionId"].as_str().unwrap(), "completed", body["leaseId"].as_str()))
        .collect();
    b.ack_batch(None, &acks).await;

    let (status, m) = b.get("/metrics").await;
    assert_eq!(status, 200);
    assert_eq!((m["messages"]["pushed"].as_u64(), m["messages"]["popped"].as_u64(), m["messages"]["acked"].as_u64()), (Some(3), Some(2), Some(2)));
    assert_eq!(m["messages"]["total"], 3);
    assert!(m["requests"]["total"].as_u64().unwrap() >= 3);
    assert_eq!(m["database"]["poolSize"], 160);
    assert_eq!(m["database"]["popPermits"], 8, "the adaptive claim limit starts at 8 and needs 8 claims to move");
    assert!(m["memory"]["rss"].as_u64().unwrap() > 1_000_000);
    assert!(m["uptime"].is_u64());

    let r = b.http.get(format!("{}/metrics/prometheus", b.url)).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "text/plain; version=0.0.4");
    let text = r.text().await.unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid exposition");
    let value = |name: &str, queue: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && s.labels.get("queue") == Some(queue))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    };
    assert_eq!(value("queen_push_messages_total", "mq"), Some(3.0));
    assert_eq!(value("queen_pop_messages_total", "mq"), Some(2.0));
    assert_eq!(value("queen_ack_messages_total", "mq"), Some(2.0));
    for family in [
        "queen_http_request_duration_seconds",
        "queen_delivery_lag_seconds",
        "queen_segment_messages",
        "queen_db_pool_connections",
        "queen_db_pool_waiting",
        "queen_parked_long_polls",
        "queen_hotlist_ready_partitions",
        "queen_pop_permit_limit",
        "queen_dedup_memory_entries",
    ] {
        assert!(scrape.samples.iter().any(|s| s.metric.starts_with(family)), "{family} missing from\n{text}");
    }
    let route_labels: Vec<&str> = scrape
        .samples
        .iter()
        .filter(|s| s.metric.starts_with("queen_http_request_duration_seconds"))
        .filter_map(|s| s.labels.get("route"))
        .collect();
    assert!(route_labels.contains(&"/api/v1/pop/queue/:queue"), "routes are labelled by pattern: {route_labels:?}");
    // One lag sample per delivered message: both came from one segment.
    let lag_count = text.lines().find_map(|l| l.strip_prefix("queen_delivery_lag_seconds_count ")).and_then(|v| v.parse::<f64>().ok());
    assert_eq!(lag_count, Some(2.0), "in\n{text}");
    // The push went through every stage once at least (one write of 3 messages).
    for stage in ["lane", "group", "pool", "write"] {
        let prefix = format!("queen_push_stage_seconds_count{{stage=\"{stage}\"}} ");
        let count = text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.parse::<f64>().ok());
        assert!(count.is_some_and(|c| c >= 1.0), "push stage {stage}: {count:?} in\n{text}");
    }
}

/// The ack and pop paths say where their time goes, as the push path does:
/// a batch-1 pop past first contact queues for a shared claim, and an ack
/// for a shared ack write.
#[tokio::test]
async fn acks_and_claims_time_each_stage() {
    let b = Broker::start().await;
    b.push_to("stq", "p", &[json!(1), json!(2)]).await;
    for _ in 0..2 {
        let body = b.pop("/api/v1/pop/queue/stq?batch=1").await.body.unwrap();
        let m = &body["messages"][0];
        let acked = b.ack_batch(None, &[(m["transactionId"].as_str().unwrap(), m["partitionId"].as_str().unwrap(), "completed", body["leaseId"].as_str())]).await;
        assert_eq!(acked[0]["success"], true, "{acked:?}");
    }
    let text = b.http.get(format!("{}/metrics/prometheus", b.url)).send().await.unwrap().text().await.unwrap();
    let count = |family: &str, stage: &str| {
        let prefix = format!("{family}_count{{stage=\"{stage}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
    };
    for stage in ["share", "pool", "write"] {
        assert_eq!(count("queen_ack_stage_seconds", stage), 2.0, "ack stage {stage} once per ack in\n{text}");
    }
    // The first pop claims on first contact, on a connection of its own;
    // the second goes through the shared claim.
    assert_eq!(count("queen_pop_stage_seconds", "share"), 1.0, "in\n{text}");
    for stage in ["permit", "pool", "claim"] {
        assert!(count("queen_pop_stage_seconds", stage) >= 1.0, "pop stage {stage} in\n{text}");
    }
}

#[tokio::test]
async fn fixed_claim_permits_are_three_quarters_of_the_pool() {
    let b = Broker::start_with(&[("QUEEN_POP_ADAPTIVE_PERMITS", "false"), ("DB_POOL_SIZE", "40")]).await;
    let (_, m) = b.get("/metrics").await;
    assert_eq!(m["database"]["popPermits"], 30);
    let (_, m) = Broker::start_with(&[("DB_POOL_SIZE", "40")]).await.get("/metrics").await;
    assert_eq!(m["database"]["popPermits"], 8);
}

/// The log's gauges (issue 28 §3), set by the background sampler, not by
/// the scrape: per queue its partitions, messages, pending and dead letters;
/// per (queue, group) the lag in messages and seconds; the spool.
#[tokio::test]
async fn queue_and_group_gauges_follow_what_was_pushed_and_consumed() {
    let b = Broker::start_with(&[("STATS_INTERVAL_MS", "200")]).await;
    b.push_to("gq", "p1", &[json!(1), json!(2), json!(3)]).await;
    b.push_to("gq", "p2", &[json!(4)]).await;
    // g reads and acks two messages of p1; slow has read nothing yet.
    let body = b.pop("/api/v1/pop/queue/gq/partition/p1?batch=2&consumerGroup=g").await.body.unwrap();
    let last = &body["messages"][1];
    b.ack_batch(Some("g"), &[(last["transactionId"].as_str().unwrap(), last["partitionId"].as_str().unwrap(), "completed", body["leaseId"].as_str())]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/gq/partition/p2?batch=1&consumerGroup=slow&autoAck=true").await.status, 200);
    let expected = [
        ("queen_queue_partitions{queue=\"gq\"}", 2.0),
        ("queen_queue_messages{queue=\"gq\"}", 4.0),
        ("queen_consumer_lag_messages{queue=\"gq\",group=\"g\"}", 1.0),
        ("queen_consumer_lag_messages{queue=\"gq\",group=\"slow\"}", 0.0),
        ("queen_queue_dead_letters{queue=\"gq\"}", 0.0),
        ("queen_spool_files", 0.0),
    ];
    common::eventually("the sampler to set the gauges", std::time::Duration::from_secs(10), || async {
        let text = b.prometheus().await;
        expected.iter().all(|(series, v)| common::sample(&text, series) == Some(*v))
    })
    .await;
    let text = b.prometheus().await;
    // Pending is what the slowest cursor of each partition has not committed:
    // p1 holds one message past g's cursor, p2 none past slow's.
    assert_eq!(common::sample(&text, "queen_queue_pending_messages{queue=\"gq\"}"), Some(1.0));
    let lag_s = common::sample(&text, "queen_consumer_lag_seconds{queue=\"gq\",group=\"g\"}").unwrap();
    assert!((0.0..60.0).contains(&lag_s), "g waits on a message seconds old: {lag_s}");
}

/// A log larger than a tick's window is walked over several ticks, and its
/// gauges add up every window (issue 51): 25 partitions in windows of 10,
/// two queues interleaved so each window holds some of both.
#[tokio::test]
async fn gauges_of_a_log_walked_over_several_ticks_add_up_every_window() {
    let b = Broker::start_with(&[("STATS_INTERVAL_MS", "100"), ("QUEEN_MAINTENANCE_WINDOW", "10")]).await;
    for n in 0..25 {
        let queue = if n % 5 == 0 { "walk-b" } else { "walk-a" };
        b.push_to(queue, &format!("p{n}"), &[json!(n), json!(n)]).await;
        // g reads one message of each partition: a lag of one everywhere.
        let body = b.pop(&format!("/api/v1/pop/queue/{queue}/partition/p{n}?batch=1&consumerGroup=g&autoAck=true")).await;
        assert_eq!(body.status, 200);
    }
    let expected = [
        ("queen_queue_partitions{queue=\"walk-a\"}", 20.0),
        ("queen_queue_partitions{queue=\"walk-b\"}", 5.0),
        ("queen_queue_messages{queue=\"walk-a\"}", 40.0),
        ("queen_queue_pending_messages{queue=\"walk-a\"}", 20.0),
        ("queen_consumer_lag_messages{queue=\"walk-a\",group=\"g\"}", 20.0),
        ("queen_consumer_lag_messages{queue=\"walk-b\",group=\"g\"}", 5.0),
    ];
    common::eventually("a walk over all three windows to set the gauges", std::time::Duration::from_secs(10), || async {
        let text = b.prometheus().await;
        expected.iter().all(|(series, v)| common::sample(&text, series) == Some(*v))
    })
    .await;
    // Each window is one tick: a walk of 25 partitions took three.
    let text = b.prometheus().await;
    let ticks = common::sample(&text, "queen_maintenance_tick_seconds_count{service=\"gauges\"}").unwrap_or(0.0);
    assert!(ticks >= 3.0, "{ticks} gauge ticks");
}
