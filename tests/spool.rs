//! Push maintenance and the spool (issue 5): what is answered `buffered` is
//! on disk and reaches the log once, in order, even across a restart.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{eventually, Broker};
use serde_json::{json, Value};

#[tokio::test]
async fn a_thousand_spooled_pushes_survive_a_restart_and_arrive_once_in_order() {
    let mut b = Broker::start().await;
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    for r in 0..10 {
        let items: Vec<Value> = (0..100)
            .map(|i| {
                let n = r * 100 + i;
                json!({"queue": "spooled", "partition": format!("p{}", n % 4), "payload": n})
            })
            .collect();
        let (status, body) = b.post("/api/v1/push", json!({ "items": items })).await;
        assert_eq!(status, 201);
        assert!(body.as_array().unwrap().iter().all(|i| i["status"] == "buffered" && i["transactionId"].is_string()));
    }
    let (_, m) = b.get("/api/v1/system/maintenance").await;
    assert_eq!((m["enabled"].as_bool(), m["spoolPending"].as_bool()), (Some(true), Some(true)));
    let sql = b.sql().await;
    let segments: i64 = sql.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get(0);
    assert_eq!(segments, 0, "nothing written during maintenance");

    b.restart().await; // kill -9: the spool files are all that is left
    b.post("/api/v1/system/maintenance", json!({"enabled": false})).await;
    eventually("the spool to drain", Duration::from_secs(20), || async {
        sql.query_one("SELECT COALESCE(sum(last_offset + 1), 0)::bigint FROM queen.partitions", &[]).await.unwrap().get::<_, i64>(0) == 1000
    })
    .await;
    let mut per_partition: HashMap<String, Vec<i64>> = HashMap::new();
    for p in 0..4 {
        for m in common::stored_messages(&sql, "spooled", &format!("p{p}")).await {
            per_partition.entry(format!("p{p}")).or_default().push(m.payload.parse().unwrap());
        }
    }
    let total: usize = per_partition.values().map(Vec::len).sum();
    assert_eq!(total, 1000, "each message once");
    for (p, ns) in &per_partition {
        let mut sorted = ns.clone();
        sorted.sort();
        assert_eq!(ns, &sorted, "{p} keeps push order");
    }
    eventually("the spool to be empty", Duration::from_secs(10), || async {
        b.get("/api/v1/system/maintenance").await.1["spoolPending"] == false
    })
    .await;
    // Pushes go straight to the log again.
    let (_, r) = b.post("/api/v1/push", json!({"items": [{"queue": "spooled", "payload": "live"}]})).await;
    assert_eq!(r[0]["status"], "queued");
}

#[tokio::test]
async fn a_spooled_push_to_names_with_quotes_and_backslashes_is_replayed() {
    // The spool line stores names as JSON strings; these need escapes, which
    // a line reader borrowing plain `&str` could not read back.
    let b = Broker::start().await;
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    let (queue, partition) = ("sp\"ool", "p\\1");
    let (status, body) = b.post("/api/v1/push", json!({"items": [{"queue": queue, "partition": partition, "payload": {"n": 1}}]})).await;
    assert_eq!((status, body[0]["status"].as_str()), (201, Some("buffered")));
    assert_eq!(body[0]["queueName"], queue);
    b.post("/api/v1/system/maintenance", json!({"enabled": false})).await;
    let sql = b.sql().await;
    eventually("the spooled push to reach its partition", Duration::from_secs(20), || async {
        !common::stored_messages(&sql, queue, partition).await.is_empty()
    })
    .await;
    let stored = common::stored_messages(&sql, queue, partition).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].payload, r#"{"n":1}"#);
    // The replay removes its file after the commit: a moment later, not at once.
    eventually("the spool to be empty", Duration::from_secs(10), || async {
        b.get("/api/v1/system/maintenance").await.1["spoolPending"] == false
    })
    .await;
}

/// A broker on a database of its own, spooling into `spool`.
async fn broker_on_own_db(spool: &std::path::Path) -> Broker {
    let c = common::cluster();
    let db = c.create_db().await;
    Broker::spawn(db.clone(), vec![("QUEEN_DATABASE_URL".into(), c.url(&db)), ("FILE_BUFFER_DIR".into(), spool.display().to_string())]).await
}

