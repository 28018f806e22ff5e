//! PostgreSQL access: the connection pool, the migration runner, and the
//! error type every database caller shares.
//!
//! Connections come from one `deadpool` pool. Each session is pinned to UTC
//! (timestamps are rendered with a literal `Z`) and carries the configured
//! statement timeout, so a runaway statement is cancelled server-side.

pub mod limiter;
pub mod migrations;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use crate::config::{Config, Database};

/// A database failure, as callers see it.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// No connection could be had in time (pool exhausted or database down).
    #[error("pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("postgres: {}", describe(.0))]
    Pg(#[from] tokio_postgres::Error),
    #[error("invalid database configuration: {0}")]
    Config(String),
    /// The database holds a schema this broker does not serve (a pre-baseline
    /// or a newer one): the message says what to do.
    #[error("{0}")]
    Schema(String),
    /// PostgreSQL answered something the broker's contract with its own
    /// stored functions rules out (a bug, not an outage).
    #[error("unexpected answer from PostgreSQL: {0}")]
    Unexpected(String),
}

/// tokio-postgres shows any server error as just "db error"; what an operator
/// (or a client reading a 500) needs is the server's severity, code and
/// message, or the cause of a connection failure.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// Builds the libpq-level configuration for an explicitly configured database
/// (the embedded cluster builds its own).
pub fn pg_config(database: &Database) -> Result<tokio_postgres::Config, DbError> {
    match database {
        Database::Url(url) => url.parse().map_err(|e: tokio_postgres::Error| {
            DbError::Config(format!("QUEEN_DATABASE_URL does not parse: {e}"))
        }),
        Database::Params { host, port, user, password, dbname } => {
            let mut c = tokio_postgres::Config::new();
            c.host(host).port(*port).user(user).password(password).dbname(dbname);
            Ok(c)
        }
        Database::Embedded { .. } => Err(DbError::Config("the embedded cluster supplies its own configuration".into())),
    }
}

/// Creates the pool. Connections open lazily, so this does not touch the
/// database; the first query does.
pub fn pool(config: &Config, mut pg: tokio_postgres::Config) -> Result<Pool, DbError> {
    let timeout_ms = config.statement_timeout.as_millis();
    pg.options(format!("-c TimeZone=UTC -c statement_timeout={timeout_ms}"));
    pg.application_name("queen");
    pg.connect_timeout(Duration::from_secs(5));
    let manager = Manager::from_config(pg, tokio_postgres::NoTls, ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    });
    Pool::builder(manager)
        .max_size(config.pool_size)
        .wait_timeout(Some(config.pool_wait))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| DbError::Config(e.to_string()))
}

/// One trivial round trip: what `/health` asks.
pub async fn ping(pool: &Pool) -> Result<(), DbError> {
    let client = pool.get().await?;
    client.simple_query("SELECT 1").await?;
    Ok(())
}
