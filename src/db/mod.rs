//! PostgreSQL access: the connection pool, the migration runner, and the
//! error type every database caller shares.
//!
//! Connections come from one `deadpool` pool. Each session is pinned to UTC
//! (timestamps are rendered with a literal `Z`) and carries the configured
//! statement timeout, so a runaway statement is cancelled server-side.

pub mod limiter;
pub mod migrations;
pub mod share;
pub mod tls;

use std::time::{Duration, Instant};

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};


/// A database failure, as callers see it.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// No connection could be had in time (pool exhausted or database down).
    #[error("pool: {}", describe_pool(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// Built by `From`, which notes a read-only answer ([`note_read_only`]).
    #[error("postgres: {}", describe(.0))]
    Pg(tokio_postgres::Error),
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

impl DbError {
    /// PostgreSQL is not there to take work right now: it is down,
    /// restarting, failing over, or the connection reached a standby. The
    /// work did not happen (a COMMIT cut off may have: a retry is then
    /// caught by the dedup window), and the same request sent again once a
    /// primary answers is the right move: HTTP answers 503 and pushes are
    /// spooled. A pool that is merely busy (every connection lent out) is
    /// not an outage: the seeds answer it `500 pool`.
    pub fn unavailable(&self) -> bool {
        use deadpool_postgres::{PoolError, TimeoutType};
        match self {
            DbError::Pool(PoolError::Timeout(TimeoutType::Wait)) => false,
            DbError::Pool(_) => true,
            DbError::Pg(e) => pg_unavailable(e),
            DbError::Config(_) | DbError::Schema(_) | DbError::Unexpected(_) => false,
        }
    }

    /// Whether any other request would have met this error too: an outage,
    /// or a pool with no connection to lend. A shared write (`db::share`)
    /// that fails so answers every request with it instead of retrying
    /// each alone, a timer tick starts over instead of isolating timers, and
    /// a push answers it as every route does.
    pub fn met_by_all(&self) -> bool {
        self.unavailable() || matches!(self, DbError::Pool(_))
    }
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> DbError {
        note_read_only(&e);
        DbError::Pg(e)
    }
}

/// When a session of this process last met `25006` (read-only transaction):
/// it reached a standby, or a primary that was demoted under it.
static READ_ONLY_SEEN: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

/// Notes a read-only answer, so that every pooled connection opened before
/// it is closed at its next checkout instead of lent out again
/// ([`opened_after_read_only`]). Connections are not told apart: the one that
/// met the error is among them, and behind a proxy or a single host name
/// (HAProxy, DNS) its siblings reached the same server. New ones go where
/// the target now leads (`target_session_attrs=read-write` tries every host
/// for the primary). A read-only answer is rare (a failover, a
/// misconfiguration), so re-opening the pool then costs nothing in steady
/// state.
fn note_read_only(e: &tokio_postgres::Error) {
    if e.code() == Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION) {
        *READ_ONLY_SEEN.lock().unwrap() = Some(Instant::now());
    }
}

/// The pool's pre-recycle check: a connection opened before the last
/// read-only answer is never lent out again.
fn opened_after_read_only(created: Instant) -> bool {
    match *READ_ONLY_SEEN.lock().unwrap() {
        Some(seen) => created > seen,
        None => true,
    }
}

/// The PostgreSQL errors that mean "no primary here right now" rather than
/// "this statement is wrong": a closed or broken connection, a failed
/// connect, class 08 (connection exception), class 57P (the server shutting
/// down, crashing, starting up or in recovery: `57P01` is what a fast
/// shutdown or a failover tool sends every session), `25006` (a read-only
/// transaction: the connection reached a standby or a demoted primary) and
/// `53300` (too many connections, typical right after a promotion).
pub fn pg_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.as_db_error() {
        None => true,
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57P") || code == "25006" || code == "53300"
        }
    }
}

