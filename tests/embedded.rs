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
