//! TLS between the broker and PostgreSQL (issue 45): a private cluster on
//! 127.0.0.1 with `ssl=on` and certificates made here by `openssl` (a CA, a
//! server certificate for `localhost` only, a client certificate), whose
//! `pg_hba.conf` refuses every TCP connection that is not TLS. The broker
//! reaches it with libpq's `sslmode` values in its URL, and each mode
//! accepts or refuses the server's certificate as libpq would.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{eventually, Broker};
use queen::embedded_pg::{as_postgres, find_bindir, hand_to_postgres, initdb, run};
use serde_json::json;

/// The TLS cluster, shared by this file's tests (each has its database).
struct TlsCluster {
    dir: PathBuf,
    bindir: PathBuf,
    port: u16,
    /// The watchdog's stdin: when this test process exits the pipe closes,
    /// and the watchdog stops PostgreSQL and removes its directory.
    _watchdog: std::sync::Mutex<(std::process::Child, std::process::ChildStdin)>,
}

static TLS: OnceLock<TlsCluster> = OnceLock::new();

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A self-signed CA: `name.pem`, `name.key`.
fn ca(dir: &Path, name: &str) {
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    openssl(dir, &[
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
        "-subj", &format!("/CN={name}"), "-keyout", &key, "-out", &pem,
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    ]);
}

/// A certificate for `cn` signed by `ca_name`, with extensions `ext`:
/// `name.pem`, `name.key`.
fn leaf(dir: &Path, ca_name: &str, name: &str, cn: &str, ext: &str) {
    let (key, csr, pem, extfile) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
    std::fs::write(dir.join(&extfile), format!("{ext}\n")).unwrap();
    openssl(dir, &["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", &format!("/CN={cn}"), "-keyout", &key, "-out", &csr]);
    openssl(dir, &[
        "x509", "-req", "-in", &csr, "-CA", &format!("{ca_name}.pem"), "-CAkey", &format!("{ca_name}.key"),
        "-CAcreateserial", "-days", "2", "-extfile", &extfile, "-out", &pem,
    ]);
}

fn tls_cluster() -> &'static TlsCluster {
    TLS.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("queen-tls-").tempdir_in("/tmp").unwrap().keep();
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::create_dir_all(dir.join("run")).unwrap();
        ca(&certs, "ca");
        ca(&certs, "other-ca");
        // The server's certificate names localhost only: dialling 127.0.0.1
        // is a name mismatch (verify-full refuses it, verify-ca does not).
        leaf(&certs, "ca", "server", "localhost", "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth");
        leaf(&certs, "ca", "client", "certuser", "extendedKeyUsage=clientAuth");
        let bindir = find_bindir().unwrap();
        hand_to_postgres(&dir).unwrap();
        let pgdata = dir.join("pgdata");
        initdb(&bindir, &pgdata, &["--no-sync"]).unwrap();
        std::fs::write(
            pgdata.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all certuser 127.0.0.1/32 cert\n\
             hostssl all all 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 reject\n",
        )
        .unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let c = |f: &str| certs.join(f).display().to_string();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off -c synchronous_commit=off -c max_connections=200 \
             -c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c ssl_ca_file={}",
            dir.join("run").display(),
            c("server.pem"),
            c("server.key"),
            c("ca.pem"),
        );
        // The server's key must be private to the server's user.
        run(Command::new("chmod").arg("600").arg(certs.join("server.key"))).unwrap();
        hand_to_postgres(&dir).unwrap();
        let (child, stdin) = common::watched_postgres(&bindir, &pgdata, &options, &dir);
        let ready = || {
            Command::new(bindir.join("pg_isready")).args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()]).status().is_ok_and(|s| s.success())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !ready() {
            assert!(std::time::Instant::now() < deadline, "TLS PostgreSQL did not start; see {}/pg.log", dir.display());
            std::thread::sleep(Duration::from_millis(100));
        }
        let cluster = TlsCluster { dir, bindir, port, _watchdog: std::sync::Mutex::new((child, stdin)) };
        cluster.psql("CREATE ROLE certuser SUPERUSER LOGIN");
        cluster
    })
}

impl TlsCluster {
    fn cert(&self, f: &str) -> String {
        self.dir.join("certs").join(f).display().to_string()
    }