/// tokio-postgres shows any server error as just "db error"; what an operator
/// (or a client reading a 500) needs is the server's severity, code and
/// message, or the cause of a connection failure.
/// A pool failure with its cause: a connection that could not be made says
/// why (refused by pg_hba, a certificate rejected, a wrong password), which
/// deadpool's own message leaves out.
fn describe_pool(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(pg) => format!("could not connect: {}", describe(pg)),
        other => other.to_string(),
    }
}

pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// Where the broker's PostgreSQL lives (read by `config`; `db` takes its
/// settings as arguments and imports nothing of the configuration).
#[derive(Debug, Clone, PartialEq)]
pub enum Database {
    /// `QUEEN_DATABASE_URL`: a libpq connection string or URL.
    Url(String),
    /// `PG_HOST` and friends.
    Params { host: String, port: u16, user: String, password: String, dbname: String },
    /// Neither was given: a private cluster under this directory.
    Embedded { data_dir: std::path::PathBuf },
}

/// What the pool is built with (`DB_POOL_SIZE`, `DB_CONNECTION_TIMEOUT`,
/// `QUEEN_STMT_TIMEOUT_MS`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolSettings {
    pub size: usize,
    pub wait: Duration,
    pub statement_timeout: Duration,
}

/// Where and how the broker connects: tokio-postgres' configuration and the
/// TLS connector every connection to it uses (the pool's and the brokers'
/// hint channel's).
#[derive(Clone)]
pub struct Target {
    pub pg: tokio_postgres::Config,
    pub tls: tls::Connector,
}

impl Target {
    /// A target without TLS (the embedded cluster, on a unix socket).
    pub fn plain(mut pg: tokio_postgres::Config) -> Target {
        pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
        Target { pg, tls: tls::disabled() }
    }
}

/// Builds the connection target of an explicitly configured database (the
/// embedded cluster builds its own).
///
/// Several hosts (libpq's `host=a,b`, a URL's `a:5432,b:5432`, or
/// `PG_HOST=a,b`) are tried in order on every new connection. With more than
/// one host and no `target_session_attrs` given, `read-write` is implied:
/// a broker only writes, and after a failover the connection must land on
/// whichever host is the primary now, not on the first that answers.
/// TLS follows libpq's `sslmode` and certificate keys ([`tls`]).
pub fn pg_config(database: &Database) -> Result<Target, DbError> {
    let (mut c, params) = match database {
        Database::Url(url) => {
            let (rest, params) = tls::split(url)?;
            let c = rest.parse().map_err(|e: tokio_postgres::Error| {
                DbError::Config(format!("QUEEN_DATABASE_URL does not parse: {e}"))
            })?;
            (c, params)
        }
        Database::Params { host, port, user, password, dbname } => {
            let mut c = tokio_postgres::Config::new();
            for h in host.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                c.host(h);
            }
            c.port(*port).user(user).password(password).dbname(dbname);
            (c, tls::TlsParams::default())
        }
        Database::Embedded { .. } => {
            return Err(DbError::Config("the embedded cluster supplies its own configuration".into()))
        }
    };
    if c.get_hosts().len() > 1 && c.get_target_session_attrs() == tokio_postgres::config::TargetSessionAttrs::Any {
        c.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    }
    let (connector, mode) = tls::connector(&params)?;
    c.ssl_mode(mode);
    Ok(Target { pg: c, tls: connector })
}

/// Creates the pool. Connections open lazily, so this does not touch the
/// database; the first query does.
pub fn pool(settings: PoolSettings, target: Target) -> Result<Pool, DbError> {
    let Target { mut pg, tls } = target;
    let timeout_ms = settings.statement_timeout.as_millis();
    pg.options(format!("-c TimeZone=UTC -c statement_timeout={timeout_ms}"));
    pg.application_name("queen");
    pg.connect_timeout(Duration::from_secs(5));
    give_up_on_silent_peers(&mut pg);
    let manager = Manager::from_config(pg, tls, ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    });
    Pool::builder(manager)
        .max_size(settings.size)
        .wait_timeout(Some(settings.wait))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .pre_recycle(Hook::sync_fn(|_, metrics| {
            if opened_after_read_only(metrics.created) {
                Ok(())
            } else {
                metrics::counter!(crate::metrics::DB_READ_ONLY_DISCARDS).increment(1);
                Err(HookError::message("opened before PostgreSQL answered read-only (a standby or a demoted primary)"))
            }
        }))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| DbError::Config(e.to_string()))
}