async fn segment_count(b: &Broker) -> i64 {
    b.sql().await.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_spool_shared_by_brokers_of_two_databases_is_replayed_only_into_its_own() {
    let spool = tempfile::Builder::new().prefix("queen-shared-spool-").tempdir_in("/tmp").unwrap();
    // A file from before spools named their database: nobody may guess.
    let legacy = spool.path().join("spool-00000000000000000001-1.jsonl");
    std::fs::write(&legacy, "[{\"queue\":\"legacy\",\"partition\":\"Default\",\"transactionId\":\"l1\",\"payload\":1}]\n").unwrap();
    let mut a = broker_on_own_db(spool.path()).await;
    let b = broker_on_own_db(spool.path()).await;
    assert_eq!(a.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    let items: Vec<Value> = (0..50).map(|n| json!({"queue": "s", "partition": "p", "payload": n})).collect();
    let (status, body) = a.post("/api/v1/push", json!({ "items": items })).await;
    assert_eq!(status, 201);
    assert!(body.as_array().unwrap().iter().all(|i| i["status"] == "buffered"), "{body}");

    // B's replayer runs every 100 ms; give it many chances to do the wrong thing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(segment_count(&b).await, 0, "B replayed nothing of A's database");
    assert_eq!(b.get("/api/v1/system/maintenance").await.1["spoolPending"], false, "A's file is not B's pending work");
    let (_, r) = b.post("/api/v1/push", json!({"items": [{"queue": "b", "payload": "own"}]})).await;
    assert_eq!(r[0]["status"], "queued", "B's pushes do not queue up behind A's file");
    // Each broker says once which files it leaves, and whose they are.
    let said = |b: &Broker, what: &str| b.logs().iter().filter(|l| l.contains(what)).count();
    assert_eq!(said(&b, "names no database"), 1, "B saw the ownerless file at boot");
    let c = broker_on_own_db(spool.path()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((said(&c, "spool file of another database"), said(&c, "names no database")), (1, 1), "{:?}", c.logs());
    assert!(c.logs().iter().any(|l| l.contains("spool file of another database") && l.contains(&a.db)), "names A's database");
    assert_eq!(segment_count(&c).await, 0);

    // A dies with its spool on disk and comes back, still in push
    // maintenance (the switch is kept in the database); once it is turned
    // off, A replays its own spool, once, in order.
    a.restart().await;
    assert_eq!(a.get("/api/v1/system/maintenance").await.1["enabled"], true, "maintenance survives a restart");
    assert_eq!(a.post("/api/v1/system/maintenance", json!({"enabled": false})).await.0, 200);
    let sql = a.sql().await;
    eventually("A's spool to reach its own database", Duration::from_secs(20), || async {
        common::stored_messages(&sql, "s", "p").await.len() == 50
    })
    .await;
    let payloads: Vec<i64> = common::stored_messages(&sql, "s", "p").await.iter().map(|m| m.payload.parse().unwrap()).collect();
    assert_eq!(payloads, (0..50).collect::<Vec<i64>>(), "every spooled push once, in order");
    assert_eq!(segment_count(&b).await, 1, "B holds only its own push");
    let left: Vec<String> = std::fs::read_dir(spool.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, [legacy.file_name().unwrap().to_string_lossy().into_owned()], "A's file is gone, the ownerless one stays");
    for broker in [&a, &b] {
        let rows: i64 = broker
            .sql()
            .await
            .query_one("SELECT count(*) FROM queen.queues WHERE name = 'legacy'", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows, 0, "the ownerless file was replayed nowhere");
    }
}

/// `GET /api/v1/status/buffers` and `GET /status` (issue 28 §3): the spool's
/// files and bytes while pushes are buffered, gone once replayed; the
/// broker's one page names the switches, the database and the spool.
#[tokio::test]
async fn the_spool_and_the_broker_page_show_what_is_buffered() {
    let b = Broker::start().await;
    let (_, before) = b.get("/api/v1/status/buffers").await;
    assert_eq!((before["available"].clone(), before["files"].clone(), before["pending"].clone()), (json!(true), json!(0), json!(false)));
    b.post("/api/v1/system/maintenance", json!({"enabled": true})).await;
    let (status, r) = b.post("/api/v1/push", json!({"items": [{"queue": "buf", "payload": "x"}, {"queue": "buf", "payload": "y"}]})).await;
    assert_eq!((status, r[0]["status"].clone()), (201, json!("buffered")));
    let (status, during) = b.get("/api/v1/status/buffers").await;
    assert_eq!(status, 200);
    assert_eq!((during["files"].clone(), during["pending"].clone(), during["pushMaintenance"].clone()), (json!(1), json!(true), json!(true)));
    let on_disk: u64 = std::fs::read_dir(b.spool_dir().unwrap()).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    assert_eq!(during["bytes"], on_disk, "the bytes of the file on disk");
    assert_eq!(during["dir"], b.spool_dir().unwrap().display().to_string());

    let (status, page) = b.get("/status").await;
    assert_eq!(status, 200);
    assert_eq!(page["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(page["database"]["reachable"], true);
    assert_eq!(page["database"]["embedded"], false);
    assert_eq!(page["maintenance"], json!({"push": true, "pop": false}));
    assert_eq!(page["spool"]["files"], 1);
    assert_eq!(page["encryption"], json!({"enabled": false, "keyId": null}));
    assert!(page["uptimeSeconds"].as_u64().is_some());

    b.post("/api/v1/system/maintenance", json!({"enabled": false})).await;
    eventually("the spool to drain", Duration::from_secs(10), || async {
        let (_, after) = b.get("/api/v1/status/buffers").await;
        after["files"] == 0 && after["pending"] == false
    })
    .await;
    assert_eq!(b.get("/status").await.1["maintenance"]["push"], false);
}

/// The spool files of `dir` (not the quarantine folder).
fn spool_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "jsonl")).collect();
    files.sort();
    files
}

/// Issue 45: a line that does not parse in the middle of a spool file was
/// skipped and the file deleted, losing pushes answered `201 buffered`. Now
/// only a torn last line is skipped; anything else moves the file, whole,
/// to `quarantine/`, says so in the log and counts in the buffers' page.
#[tokio::test]
async fn a_spool_file_with_a_bad_line_is_quarantined_whole_and_a_torn_tail_is_skipped() {
    let b = Broker::start_with(&[("STATS_INTERVAL_MS", "200")]).await;
    let dir = b.spool_dir().expect("a private spool").to_path_buf();
    let push = |n: i64| b.post("/api/v1/push", json!({"items": [{"queue": "sq", "partition": "p", "payload": n}]}));
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    for n in 0..3 {
        assert_eq!(push(n).await.1[0]["status"], "buffered");
    }
    let files = spool_files(&dir);
    assert_eq!(files.len(), 1);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three requests");
    lines[2] = "[{\"queue\": \"sq\", \"partition\": \"p\", \"transac";
    std::fs::write(&files[0], lines.join("\n") + "\n").unwrap();
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": false})).await.0, 200);
    eventually("the file to be quarantined", Duration::from_secs(10), || async { b.get("/api/v1/status/buffers").await.1["quarantined"] == 1 }).await;
    let kept = dir.join("quarantine").join(files[0].file_name().unwrap());
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), lines.join("\n") + "\n", "kept whole, as it was");
    assert_eq!(segment_count(&b).await, 0, "none of it replayed: not a part of it, then deleted");
    assert_eq!(b.logs().iter().filter(|l| l.contains("moved to quarantine") && l.contains("line=3")).count(), 1, "{:?}", b.logs());
    eventually("the gauge to say 1", Duration::from_secs(10), || async {
        let metrics = String::from_utf8(b.get_bytes("/metrics/prometheus").await.1).unwrap();
        metrics.lines().any(|l| l == "queen_spool_quarantined_files 1")
    })
    .await;

    // A torn last line (a crash mid-append, never answered) is skipped: the rest replays.
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    for n in 10..12 {
        assert_eq!(push(n).await.1[0]["status"], "buffered");
    }
    let file = spool_files(&dir).pop().unwrap();
    let mut f = std::fs::OpenOptions::new().append(true).open(&file).unwrap();
    std::io::Write::write_all(&mut f, b"[{\"queue\":\"sq\",\"parti").unwrap();
    drop(f);
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": false})).await.0, 200);
    let sql = b.sql().await;
    eventually("the two answered pushes to land", Duration::from_secs(10), || async { common::stored_messages(&sql, "sq", "p").await.len() == 2 }).await;
    eventually("the replayed file to go", Duration::from_secs(10), || async { spool_files(&dir).is_empty() }).await;
    assert_eq!(b.get("/api/v1/status/buffers").await.1["quarantined"], 1, "the torn tail did not quarantine anything");
}
