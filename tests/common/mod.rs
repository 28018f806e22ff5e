//! The test harness: one private PostgreSQL cluster per test binary, one
//! database per test, and the real `queen` binary spawned on a random port.
//!
//! The cluster runs under a small shell watchdog whose stdin is a pipe held by
//! the test process: when the process exits, however it exits, the pipe
//! closes, the watchdog stops PostgreSQL and deletes its directory. No test
//! leaves a server behind.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use queen::embedded_pg::{self, as_postgres, SOCKET_PORT};

pub struct Cluster {
    pub socket_dir: PathBuf,
    _watchdog: Mutex<(Child, ChildStdin)>,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// The shared cluster, started on first use.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(start_cluster)
}

fn start_cluster() -> Cluster {
    let bindir = embedded_pg::find_bindir().expect("PostgreSQL server binaries are installed");
    let dir = tempfile::Builder::new().prefix("queen-test-").tempdir_in("/tmp").unwrap().keep();
    let pgdata = dir.join("pgdata");
    embedded_pg::hand_to_postgres(&dir).unwrap();
    embedded_pg::initdb(&bindir, &pgdata, &["--no-sync"]).unwrap();
    // Tests are about the broker, not the disk: skip fsync for speed.
    let options = format!(
        "-k {} -p {SOCKET_PORT} -c listen_addresses= -c fsync=off -c full_page_writes=off -c synchronous_commit=off \
         -c max_connections=500 -c TimeZone=UTC",
        dir.display()
    );
    let (child, stdin) = watched_postgres(&bindir, &pgdata, &options, &dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = Command::new(bindir.join("pg_isready"))
            .arg("-q")
            .arg("-h")
            .arg(&dir)
            .arg("-p")
            .arg(SOCKET_PORT.to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "test PostgreSQL did not start; see {}/pg.log", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    Cluster { socket_dir: dir, _watchdog: Mutex::new((child, stdin)) }
}

/// Runs `postgres -D pgdata <options>` under a small shell watchdog whose
/// stdin is a pipe held by the test process: when the process exits,
/// however it exits, the pipe closes, and the watchdog stops PostgreSQL and
/// deletes `dir` (its log is `dir/pg.log`). No test leaves a server behind.
pub fn watched_postgres(bindir: &Path, pgdata: &Path, options: &str, dir: &Path) -> (Child, ChildStdin) {
    let script = r#"
        "$1" -D "$2" $3 >"$4/pg.log" 2>&1 &
        pid=$!
        read _ignored
        kill -INT $pid
        wait $pid
        rm -rf "$4"
    "#;
    let mut child = as_postgres(Path::new("sh"))
        .arg("-c")
        .arg(script)
        .arg("watchdog")
        .arg(bindir.join("postgres"))
        .arg(pgdata)
        .arg(options)
        .arg(dir)
        .stdin(Stdio::piped())
        .spawn()
        .expect("watchdog starts");
    let stdin = child.stdin.take().unwrap();
    (child, stdin)
}

impl Cluster {
    pub fn url(&self, db: &str) -> String {
        format!("host={} port={} user=postgres dbname={}", self.socket_dir.display(), SOCKET_PORT, db)
    }

    /// A SQL session on database `db`.
    pub async fn connect(&self, db: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url(db), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    /// A fresh, empty database for one test.
    pub async fn create_db(&self) -> String {
        let name = format!("t{}_{}", std::process::id(), NEXT_DB.fetch_add(1, Ordering::SeqCst));
        let admin = self.connect("postgres").await;
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        name
    }
}

/// A running broker process.
pub struct Broker {
    pub url: String,
    pub db: String,
    pub http: reqwest::Client,
    env: Vec<(String, String)>,
    child: Option<Child>,
    logs: Arc<Mutex<Vec<String>>>,
    spool_dir: Option<PathBuf>,
}

impl Broker {
    /// A broker on a fresh database of the shared cluster.
    pub async fn start() -> Broker {
        Broker::start_with(&[]).await
    }

    /// Same, with extra environment variables.
    pub async fn start_with(env: &[(&str, &str)]) -> Broker {
        let c = cluster();
        let db = c.create_db().await;
        let mut all = vec![("QUEEN_DATABASE_URL".to_string(), c.url(&db))];
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Broker::spawn(db, all).await
    }

    /// A broker with exactly this environment (beyond HOST/PORT/logging, and
    /// a private push spool unless FILE_BUFFER_DIR is given).
    pub async fn spawn(db: String, mut env: Vec<(String, String)>) -> Broker {
        let mut spool_dir = None;
        if !env.iter().any(|(k, _)| k == "FILE_BUFFER_DIR") {
            let dir = tempfile::Builder::new().prefix("queen-spool-").tempdir_in("/tmp").unwrap().keep();
            env.push(("FILE_BUFFER_DIR".into(), dir.display().to_string()));
            spool_dir = Some(dir);
        }
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (child, url) = spawn_process(&env, logs.clone()).await;
        Broker { url, db, http: reqwest::Client::new(), env, child: Some(child), logs, spool_dir }
    }

    /// A second broker process on this broker's database, with the default
    /// environment: what several brokers on one PostgreSQL look like.
    pub async fn peer(&self) -> Broker {
        Broker::spawn(self.db.clone(), vec![("QUEEN_DATABASE_URL".to_string(), cluster().url(&self.db))]).await
    }

    /// The private spool directory the harness gave this broker, if any.
    pub fn spool_dir(&self) -> Option<&Path> {
        self.spool_dir.as_deref()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// `kill -9`: no shutdown of any kind.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for the exit; returns the exit code.
    pub async fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        tokio::task::spawn_blocking(move || c.wait().ok().and_then(|s| s.code())).await.unwrap()
    }

    /// Starts the broker again on the same database and environment.
    pub async fn restart(&mut self) {
        self.kill();
        let (child, url) = spawn_process(&self.env, self.logs.clone()).await;
        self.child = Some(child);
        self.url = url;
    }

    /// The broker's `/metrics/prometheus` text.
    pub async fn prometheus(&self) -> String {
        self.http.get(format!("{}/metrics/prometheus", self.url)).send().await.unwrap().text().await.unwrap()
    }

    pub async fn sql(&self) -> tokio_postgres::Client {
        cluster().connect(&self.db).await
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let r = self.http.post(format!("{}{}", self.url, path)).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn post_raw(&self, path: &str, content_type: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
        let r = self
            .http
            .post(format!("{}{}", self.url, path))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.http.get(format!("{}{}", self.url, path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Long-polls parked on this broker now (`/metrics`, `longPolls.parked`).
    pub async fn parked(&self) -> i64 {
        self.get("/metrics").await.1["longPolls"]["parked"].as_i64().expect("/metrics counts parked long-polls")
    }

    /// Waits until at least `n` long-polls are parked here: a wake-up test
    /// acts once the broker says its pop waits, not after a guessed sleep.
    pub async fn until_parked(&self, n: i64) {
        eventually(&format!("{n} parked long-polls"), Duration::from_secs(20), || async { self.parked().await >= n }).await;
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- broker log ---\n{}", self.logs().join("\n"));
        }
        self.kill();
        if let Some(dir) = &self.spool_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Spawns `queen serve` and waits for its "listening on" line.
pub async fn spawn_process(env: &[(String, String)], logs: Arc<Mutex<Vec<String>>>) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_queen"));
    cmd.arg("serve")
        .env_remove("PG_HOST")
        .env_remove("QUEEN_DATABASE_URL")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("LOG_LEVEL", "info")
        .env("QUEEN_LOG_JSON", "false")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("queen binary starts");
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out_logs = logs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                let _ = tx.send(format!("http://{addr}"));
            }
            out_logs.lock().unwrap().push(line);
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            logs.lock().unwrap().push(line);
        }
    });
    let url = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("broker printed its address");
    (child, url)
}

/// Polls `check` until it returns true or the deadline passes.
/// The value of one series (name and labels, as the exposition writes them)
/// in a Prometheus text.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A broker (with `env` on top of the defaults) on a fresh database that
/// counts its stored functions' calls; read them with `calls_after_exit`.
pub async fn broker_counting_calls(env: &[(&str, &str)]) -> Broker {
    let c = cluster();
    let db = c.create_db().await;
    c.connect(&db).await.batch_execute(&format!("ALTER DATABASE {db} SET track_functions = 'pl'")).await.unwrap();
    let mut vars = vec![("QUEEN_DATABASE_URL".to_string(), c.url(&db))];
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Broker::spawn(db, vars).await
}

/// Calls of each `queen` function, by name, once the broker is stopped: a
/// backend flushes its function statistics when it exits, so this waits for
/// the broker's connections to go.
pub async fn calls_after_exit(b: &mut Broker) -> impl Fn(&str) -> i64 {
    b.terminate().await;
    let sql = cluster().connect(&b.db).await;
    eventually("the broker's connections to close", Duration::from_secs(10), || async {
        let others: i64 = sql
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        others == 0
    })
    .await;
    let rows = sql.query("SELECT funcname::text, calls FROM pg_stat_user_functions WHERE schemaname = 'queen'", &[]).await.unwrap();
    let calls: std::collections::HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    move |f| calls.get(f).copied().unwrap_or(0)
}

/// Every frame stored for (queue, partition), in offset order: (offset, frame
/// fields) decoded from the segments as the broker wrote them.
pub async fn stored_messages(sql: &tokio_postgres::Client, queue: &str, partition: &str) -> Vec<StoredMessage> {
    let rows = sql
        .query(
            "SELECT s.base_offset, s.msg_count, s.blob FROM queen.segments s
             JOIN queen.partitions p ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id
             WHERE q.name = $1 AND p.name = $2 ORDER BY s.base_offset",
            &[&queue, &partition],
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    for r in rows {
        let base: i64 = r.get(0);
        let count: i32 = r.get(1);
        let blob: Vec<u8> = r.get(2);
        let frames = queen::log::decompress_frames(&blob, 1 << 30).unwrap();
        let decoded = queen::log::FrameReader::collect_all(&frames).unwrap();
        assert_eq!(decoded.len(), count as usize, "msg_count matches the frames in the blob");
        for (i, f) in decoded.into_iter().enumerate() {
            out.push(StoredMessage {
                offset: base + i as i64,
                message_id: f.message_id.to_string(),
                transaction_id: f.transaction_id.to_string(),
                trace_id: f.trace_id.map(|t| t.to_string()),
                payload: String::from_utf8(f.payload_json().to_vec()).unwrap(),
            });
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    pub offset: i64,
    pub message_id: String,
    pub transaction_id: String,
    pub trace_id: Option<String>,
    pub payload: String,
}

/// A pop answer: status, parsed body (None for an empty body), and whether a
/// Content-Length header came with it.
pub struct Popped {
    pub status: u16,
    pub body: Option<serde_json::Value>,
    pub content_length: Option<String>,
}

impl Popped {
    pub fn messages(&self) -> Vec<serde_json::Value> {
        self.body.as_ref().and_then(|b| b["messages"].as_array().cloned()).unwrap_or_default()
    }
    /// The `data` of every message, in answer order.
    pub fn data(&self) -> Vec<serde_json::Value> {
        self.messages().iter().map(|m| m["data"].clone()).collect()
    }
}

impl Broker {
    /// GET a pop path (with its query string).
    pub async fn pop(&self, path_and_query: &str) -> Popped {
        let r = self.http.get(format!("{}{}", self.url, path_and_query)).send().await.unwrap();
        let status = r.status().as_u16();
        let content_length = r.headers().get("content-length").map(|v| v.to_str().unwrap().to_string());
        let bytes = r.bytes().await.unwrap();
        let body = if bytes.is_empty() { None } else { Some(serde_json::from_slice(&bytes).unwrap()) };
        Popped { status, body, content_length }
    }

    /// Pushes `payloads` to (queue, partition) in one request; asserts 201.
    pub async fn push_to(&self, queue: &str, partition: &str, payloads: &[serde_json::Value]) -> serde_json::Value {
        let items: Vec<serde_json::Value> = payloads
            .iter()
            .map(|p| serde_json::json!({"queue": queue, "partition": partition, "payload": p}))
            .collect();
        let (status, body) = self.post("/api/v1/push", serde_json::json!({ "items": items })).await;
        assert_eq!(status, 201, "{body}");
        body
    }

    /// Stands in for an ack until the ack path exists: commits the cursor of
    /// (partition, group) to `last` and releases the lease, in SQL.
    pub async fn commit_cursor(&self, partition_id: i64, group: &str, last: i64) {
        self.sql()
            .await
            .execute(
                "UPDATE queen.consumers SET committed = $3, worker_id = NULL, lease_expires_at = NULL, batch_end = NULL
                 WHERE partition_id = $1 AND consumer_group = $2",
                &[&partition_id, &group, &last],
            )
            .await
            .unwrap();
    }
}

impl Broker {
    /// POST /api/v1/ack/batch with (transactionId, partitionId, status, leaseId) items.
    pub async fn ack_batch(&self, group: Option<&str>, items: &[(&str, &str, &str, Option<&str>)]) -> Vec<serde_json::Value> {
        let acks: Vec<serde_json::Value> = items
            .iter()
            .map(|(t, p, s, l)| {
                let mut a = serde_json::json!({"transactionId": t, "partitionId": p, "status": s, "error": null});
                if let Some(l) = l {
                    a["leaseId"] = serde_json::json!(l);
                }
                a
            })
            .collect();
        let (status, body) =
            self.post("/api/v1/ack/batch", serde_json::json!({"acknowledgments": acks, "consumerGroup": group})).await;
        assert_eq!(status, 200, "{body}");
        body.as_array().expect("an array").clone()
    }

    /// The cursor row of (partition, group): committed, lease holder, retry count.
    pub async fn cursor(&self, partition_id: &str, group: &str) -> (i64, Option<String>, i32) {
        let pid: i64 = partition_id.parse().unwrap();
        let r = self
            .sql()
            .await
            .query_one(
                "SELECT committed, worker_id, retry_count FROM queen.consumers WHERE partition_id = $1 AND consumer_group = $2",
                &[&pid, &group],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    }
}

/// The two candidate modes every seed statement must hold in: the broker's
/// hot-list (the default) and the SQL candidate scan (`QUEEN_HOTLIST=false`).
pub const CANDIDATE_MODES: [(&str, &str); 2] = [("hot-list", "true"), ("SQL scan", "false")];

/// One broker per candidate mode, each on its own database, with `env` besides.
pub async fn brokers_in_both_modes(env: &[(&str, &str)]) -> Vec<(&'static str, Broker)> {
    let mut out = Vec::new();
    for (mode, hotlist) in CANDIDATE_MODES {
        let mut all = vec![("QUEEN_HOTLIST", hotlist)];
        all.extend_from_slice(env);
        out.push((mode, Broker::start_with(&all).await));
    }
    out
}

impl Broker {
    /// GET a path: status and the body's exact bytes.
    pub async fn get_bytes(&self, path: &str) -> (u16, Vec<u8>) {
        let r = self.http.get(format!("{}{}", self.url, path)).send().await.unwrap();
        (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
    }

    /// A queue's row as `GET /api/v1/resources/queues/{q}` shows its options.
    pub async fn queue_options(&self, queue: &str) -> serde_json::Value {
        let (status, body) = self.get(&format!("/api/v1/resources/queues/{queue}")).await;
        assert_eq!(status, 200, "{body}");
        body["options"].clone()
    }
}

/// A broker in one candidate mode: the hot-list ring (`true`) or the SQL scan.
pub async fn broker_in_mode(hotlist: bool) -> Broker {
    Broker::start_with(&[("QUEEN_HOTLIST", if hotlist { "true" } else { "false" })]).await
}

/// `s` percent-encoded for a query string.
pub fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("v", s)]).unwrap()[2..].to_string()
}

/// Runs each named scenario `async fn name(hotlist: bool)` once per candidate
/// mode, as `name::hotlist` and `name::sql_scan`.
#[allow(unused_macros)]
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {
        $(mod $name {
            #[tokio::test]
            async fn hotlist() {
                super::$name(true).await
            }
            #[tokio::test]
            async fn sql_scan() {
                super::$name(false).await
            }
        })*
    };
}

/// A `QPB1` flag-8 body with one group of (transactionId, payload) frames,
/// compressed at `level`; returns the body, the group's blob and the ids.
pub fn flag8_body(queue: &str, partition: &str, frames: &[(&str, &str)], level: i32) -> (Vec<u8>, Vec<u8>, Vec<uuid::Uuid>) {
    let mut raw = Vec::new();
    let mut ids = Vec::new();
    for (txn, payload) in frames {
        let id = uuid::Uuid::now_v7();
        ids.push(id);
        queen::log::Frame { message_id: id, trace_id: None, transaction_id: txn, producer_sub: None, encrypted: false, payload: payload.as_bytes() }
            .encode_into(&mut raw).expect("test frame fits");
    }
    let z = queen::log::compress_frames(&raw, level);
    let mut b = b"QPB1".to_vec();
    b.push(8);
    b.extend_from_slice(&1u32.to_le_bytes());
    for name in [queue, partition] {
        b.extend_from_slice(&(name.len() as u16).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
    }
    b.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    b.extend_from_slice(&(z.len() as u32).to_le_bytes());
    b.extend_from_slice(&z);
    (b, z, ids)
}

/// A `QTB1` body: `head` (the JSON bundle without its pushes) and one framed
/// group of one message to `queue`.
pub fn qtb1(head: &serde_json::Value, queue: &str, txn: &str) -> Vec<u8> {
    let mut raw = Vec::new();
    queen::log::Frame { message_id: uuid::Uuid::now_v7(), trace_id: None, transaction_id: txn, producer_sub: None, encrypted: false, payload: b"\"result\"" }
        .encode_into(&mut raw).expect("test frame fits");
    let z = queen::log::compress_frames(&raw, 3);
    let head = head.to_string();
    let mut b = b"QTB1\0".to_vec();
    b.extend_from_slice(&(head.len() as u32).to_le_bytes());
    b.extend_from_slice(head.as_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    for name in [queue, "Default"] {
        b.extend_from_slice(&(name.len() as u16).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
    }
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(z.len() as u32).to_le_bytes());
    b.extend_from_slice(&z);
    b
}