    /// Runs SQL on the unix socket as postgres.
    fn psql(&self, sql: &str) {
        run(as_postgres(&self.bindir.join("psql"))
            .arg("-h")
            .arg(self.dir.join("run"))
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql]))
        .unwrap();
    }

    fn query(&self, sql: &str) -> String {
        let out = run(as_postgres(&self.bindir.join("psql"))
            .arg("-h")
            .arg(self.dir.join("run"))
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres", "-qAt", "-c", sql]))
        .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn create_db(&self, name: &str) -> String {
        let db = format!("{name}_{}", std::process::id());
        self.psql(&format!("CREATE DATABASE {db}"));
        db
    }
}

/// A broker on a fresh database of the TLS cluster, reached at `host` with
/// these TLS parameters (query-string form).
async fn broker(name: &str, host: &str, user: &str, params: &str) -> Broker {
    let c = tls_cluster();
    let db = c.create_db(name);
    let url = format!("postgres://{user}@{host}:{}/{db}?{params}", c.port);
    Broker::spawn(db, vec![("QUEEN_DATABASE_URL".into(), url)]).await
}

/// The broker serves: a push is stored and popped back.
async fn round_trip(b: &Broker) {
    eventually("the database to answer", Duration::from_secs(30), || async { b.get("/health").await.0 == 200 }).await;
    let (status, body) = b.post("/api/v1/push", json!({"items": [{"queue": "tls", "payload": {"over": "tls"}}]})).await;
    assert_eq!(status, 201, "{body}");
    let popped = b.pop("/api/v1/pop/queue/tls?autoAck=true").await;
    assert_eq!(popped.data(), [json!({"over": "tls"})]);
}

/// Every connection the broker holds to `db` is TLS (pg_stat_ssl).
fn all_encrypted(db: &str) -> (i64, i64) {
    let out = tls_cluster().query(&format!(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.datname = '{db}' AND a.application_name = 'queen'"
    ));
    let (n, ssl) = out.split_once('|').unwrap();
    (n.parse().unwrap(), ssl.parse().unwrap())
}

/// A broker given these TLS parameters never reaches the database: its log
/// says why (the boot retries a connection for 30 s, logging each failure,
/// then gives up), and it never listens.
fn refused(name: &str, host: &str, user: &str, params: &str, why: &str) {
    let c = tls_cluster();
    let db = c.create_db(name);
    let url = format!("postgres://{user}@{host}:{}/{db}?{params}", c.port);
    let mut child = Command::new(env!("CARGO_BIN_EXE_queen"))
        .arg("serve")
        .env_remove("PG_HOST")
        .env("QUEEN_DATABASE_URL", url)
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("QUEEN_LOG_JSON", "false")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    for pipe in [Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>, Box::new(child.stderr.take().unwrap())] {
        let lines = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        });
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let found = loop {
        let text = lines.lock().unwrap().join("\n");
        if text.to_lowercase().contains(why) || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(found.to_lowercase().contains(why), "the log names the reason ({why}):\n{found}");
    assert!(!found.contains("listening on"), "the broker served without its database:\n{found}");
}

#[tokio::test]
async fn require_encrypts_without_checking_the_certificate() {
    let b = broker("req", "127.0.0.1", "postgres", "sslmode=require").await;
    round_trip(&b).await;
    let (n, ssl) = all_encrypted(&b.db);
    assert!(n > 0 && n == ssl, "{ssl} of {n} connections are TLS");
}

#[tokio::test]
async fn the_default_mode_prefers_tls_when_the_server_offers_it() {
    // pg_hba refuses plain TCP: the broker only gets in because prefer
    // (libpq's default) encrypts.
    let b = broker("pref", "127.0.0.1", "postgres", "application_name=x").await;
    round_trip(&b).await;
}

#[tokio::test]
async fn disable_is_plain_and_the_server_refuses_it() {
    refused("dis", "127.0.0.1", "postgres", "sslmode=disable", "no encryption");
}

#[tokio::test]
async fn verify_full_accepts_the_right_ca_and_name() {
    let c = tls_cluster();
    let b = broker("vf", "localhost", "postgres", &format!("sslmode=verify-full&sslrootcert={}", c.cert("ca.pem"))).await;
    round_trip(&b).await;
    let (n, ssl) = all_encrypted(&b.db);
    assert!(n > 0 && n == ssl, "{ssl} of {n} connections are TLS");
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_for_another_name() {
    let c = tls_cluster();
    refused("vfn", "127.0.0.1", "postgres", &format!("sslmode=verify-full&sslrootcert={}", c.cert("ca.pem")), "not valid for name");
}

#[tokio::test]
async fn verify_ca_checks_the_chain_but_not_the_name() {
    let c = tls_cluster();
    let good = broker("vca", "127.0.0.1", "postgres", &format!("sslmode=verify-ca&sslrootcert={}", c.cert("ca.pem"))).await;
    round_trip(&good).await;
    refused("vcab", "127.0.0.1", "postgres", &format!("sslmode=verify-ca&sslrootcert={}", c.cert("other-ca.pem")), "unknownissuer");
}

#[tokio::test]
async fn require_with_a_root_certificate_checks_the_chain_as_libpq_does() {
    let c = tls_cluster();
    refused("reqca", "127.0.0.1", "postgres", &format!("sslmode=require&sslrootcert={}", c.cert("other-ca.pem")), "unknownissuer");
}

#[tokio::test]
async fn a_client_certificate_authenticates_its_user() {
    let c = tls_cluster();
    let params = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        c.cert("ca.pem"),
        c.cert("client.pem"),
        c.cert("client.key")
    );
    let b = broker("cert", "localhost", "certuser", &params).await;
    round_trip(&b).await;
    // Without the certificate, certuser is refused (pg_hba: cert).
    refused("nocert", "localhost", "certuser", &format!("sslmode=verify-full&sslrootcert={}", c.cert("ca.pem")), "certificate");
}

/// A TLS setting that cannot work stops the boot with one line naming it.
#[test]
fn a_bad_tls_setting_stops_the_boot_with_its_reason() {
    for (url, says) in [
        ("postgres://u@127.0.0.1:1/db?sslmode=verify_full", "sslmode=\"verify_full\""),
        ("host=127.0.0.1 port=1 sslmode=verify-full sslrootcert=/nonexistent/ca.pem", "sslrootcert /nonexistent/ca.pem"),
        ("postgres://u@127.0.0.1:1/db?sslcert=/x.pem", "sslcert and sslkey go together"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_queen"))
            .arg("serve")
            .env_remove("PG_HOST")
            .env("QUEEN_DATABASE_URL", url)
            .env("HOST", "127.0.0.1")
            .env("PORT", "0")
            .env("QUEEN_LOG_JSON", "false")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{url}: the broker booted");
        assert!(text.contains(says), "{url}: the error names it ({says}):\n{text}");
    }
}