/// TCP's own defaults leave a connection to a machine that vanished (powered
/// off, partitioned: no RST ever comes) open for hours when idle, and a
/// statement sent on it waiting some 15 minutes of retransmissions. Behind a
/// failover that is every pooled connection to the old primary, each
/// holding the request that draws it. Unless the URL sets them (libpq's
/// `keepalives_idle`, `keepalives_interval`, `keepalives_retries`,
/// `tcp_user_timeout`, which tokio-postgres reads in seconds where libpq reads
/// milliseconds), an idle connection is probed after 10 s and given up
/// after three silent probes 5 s apart, and data left unacknowledged for
/// 15 s closes it; a live server's kernel acknowledges in microseconds
/// however busy PostgreSQL is, so this only ever fires on a dead path.
/// (Unix sockets ignore both.)
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub const KEEPALIVE_RETRIES: u32 = 3;
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(15);

fn give_up_on_silent_peers(pg: &mut tokio_postgres::Config) {
    // tokio-postgres's default idle time is 2 hours: anything else was set.
    if pg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        pg.keepalives_idle(KEEPALIVE_IDLE);
    }
    if pg.get_keepalives_interval().is_none() {
        pg.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if pg.get_keepalives_retries().is_none() {
        pg.keepalives_retries(KEEPALIVE_RETRIES);
    }
    if pg.get_tcp_user_timeout().is_none() {
        pg.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
}

/// What one trivial round trip found: the server answers, and whether it is
/// a standby (in recovery: it cannot take a single write).
#[derive(Debug, Clone, Copy)]
pub struct Ping {
    pub in_recovery: bool,
}

/// One trivial round trip: what `/health` asks.
pub async fn ping(pool: &Pool) -> Result<Ping, DbError> {
    let client = pool.get().await?;
    let row = client.query_one("SELECT pg_is_in_recovery()", &[]).await?;
    Ok(Ping { in_recovery: row.get(0) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::config::{Host, TargetSessionAttrs};

    fn params(host: &str) -> Database {
        Database::Params { host: host.into(), port: 5433, user: "u".into(), password: "p".into(), dbname: "d".into() }
    }

    #[test]
    fn several_hosts_are_tried_in_order_and_imply_read_write() {
        let c = pg_config(&params("db1, db2")).unwrap().pg;
        assert_eq!(c.get_hosts(), [Host::Tcp("db1".into()), Host::Tcp("db2".into())]);
        assert_eq!(c.get_ports(), [5433]);
        assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        let c = pg_config(&Database::Url("postgres://u@a:5432,b:5433/q".into())).unwrap().pg;
        assert_eq!(c.get_hosts().len(), 2);
        assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
    }

    #[test]
    fn silent_peers_are_given_up_unless_the_url_says_otherwise() {
        let mut c = pg_config(&params("db1")).unwrap().pg;
        give_up_on_silent_peers(&mut c);
        assert_eq!(c.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(c.get_keepalives_interval(), Some(KEEPALIVE_INTERVAL));
        assert_eq!(c.get_keepalives_retries(), Some(KEEPALIVE_RETRIES));
        assert_eq!(c.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        let url = "postgres://u@a/q?keepalives_idle=60&keepalives_interval=7&keepalives_retries=9&tcp_user_timeout=30";
        let mut c = pg_config(&Database::Url(url.into())).unwrap().pg;
        give_up_on_silent_peers(&mut c);
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(7)));
        assert_eq!(c.get_keepalives_retries(), Some(9));
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(30)));
    }

    #[test]
    fn one_host_keeps_what_was_given() {
        assert_eq!(pg_config(&params("db1")).unwrap().pg.get_target_session_attrs(), TargetSessionAttrs::Any);
        let c = pg_config(&Database::Url("host=/run/pg port=5432 target_session_attrs=read-write".into())).unwrap().pg;
        assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
    }
}
