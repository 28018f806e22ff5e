//! The embedded default (issue 2): with no database configured, `queen serve`
//! runs its own cluster under QUEEN_DATA_DIR, reuses it on the next start,
//! and recovers after being killed.

mod common;

use std::path::{Path, PathBuf};

use common::Broker;
use queen::embedded_pg::{as_postgres, find_bindir};
use serde_json::json;

/// A data directory whose cluster is stopped and removed even if the test fails.
struct DataDir(PathBuf);

impl DataDir {
    fn new() -> DataDir {
        DataDir(tempfile::Builder::new().prefix("queen-embedded-").tempdir_in("/tmp").unwrap().keep())
    }
    fn env(&self) -> Vec<(String, String)> {
        vec![("QUEEN_DATA_DIR".to_string(), self.0.display().to_string())]
    }
    fn pid_file(&self) -> PathBuf {
        self.0.join("pgdata/postmaster.pid")
    }
    fn cluster_running(&self) -> bool {
        as_postgres(&find_bindir().unwrap().join("pg_ctl"))
            .arg("status")
            .arg("-D")
            .arg(self.0.join("pgdata"))
            .output()
            .unwrap()
            .status
            .success()
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = as_postgres(&find_bindir().unwrap().join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-D"])
            .arg(self.0.join("pgdata"))
            .output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn push_one(b: &Broker, txn: &str) -> String {
    let (status, body) = b.post("/api/v1/push", json!({"items": [{"queue": "e", "payload": txn, "transactionId": txn}]})).await;
    assert_eq!(status, 201, "{body}");
    body[0]["status"].as_str().unwrap().to_string()
}

fn exists(p: &Path) -> bool {
    p.exists()
}

#[tokio::test]
async fn the_embedded_default_starts_from_an_empty_dir_and_reuses_its_data() {
    let dir = DataDir::new();
    let mut b = Broker::spawn("embedded".into(), dir.env()).await;
    assert!(exists(&dir.0.join("pgdata/PG_VERSION")), "initdb ran");
    assert!(b.logs().iter().any(|l| l.contains("data lives in")), "one line says where the data lives");
    assert_eq!(b.get("/health").await.0, 200);
    assert_eq!(push_one(&b, "first").await, "queued");
    // The cluster runs with the broker's tuning, not PostgreSQL's defaults.
    let mut pg = tokio_postgres::Config::new();
    pg.host_path(dir.0.join("run")).port(queen::embedded_pg::SOCKET_PORT).user("postgres").dbname("postgres");
    let (sql, conn) = pg.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    for (name, value) in queen::embedded_pg::TUNING {
        let shown: String = sql.query_one(&format!("SHOW {name}"), &[]).await.unwrap().get(0);
        assert_eq!(shown.to_lowercase(), value.to_lowercase(), "{name}");
    }
    let fsync: String = sql.query_one("SHOW fsync", &[]).await.unwrap().get(0);
    assert_eq!(fsync, "on", "durability is not traded for speed");
    drop(sql);
    assert_eq!(b.terminate().await, Some(0));
    assert!(!dir.cluster_running(), "a graceful shutdown stops the cluster");

    let mut again = Broker::spawn("embedded".into(), dir.env()).await;
    assert!(!again.logs().iter().any(|l| l.contains("initializing")), "no second initdb");
    assert_eq!(push_one(&again, "first").await, "duplicate", "the data survived the restart");
    assert_eq!(again.terminate().await, Some(0));
}

#[tokio::test]
async fn after_the_broker_is_killed_the_next_start_reuses_the_running_cluster() {
    let dir = DataDir::new();
    let mut b = Broker::spawn("embedded".into(), dir.env()).await;
    assert_eq!(push_one(&b, "before-kill").await, "queued");
    b.kill();
    assert!(dir.cluster_running(), "the cluster outlives a killed broker");

    let mut again = Broker::spawn("embedded".into(), dir.env()).await;
    assert!(again.logs().iter().any(|l| l.contains("already running")));
    assert_eq!(push_one(&again, "before-kill").await, "duplicate");
    assert_eq!(again.terminate().await, Some(0));
    assert!(!dir.cluster_running());
}

#[tokio::test]
async fn a_stale_pid_file_is_cleared_on_start() {
    let dir = DataDir::new();
    let mut b = Broker::spawn("embedded".into(), dir.env()).await;
    assert_eq!(push_one(&b, "x").await, "queued");
    assert_eq!(b.terminate().await, Some(0));
    // What a machine crash leaves behind: a pid file naming a dead process.
    std::fs::write(dir.pid_file(), "999999\n/nowhere\n").unwrap();
    let mut again = Broker::spawn("embedded".into(), dir.env()).await;
    assert_eq!(push_one(&again, "x").await, "duplicate");
    assert_eq!(again.terminate().await, Some(0));
}

/// Runs a second `queen serve` on `dir` and waits (bounded) for it to exit:
/// its exit code, its stderr and how long it ran.
fn second_broker(dir: &Path, port: &str) -> (Option<i32>, String, std::time::Duration) {
    use std::process::{Command, Stdio};
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_queen"))
        .arg("serve")
        .env_remove("PG_HOST")
        .env_remove("QUEEN_DATABASE_URL")
        .env("QUEEN_DATA_DIR", dir)
        .env("HOST", "127.0.0.1")
        .env("PORT", port)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = started + std::time::Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (code, err, started.elapsed())
}

#[tokio::test]
async fn a_second_broker_on_the_same_data_dir_exits_at_once_and_never_touches_the_cluster() {
    let dir = DataDir::new();
    let mut first = Broker::spawn("embedded".into(), dir.env()).await;
    assert_eq!(push_one(&first, "before").await, "queued");
    let first_port = first.url.rsplit(':').next().unwrap().to_string();
    // On the first's port (the bind would fail) and on a free one (it would share the cluster).
    for port in [first_port.as_str(), "0"] {
        let d = dir.0.clone();
        let p = port.to_string();
        let (code, err, took) = tokio::task::spawn_blocking(move || second_broker(&d, &p)).await.unwrap();
        assert_eq!(code, Some(1), "port {port}: the second broker exits with an error: {err}");
        assert!(took < std::time::Duration::from_secs(10), "port {port}: at once, not after {took:?}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        let canonical = dir.0.canonicalize().unwrap();
        assert!(lines[0].contains(&canonical.display().to_string()), "names the directory: {}", lines[0]);
        assert!(lines[0].contains(&format!("pid {}", first.pid())), "names the owner's PID: {}", lines[0]);
        assert!(dir.cluster_running(), "port {port}: the first broker's cluster still runs");
        assert_eq!(push_one(&first, &format!("after-{port}")).await, "queued", "and the first broker still serves");
    }
    // With its database gone, the first broker answers pops with the documented outage answer.
    as_postgres(&find_bindir().unwrap().join("pg_ctl")).args(["stop", "-m", "fast", "-w", "-D"]).arg(dir.0.join("pgdata")).output().unwrap();
    let r = first.http.get(format!("{}/api/v1/pop/queue/e?wait=false", first.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body = r.json::<serde_json::Value>().await.unwrap();
    assert_eq!(body["code"], "database_unavailable", "{body}");
    assert_eq!(first.terminate().await, Some(0));
    // The lock went with its owner: a broker starts on the directory again.
    let mut again = Broker::spawn("embedded".into(), dir.env()).await;
    assert_eq!(push_one(&again, "before").await, "duplicate");
    assert_eq!(again.terminate().await, Some(0));
}
