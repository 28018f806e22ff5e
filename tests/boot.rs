//! Boot, migrations and health (issue 2).

mod common;

use std::process::Command;

use common::{cluster, Broker};

#[tokio::test]
async fn health_is_200_when_the_database_answers() {
    let b = Broker::start().await;
    let (status, body) = b.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "healthy");
    assert_eq!(body["database"], "connected");
    assert!(body["version"].is_string());
}

#[tokio::test]
async fn health_is_503_json_when_the_database_is_unreachable() {
    let env = vec![
        ("QUEEN_DATABASE_URL".to_string(), "host=/nonexistent-socket-dir port=5432 user=postgres dbname=x".to_string()),
        ("QUEEN_APPLY_SCHEMA".to_string(), "false".to_string()),
        ("DB_CONNECTION_TIMEOUT".to_string(), "500".to_string()),
    ];
    let b = Broker::spawn("none".into(), env).await;
    let (status, body) = b.get("/health").await;
    assert_eq!(status, 503);
    assert_eq!(body["status"], "unhealthy");
    assert_eq!(body["database"], "disconnected");
}

#[tokio::test]
async fn two_brokers_booting_together_apply_each_migration_once() {
    let c = cluster();
    let db = c.create_db().await;
    let env = vec![("QUEEN_DATABASE_URL".to_string(), c.url(&db))];
    let (a, b) = tokio::join!(Broker::spawn(db.clone(), env.clone()), Broker::spawn(db.clone(), env));
    let sql = a.sql().await;
    let versions: Vec<i32> =
        sql.query("SELECT version FROM queen.schema_migrations ORDER BY version", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    let expected: Vec<i32> = (1..=queen::db::migrations::MIGRATIONS.len() as i32).collect();
    assert_eq!(versions, expected);
    for broker in [&a, &b] {
        assert_eq!(broker.get("/health").await.0, 200);
    }
}

#[tokio::test]
async fn migrate_applies_the_schema_and_exits() {
    let c = cluster();
    let db = c.create_db().await;
    let out = Command::new(env!("CARGO_BIN_EXE_queen"))
        .arg("migrate")
        .env_remove("PG_HOST")
        .env("QUEEN_DATABASE_URL", c.url(&db))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sql = c.connect(&db).await;
    let n: i64 = sql.query_one("SELECT count(*) FROM queen.schema_migrations", &[]).await.unwrap().get(0);
    assert_eq!(n as usize, queen::db::migrations::MIGRATIONS.len());
    let tables: i64 = sql
        .query_one("SELECT count(*) FROM pg_tables WHERE schemaname = 'queen' AND tablename = ANY($1)", &[&vec![
            "queues", "partitions", "segments", "txn_index", "consumers", "subscriptions", "dead_letters",
        ]])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 7);
    let opts: Vec<String> = sql
        .query("SELECT unnest(reloptions) FROM pg_class WHERE relname IN ('partitions','consumers') ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(opts.iter().filter(|o| *o == "vacuum_truncate=off").count(), 2, "{opts:?}");
}

#[test]
fn a_malformed_variable_stops_the_boot_with_one_line_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_queen")).arg("serve").env("PORT", "http").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim(), "queen: invalid PORT=\"http\": expected a port number 0-65535");
    let out = Command::new(env!("CARGO_BIN_EXE_queen")).env("QUEEN_APPLY_SCHEMA", "perhaps").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("QUEEN_APPLY_SCHEMA"));
}

#[test]
fn help_explains_every_command_and_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_queen")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for word in ["serve", "migrate", "QUEEN_DATABASE_URL", "PG_HOST", "QUEEN_MAX_BODY_BYTES", "QUEEN_DATA_DIR", "DB_POOL_SIZE"] {
        assert!(help.contains(word), "--help lacks {word}");
    }
}

/// Issue 26: a database the pre-baseline schema created is refused at boot
/// with one line saying what to do; `queen migrate --reset` changes nothing
/// without `--yes`, and with it recreates the schema so the broker boots.
#[tokio::test]
async fn a_pre_baseline_database_is_refused_at_boot_until_migrate_reset_yes() {
    let c = cluster();
    let db = c.create_db().await;
    let sql = c.connect(&db).await;
    sql.batch_execute(
        "CREATE SCHEMA queen;
         CREATE TABLE queen.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                                               applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO queen.schema_migrations (version, name) VALUES (1, '0001_log_schema.sql'), (2, '0002_push.sql');
         CREATE TABLE queen.queues (id bigint, name text);
         INSERT INTO queen.queues VALUES (1, 'from-before');",
    )
    .await
    .unwrap();
    let queen = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_queen"))
            .args(args)
            .env_remove("PG_HOST")
            .env("QUEEN_DATABASE_URL", c.url(&db))
            .env("PORT", "0")
            .output()
            .unwrap()
    };
    let out = queen(&["serve"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("queen: ")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("pre-baseline") && lines[0].contains("queen migrate --reset --yes"), "{err}");
    let kept = || async { sql.query_one("SELECT name FROM queen.queues", &[]).await.map(|r| r.get::<_, String>(0)) };
    assert_eq!(kept().await.unwrap(), "from-before", "the refusal changed nothing");

    let out = queen(&["migrate", "--reset"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reset --yes"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(kept().await.unwrap(), "from-before", "no --yes, nothing dropped");

    let out = queen(&["migrate", "--reset", "--yes"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names: Vec<String> =
        sql.query("SELECT name FROM queen.schema_migrations ORDER BY version", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    let ours: Vec<&str> = queen::db::migrations::MIGRATIONS.iter().map(|m| m.name).collect();
    assert_eq!(names, ours);
    assert!(kept().await.is_err(), "the old rows went with the old schema");

    let b = Broker::spawn(db.clone(), vec![("QUEEN_DATABASE_URL".to_string(), c.url(&db))]).await;
    b.push_to("fresh", "p", &[serde_json::json!(1)]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/fresh").await.data(), [serde_json::json!(1)]);
}
