//! Configuration: every environment variable the broker honours, parsed and
//! validated once at boot into typed values. Nothing else reads the
//! environment.
//!
//! A malformed value stops the boot with one line naming the variable and what
//! it expected, because a broker that silently falls back to a default is
//! worse than one that refuses to start.

use std::path::PathBuf;
use std::time::Duration;

pub use crate::db::Database;

/// The coalescer's bounds (API.md §5.3, `QUEEN_V2_FUSION_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct CoalesceConfig {
    /// How long the first write of an idle partition waits for company.
    pub hold: Duration,
    /// Most frames one segment carries.
    pub max_frames: usize,
    /// Most uncompressed frame bytes one segment carries.
    pub max_bytes: usize,
    /// zstd level of segment compression.
    pub zstd_level: i32,
    /// Most group writes (transactions of several lanes' segments) in flight.
    pub group_writers: usize,
    /// Most transactionId hashes the broker keeps in memory for the dedup
    /// windows of the partitions it writes (`push::dedup`).
    pub dedup_entries: usize,
}

/// Where a named group starts when its first pop names no subscription mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionMode {
    /// The whole retained backlog.
    All,
    /// Only what is pushed from now on.
    New,
}

impl SubscriptionMode {
    /// Every spelling a Queen client or broker configuration sends, in any
    /// case: the 2.x clients' `all` and `new`, the older clients'
    /// `from_beginning`, and upstream's aliases of `new` (docs/DECISIONS.md,
    /// "Spellings the broker reads"). The one home of the rule: the pop
    /// query and `DEFAULT_SUBSCRIPTION_MODE` both parse through here.
    pub const SPELLINGS: &'static [(&'static str, SubscriptionMode)] = &[
        ("all", SubscriptionMode::All),
        ("from_beginning", SubscriptionMode::All),
        ("from-beginning", SubscriptionMode::All),
        ("new", SubscriptionMode::New),
        ("new-only", SubscriptionMode::New),
        ("new_only", SubscriptionMode::New),
    ];

    /// The mode a spelling names (empty = `all`), or None.
    pub fn parse(s: &str) -> Option<SubscriptionMode> {
        let s = s.trim().to_ascii_lowercase();
        if s.is_empty() {
            return Some(SubscriptionMode::All);
        }
        Self::SPELLINGS.iter().find(|(spelling, _)| *spelling == s).map(|(_, mode)| *mode)
    }

    /// The accepted spellings, for an error message.
    pub fn accepted() -> String {
        Self::SPELLINGS.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ")
    }
}

/// The pop path's settings (API.md §5.2).
#[derive(Debug, Clone, PartialEq)]
pub struct PopConfig {
    /// `timeout` of a pop that sends none.
    pub default_timeout: Duration,
    /// Long-poll re-check schedule.
    pub wait_initial: Duration,
    pub backoff_threshold: u32,
    pub backoff_multiplier: f64,
    pub wait_max: Duration,
    pub default_subscription_mode: SubscriptionMode,
    /// The broker-side candidate ring; off = the SQL candidate scan.
    pub hotlist: bool,
    /// How often a ring is reseeded from SQL.
    pub hotlist_reseed: Duration,
    /// Partitions of the queue one reseed reads (`QUEEN_MAINTENANCE_WINDOW`):
    /// a larger queue is reseeded a window at a time, in name order.
    pub hotlist_reseed_window: i64,
    /// Partitions a new group's first contact covers (cursors and ring
    /// seed) before it answers, and then per background statement until the
    /// queue's end (`pop::cursor_seed`).
    pub cursor_seed_chunk: i32,
    /// Claim permits follow PostgreSQL's latency (`db::limiter`); off = a
    /// fixed three quarters of the pool.
    pub adaptive_permits: bool,
    /// An autoAck claim commits without waiting for the WAL flush (off by
    /// default: autoAck is at-most-once, which a lost flush would break).
    pub autoack_async_commit: bool,
    /// A leased claim commits without waiting for the WAL flush (off by
    /// default: a lease a crash or a failover loses hands its messages to a
    /// second consumer while the first may still work on them).
    pub lease_async_commit: bool,
    /// Bytes of decompressed segments kept for the next pop of a partly
    /// delivered segment (`pop::frames`; 0 = off).
    pub frame_cache_bytes: usize,
    /// Most shared claims of batch-1 pops in flight (`pop::share`); 0 = every
    /// pop claims in its own transaction.
    pub claim_writers: usize,
}

/// JWT authentication (API.md §5.5).
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    pub enabled: bool,
    /// `None` = auto: any algorithm the key material can verify.
    pub algorithm: Option<jsonwebtoken::Algorithm>,
    pub secret: Option<String>,
    /// PEM (RSA or Ed25519 public key).
    pub public_key: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub clock_skew_seconds: u64,
    pub skip_paths: Vec<String>,
    pub roles_claim: String,
    pub roles_array_claim: String,
    pub role_admin: String,
    pub role_read_write: String,
    pub role_read_only: String,
    pub role_write_only: String,
    /// `METRICS_PUBLIC`: `/metrics` and `/metrics/prometheus` without a
    /// token (default, as upstream), or at read-only (false).
    pub metrics_public: bool,
    /// `QUEEN_TENANT_CLAIM`: the claim that names the caller's tenant.
    pub tenant_claim: Option<String>,
    /// `QUEEN_TENANCY_ADMIN_CLAIM`: a claim which, true in an admin's
    /// token, makes that admin an admin across tenants.
    pub admin_all_claim: Option<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            enabled: false,
            algorithm: Some(jsonwebtoken::Algorithm::HS256),
            secret: None,
            public_key: None,
            issuer: None,
            audience: None,
            clock_skew_seconds: 30,
            skip_paths: ["/health", "/metrics/prometheus", "/metrics", "/"].map(String::from).to_vec(),
            roles_claim: "role".into(),
            roles_array_claim: "roles".into(),
            role_admin: "admin".into(),
            role_read_write: "read-write".into(),
            role_read_only: "read-only".into(),
            role_write_only: "write-only".into(),
            tenant_claim: None,
            admin_all_claim: None,
            metrics_public: true,
        }
    }
}

/// Limits that protect the broker from abuse.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_inflight_push: usize,
    pub max_inflight_pop: usize,
    pub max_inflight_ack: usize,
    pub max_inflight_admin: usize,
}

/// The limits of a KV call (`QUEEN_KV_*`): here, with every other setting,
/// so the configuration imports nothing of the families it configures.
#[derive(Debug, Clone, PartialEq)]
pub struct KvLimits {
    pub max_value_bytes: usize,
    pub max_key_bytes: usize,
    pub max_ops_per_call: usize,
    pub max_keys_per_call: usize,
    pub max_read_bytes: usize,
    pub max_prefix_limit: i64,
}

impl Default for KvLimits {
    fn default() -> Self {
        KvLimits {
            max_value_bytes: 65_536,
            max_key_bytes: 512,
            max_ops_per_call: 256,
            max_keys_per_call: 1024,
            max_read_bytes: 4 * 1024 * 1024,
            max_prefix_limit: 1000,
        }
    }
}

/// The whole configuration of one broker process.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub host: String,
    pub port: u16,
    pub database: Database,
    pub pool_size: usize,
    /// How long a request waits for a pooled connection before `500 pool`.
    pub pool_wait: Duration,
    /// Pooled connections unused this long are closed.
    pub pool_idle: Duration,
    pub statement_timeout: Duration,
    pub max_body_bytes: usize,
    pub apply_schema: bool,
    pub log_filter: String,
    pub log_json: bool,
    pub coalesce: CoalesceConfig,
    pub pop: PopConfig,
    /// How often per-queue settings cached in the broker are reloaded.
    pub queue_cache_refresh: Duration,
    /// Memory bound of the ack registry.
    pub ack_registry_bytes: usize,
    /// Most shared ack writes (several requests' acks in one transaction,
    /// `ack::share`) in flight.
    pub ack_writers: usize,
    /// Cadence and batch of the retention and dedup-purge services.
    pub retention_interval: Duration,
    pub retention_batch: i32,
    /// Cadence of the analytics sampler and how long samples are kept.
    pub metrics_flush: Duration,
    pub metrics_retention_days: i32,
    /// Days a trace is kept at most (traces also leave with their message).
    pub traces_retention_days: i32,
    /// This broker's name in shared tables (metrics samples).
    pub server_id: String,
    /// Tell the other brokers on the database which partitions this one
    /// wrote, and hear theirs (`cluster`).
    pub peer_hints: bool,
    /// Idle time after which an emptied partition is removed (None = never).
    pub partition_cleanup: Option<Duration>,
    /// How often the partition table is checked for stale planner statistics
    /// (`maintenance::analyze`); None = never.
    pub analyze_interval: Option<Duration>,
    /// The push spool's directory and how often it is replayed.
    pub file_buffer_dir: PathBuf,
    pub file_buffer_flush: Duration,
    pub auth: AuthConfig,
    pub tenancy: TenancyConfig,
    pub limits: Limits,
    /// Encryption at rest: None without `QUEEN_ENCRYPTION_KEY`.
    pub encryption: Option<EncryptionKeys>,
    /// How often the log's Prometheus gauges are recomputed.
    pub stats_interval: Duration,
    /// Partitions one tick of a walking background pass reads (the gauges,
    /// the dedup purge's search for due partitions): bounds a tick however
    /// large the log is.
    pub maintenance_window: i64,
    /// Cadence and batch of the `maxWaitTimeSeconds` eviction service.
    pub eviction_interval: Duration,
    pub eviction_batch: i64,
    /// KV: the switch, the limits of a call, the expiry sweeper's cadence.
    pub kv: KvConfig,
    /// How often the timer fire service looks for due timers, and how many
    /// one transaction fires.
    pub timers_interval: Duration,
    pub timers_batch: i64,
    /// Ephemeral queues: the switch, the broker-wide budget, a new queue's
    /// bounds.
    pub ephemeral: crate::ephemeral::EphemeralConfig,
    /// The Kafka wire-protocol listener (`QUEEN_KAFKA_*`, docs/KAFKA.md).
    pub kafka: KafkaConfig,
}

/// The Kafka listener's settings (`QUEEN_KAFKA_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaConfig {
    pub enabled: bool,
    /// Where it binds, and whether the operator named it: a listen address
    /// that was set explicitly must bind or the boot fails; the default one
    /// is skipped with a warning when another process holds it.
    pub listen: String,
    pub listen_explicit: bool,
    /// `host:port` written into Metadata and FindCoordinator answers; None:
    /// the bound address, or the host name when it binds a wildcard.
    pub advertised: Option<String>,
    /// Metadata and Produce create a topic (queue) they name.
    pub auto_create: bool,
    /// The width a topic advertises at least (its floor when it declares none).
    pub default_partitions: i32,
    /// Largest request frame, and the smallest ceiling any request meets.
    pub max_frame: usize,
    /// How long the first rebalance of an empty group waits for more members.
    pub group_initial_delay: Duration,
    /// TLS on the Kafka port: a PEM certificate chain and its key (both or neither).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// An idempotent producer idle this long is forgotten with its
    /// sequence windows (Kafka's `producer.id.expiration.ms`).
    pub producer_expiry: Duration,
    /// A transactional id idle this long is forgotten with its epoch
    /// (Kafka's `transactional.id.expiration.ms`).
    pub transactional_id_expiry: Duration,
}

/// KV's settings (`QUEEN_KV_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct KvConfig {
    pub enabled: bool,
    pub limits: KvLimits,
    /// Most shared single-write commits (`kv::share`) in flight.
    pub writers: usize,
    pub sweep_interval: Duration,
}

/// The AES-256 keys of encryption at rest: envelopes are sealed under
/// `current` and opened under any of them. Debug never prints a key, and
/// the bytes are wiped when the value is dropped (the key ring keeps only
/// the AES key schedules, which `aes`'s `zeroize` feature wipes too).
#[derive(Clone, PartialEq, zeroize::Zeroize, zeroize::ZeroizeOnDrop)]
pub struct EncryptionKeys {
    pub current: [u8; 32],
    /// Older keys, read-only (`QUEEN_ENCRYPTION_KEYS`), for a rotation.
    pub older: Vec<[u8; 32]>,
}

impl std::fmt::Debug for EncryptionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptionKeys {{ current: <redacted>, older: {} }}", self.older.len())
    }
}

/// One 256-bit key written as 64 hex characters.
fn parse_key(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(key)
}

fn encryption_keys<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Option<EncryptionKeys>, ConfigError> {
    // The value is a secret: errors name the variable and the rule, never the value.
    let refuse = |var: &'static str, expected: &'static str| ConfigError { var, value: "<redacted>".into(), expected: expected.into() };
    let older = match env.get(&["QUEEN_ENCRYPTION_KEYS"]) {
        None => Vec::new(),
        Some((var, list)) => list
            .split(',')
            .filter(|k| !k.trim().is_empty())
            .map(|k| parse_key(k).ok_or_else(|| refuse(var, "a comma list of keys of 64 hex characters each")))
            .collect::<Result<_, _>>()?,
    };
    match env.get(&["QUEEN_ENCRYPTION_KEY"]) {
        Some((var, hex)) => {
            let current = parse_key(&hex).ok_or_else(|| refuse(var, "64 hex characters (a 256-bit AES key)"))?;
            Ok(Some(EncryptionKeys { current, older }))
        }
        None if !older.is_empty() => Err(refuse("QUEEN_ENCRYPTION_KEYS", "QUEEN_ENCRYPTION_KEY beside it (older keys only read what the current one no longer writes)")),
        None => Ok(None),
    }
}

/// A variable that does not parse.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid {var}={value:?}: expected {expected}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub expected: std::borrow::Cow<'static, str>,
}

/// Reads variables through a lookup function so that tests can feed a map.
struct Env<F: Fn(&str) -> Option<String>> {
    lookup: F,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    /// The value of the first of `names` that is set and non-empty.
    fn get(&self, names: &[&'static str]) -> Option<(&'static str, String)> {
        names.iter().find_map(|n| {
            (self.lookup)(n).filter(|v| !v.trim().is_empty()).map(|v| (*n, v.trim().to_string()))
        })
    }

    fn string(&self, names: &[&'static str], default: &str) -> String {
        self.get(names).map(|(_, v)| v).unwrap_or_else(|| default.to_string())
    }

    fn parse<T: std::str::FromStr>(
        &self,
        names: &[&'static str],
        default: T,
        expected: &'static str,
        valid: impl Fn(&T) -> bool,
    ) -> Result<T, ConfigError> {
        match self.get(names) {
            None => Ok(default),
            Some((var, value)) => match value.parse::<T>() {
                Ok(v) if valid(&v) => Ok(v),
                _ => Err(ConfigError { var, value, expected: expected.into() }),
            },
        }
    }

    fn boolean(&self, names: &[&'static str], default: bool) -> Result<bool, ConfigError> {
        match self.get(names) {
            None => Ok(default),
            Some((var, value)) => parse_bool(&value)
                .ok_or(ConfigError { var, value, expected: "a boolean (true/false, 1/0, yes/no, on/off)".into() }),
        }
    }
}

fn auth_config<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<AuthConfig, ConfigError> {
    use jsonwebtoken::Algorithm::*;
    let d = AuthConfig::default();
    let algorithm = match env.get(&["JWT_ALGORITHM"]) {
        None => d.algorithm,
        Some((var, value)) => match value.to_ascii_uppercase().as_str() {
            "HS256" => Some(HS256),
            "HS384" => Some(HS384),
            "HS512" => Some(HS512),
            "RS256" => Some(RS256),
            "RS384" => Some(RS384),
            "RS512" => Some(RS512),
            "EDDSA" => Some(EdDSA),
            "AUTO" => None,
            _ => return Err(ConfigError { var, value, expected: "HS256|HS384|HS512|RS256|RS384|RS512|EdDSA|auto".into() }),
        },
    };
    // PEM in an environment variable often arrives with literal \n.
    let pem = |v: String| v.replace("\\n", "\n");
    let cfg = AuthConfig {
        enabled: env.boolean(&["JWT_ENABLED"], false)?,
        algorithm,
        secret: env.get(&["JWT_SECRET"]).map(|(_, v)| v),
        public_key: env.get(&["JWT_PUBLIC_KEY"]).map(|(_, v)| pem(v)),
        issuer: env.get(&["JWT_ISSUER"]).map(|(_, v)| v),
        audience: env.get(&["JWT_AUDIENCE"]).map(|(_, v)| v),
        clock_skew_seconds: env.parse(&["JWT_CLOCK_SKEW"], 30u64, "a whole number of seconds", |_| true)?,
        skip_paths: env
            .get(&["JWT_SKIP_PATHS"])
            .map(|(_, v)| v.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect())
            .unwrap_or(d.skip_paths),
        roles_claim: env.string(&["JWT_ROLES_CLAIM"], &d.roles_claim),
        roles_array_claim: env.string(&["JWT_ROLES_ARRAY_CLAIM"], &d.roles_array_claim),
        role_admin: env.string(&["JWT_ROLE_ADMIN"], &d.role_admin),
        role_read_write: env.string(&["JWT_ROLE_READ_WRITE"], &d.role_read_write),
        role_read_only: env.string(&["JWT_ROLE_READ_ONLY"], &d.role_read_only),
        role_write_only: env.string(&["JWT_ROLE_WRITE_ONLY"], &d.role_write_only),
        metrics_public: env.boolean(&["METRICS_PUBLIC"], true)?,
        tenant_claim: env.get(&["QUEEN_TENANT_CLAIM"]).map(|(_, v)| v.trim().to_string()).filter(|v| !v.is_empty()),
        admin_all_claim: env.get(&["QUEEN_TENANCY_ADMIN_CLAIM"]).map(|(_, v)| v.trim().to_string()).filter(|v| !v.is_empty()),
    };
    if let (false, Some(claim)) = (cfg.enabled, &cfg.tenant_claim) {
        return Err(ConfigError { var: "QUEEN_TENANT_CLAIM", value: claim.clone(), expected: "JWT_ENABLED=true: the claim is read from verified tokens".into() });
    }
    if cfg.enabled {
        let hmac = matches!(cfg.algorithm, Some(HS256 | HS384 | HS512));
        let public = matches!(cfg.algorithm, Some(RS256 | RS384 | RS512 | EdDSA));
        if hmac && cfg.secret.is_none() {
            return Err(ConfigError { var: "JWT_SECRET", value: String::new(), expected: "a secret for the HS* algorithm (JWT_ENABLED is on)".into() });
        }
        if public && cfg.public_key.is_none() {
            return Err(ConfigError { var: "JWT_PUBLIC_KEY", value: String::new(), expected: "a PEM public key for RS*/EdDSA (JWT_ENABLED is on)".into() });
        }
        if cfg.algorithm.is_none() && cfg.secret.is_none() && cfg.public_key.is_none() {
            return Err(ConfigError { var: "JWT_ALGORITHM", value: "auto".into(), expected: "JWT_SECRET or JWT_PUBLIC_KEY to verify with".into() });
        }
    }
    Ok(cfg)
}

/// How a request's tenant is chosen, who acts across tenants, and the
/// quotas every tenant has unless it was given its own (`tenancy`, issue 49).
#[derive(Debug, Clone, PartialEq)]
pub struct TenancyConfig {
    /// `QUEEN_TENANCY_HEADER`: honour `x-queen-tenant`. (The JWT claim
    /// that may name the tenant instead is `AuthConfig::tenant_claim`: the
    /// token's verification reads it.)
    pub header: bool,
    /// `QUEEN_TENANCY_ADMIN_ALL`: an admin acts across tenants (lists them,
    /// sets their quotas, purges them, picks one in the dashboard).
    pub admin_all: bool,
    /// `QUEEN_QUOTA_*`: the default limits (None: unlimited).
    pub quotas: QuotaLimits,
    /// `QUEEN_QUOTA_SAMPLE_MS`: how often a broker reloads the quotas and
    /// samples the stored totals (and the live brokers that share a rate).
    pub quota_sample: Duration,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        TenancyConfig { header: false, admin_all: false, quotas: QuotaLimits::default(), quota_sample: Duration::from_secs(5) }
    }
}

/// A tenant's limits (`tenancy::quota`); None: no limit. Rates are per
/// second across every broker on the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaLimits {
    pub push_messages_per_second: Option<u64>,
    pub push_bytes_per_second: Option<u64>,
    pub stored_bytes: Option<u64>,
    pub queues: Option<u64>,
    pub kv_reads_per_second: Option<u64>,
    pub kv_writes_per_second: Option<u64>,
    pub ephemeral_messages_per_second: Option<u64>,
    pub ephemeral_bytes: Option<u64>,
}

fn tenancy_config<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<TenancyConfig, ConfigError> {
    // 0 (the default) is no limit.
    let limit = |name: &'static str| env.parse(&[name], 0u64, "a whole number, 0 for no limit", |_| true).map(|v| (v > 0).then_some(v));
    let cfg = TenancyConfig {
        header: env.boolean(&["QUEEN_TENANCY_HEADER"], false)?,
        admin_all: env.boolean(&["QUEEN_TENANCY_ADMIN_ALL"], false)?,
        quotas: QuotaLimits {
            push_messages_per_second: limit("QUEEN_QUOTA_PUSH_MESSAGES_PER_SECOND")?,
            push_bytes_per_second: limit("QUEEN_QUOTA_PUSH_BYTES_PER_SECOND")?,
            stored_bytes: limit("QUEEN_QUOTA_STORED_BYTES")?,
            queues: limit("QUEEN_QUOTA_QUEUES")?,
            kv_reads_per_second: limit("QUEEN_QUOTA_KV_READS_PER_SECOND")?,
            kv_writes_per_second: limit("QUEEN_QUOTA_KV_WRITES_PER_SECOND")?,
            ephemeral_messages_per_second: limit("QUEEN_QUOTA_EPHEMERAL_MESSAGES_PER_SECOND")?,
            ephemeral_bytes: limit("QUEEN_QUOTA_EPHEMERAL_BYTES")?,
        },
        quota_sample: Duration::from_millis(env.parse(&["QUEEN_QUOTA_SAMPLE_MS"], 5000u64, "milliseconds from 100 to 3600000", |v| (100..=3_600_000).contains(v))?),
    };
    // Anyone could name another tenant in a header no proxy rewrites.
    if cfg.header && !env.boolean(&["QUEEN_TRUSTED_PROXY"], false)? {
        return Err(ConfigError {
            var: "QUEEN_TENANCY_HEADER",
            value: "true".into(),
            expected: "QUEEN_TRUSTED_PROXY=true as well: the x-queen-tenant header must come from a proxy that sets it and strips the client's copy".into(),
        });
    }
    Ok(cfg)
}

/// Booleans accept true/false, 1/0, yes/no, on/off, in any case.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl Config {
    /// Parses the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses any variable source (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let env = Env { lookup };
        let database = if let Some((_, url)) = env.get(&["QUEEN_DATABASE_URL"]) {
            Database::Url(url)
        } else if let Some((_, host)) = env.get(&["PG_HOST"]) {
            Database::Params {
                host,
                port: env.parse(&["PG_PORT"], 5432u16, "a port number 1-65535", |p| *p > 0)?,
                user: env.string(&["PG_USER"], "postgres"),
                password: env.string(&["PG_PASSWORD"], "postgres"),
                dbname: env.string(&["PG_DATABASE", "PG_DB"], "postgres"),
            }
        } else {
            Database::Embedded { data_dir: PathBuf::from(env.string(&["QUEEN_DATA_DIR"], "./queen-data")) }
        };
        let ms = |names: &[&'static str], default: u64, min: u64| {
            env.parse(names, default, "a whole number of milliseconds", |v: &u64| *v >= min)
                .map(Duration::from_millis)
        };
        let file_buffer_dir = match (env.get(&["FILE_BUFFER_DIR"]), &database) {
            (Some((_, dir)), _) => PathBuf::from(dir),
            // The embedded cluster's spool lives with its data: one
            // machine-wide default was shared by every broker on it.
            (None, Database::Embedded { data_dir }) => data_dir.join("spool"),
            (None, _) => PathBuf::from("/var/lib/queen/buffers"),
        };
        let maintenance_window = env.parse(&["QUEEN_MAINTENANCE_WINDOW"], 50_000i64, "a number of partitions from 10 to 10000000", |v| {
            (10..=10_000_000).contains(v)
        })?;
        Ok(Config {
            host: env.string(&["HOST"], "0.0.0.0"),
            port: env.parse(&["PORT"], 6632u16, "a port number 0-65535", |_| true)?,
            database,
            pool_size: env.parse(&["DB_POOL_SIZE"], 160usize, "a pool size of at least 2", |v| *v >= 2)?,
            pool_wait: ms(&["DB_CONNECTION_TIMEOUT"], 2000, 1)?,
            pool_idle: ms(&["DB_IDLE_TIMEOUT"], 30_000, 100)?,
            statement_timeout: ms(&["QUEEN_STMT_TIMEOUT_MS", "DB_STATEMENT_TIMEOUT"], 30_000, 0)?,
            max_body_bytes: env.parse(&["QUEEN_MAX_BODY_BYTES"], 64 << 20, "a byte count of at least 1024", |v| {
                *v >= 1024
            })?,
            apply_schema: env.boolean(&["QUEEN_APPLY_SCHEMA"], true)?,
            log_filter: env.string(&["LOG_LEVEL", "RUST_LOG"], "info"),
            log_json: env.boolean(&["QUEEN_LOG_JSON"], false)?,
            coalesce: CoalesceConfig {
                hold: ms(&["QUEEN_V2_FUSION_HOLD_MS"], 0, 0)?,
                max_frames: env.parse(&["QUEEN_V2_FUSION_FRAMES"], 500usize, "a frame count of at least 1", |v| {
                    *v >= 1
                })?,
                max_bytes: env.parse(&["QUEEN_V2_FUSION_BYTES"], 4 << 20, "a byte count of at least 1024", |v| {
                    *v >= 1024
                })?,
                zstd_level: env.parse(&["QUEEN_V2_ZSTD_LEVEL"], 3i32, "a zstd level from 1 to 19", |v| {
                    (1..=19).contains(v)
                })?,
                group_writers: env.parse(&["QUEEN_PUSH_GROUP_WRITERS"], 1usize, "a count of at least 1", |v| *v >= 1)?,
                dedup_entries: env.parse(&["QUEEN_DEDUP_MEMORY_ENTRIES"], 16_000_000usize, "a count of at least 1000", |v| {
                    *v >= 1000
                })?,
            },
            pop: PopConfig {
                default_timeout: ms(&["DEFAULT_TIMEOUT", "POP_DEFAULT_TIMEOUT_MS"], 30_000, 0)?,
                wait_initial: ms(&["POP_WAIT_INITIAL_INTERVAL_MS"], 100, 1)?,
                backoff_threshold: env.parse(&["POP_WAIT_BACKOFF_THRESHOLD"], 3u32, "a whole number", |_| true)?,
                backoff_multiplier: env.parse(&["POP_WAIT_BACKOFF_MULTIPLIER"], 2.0f64, "a number of at least 1", |v| {
                    *v >= 1.0 && v.is_finite()
                })?,
                wait_max: ms(&["POP_WAIT_MAX_INTERVAL_MS"], 1000, 1)?,
                default_subscription_mode: match env.get(&["DEFAULT_SUBSCRIPTION_MODE"]) {
                    None => SubscriptionMode::All,
                    Some((var, value)) => SubscriptionMode::parse(&value).ok_or(ConfigError {
                        var,
                        value,
                        expected: format!("one of {}", SubscriptionMode::accepted()).into(),
                    })?,
                },
                hotlist: env.boolean(&["QUEEN_HOTLIST"], true)?,
                hotlist_reseed: ms(&["QUEEN_HOTLIST_RESEED_MS"], 30_000, 100)?,
                hotlist_reseed_window: maintenance_window,
                cursor_seed_chunk: env.parse(&["QUEEN_CURSOR_SEED_CHUNK"], 5_000i32, "a number of partitions from 1 to 1000000", |v| {
                    (1..=1_000_000).contains(v)
                })?,
                adaptive_permits: env.boolean(&["QUEEN_POP_ADAPTIVE_PERMITS"], true)?,
                autoack_async_commit: env.boolean(&["QUEEN_POP_AUTOACK_ASYNC_COMMIT"], false)?,
                lease_async_commit: env.boolean(&["QUEEN_POP_LEASE_ASYNC_COMMIT"], false)?,
                frame_cache_bytes: env.parse(&["QUEEN_POP_FRAME_CACHE_MB"], 64usize, "a whole number of MiB", |_| true)? << 20,
                claim_writers: env.parse(&["QUEEN_POP_CLAIM_WRITERS"], 2usize, "a count from 0 to 64", |v| *v <= 64)?,
            },
            queue_cache_refresh: ms(&["QUEEN_CACHE_REFRESH_INTERVAL_MS"], 60_000, 50)?,
            ack_registry_bytes: env.parse(&["QUEEN_ACK_REGISTRY_MB"], 64usize, "a whole number of MiB", |_| true)? << 20,
            ack_writers: env.parse(&["QUEEN_ACK_GROUP_WRITERS"], 1usize, "a count of at least 1", |v| *v >= 1)?,
            retention_interval: ms(&["RETENTION_INTERVAL"], 5000, 100)?,
            retention_batch: env.parse(&["RETENTION_BATCH_SIZE"], 1000i32, "a batch size of at least 1", |v| *v >= 1)?,
            metrics_flush: ms(&["METRICS_FLUSH_MS"], 60_000, 100)?,
            metrics_retention_days: env.parse(&["METRICS_RETENTION_DAYS"], 90i32, "a number of days of at least 1", |v| *v >= 1)?,
            traces_retention_days: env.parse(&["TRACES_RETENTION_DAYS"], 7i32, "a number of days of at least 1", |v| *v >= 1)?,
            server_id: env.string(&["QUEEN_SERVER_ID", "HOSTNAME"], &format!("queen-{}", std::process::id())),
            peer_hints: env.boolean(&["QUEEN_PEER_HINTS"], true)?,
            analyze_interval: match env.parse(&["QUEEN_ANALYZE_INTERVAL_MS"], 1000u64, "0 (off) or a whole number of milliseconds of at least 100", |v| *v == 0 || *v >= 100)? {
                0 => None,
                v => Some(Duration::from_millis(v)),
            },
            partition_cleanup: if env.boolean(&["QUEEN_PARTITION_CLEANUP_ENABLED"], true)? {
                let days: f64 = env.parse(&["PARTITION_CLEANUP_DAYS"], 30.0, "a number of days above 0", |d: &f64| *d > 0.0 && d.is_finite())?;
                Some(Duration::from_secs_f64(days * 86_400.0))
            } else {
                None
            },
            file_buffer_dir,
            file_buffer_flush: ms(&["FILE_BUFFER_FLUSH_MS"], 100, 10)?,
            auth: auth_config(&env)?,
            tenancy: tenancy_config(&env)?,
            encryption: encryption_keys(&env)?,
            stats_interval: env
                .parse(&["STATS_INTERVAL_MS"], 10_000u64, "a whole number of milliseconds from 100 to 60000", |v| (100..=60_000).contains(v))
                .map(Duration::from_millis)?,
            maintenance_window,
            eviction_interval: ms(&["EVICTION_INTERVAL"], 60_000, 100)?,
            eviction_batch: env.parse(&["EVICTION_BATCH_SIZE"], 1000i64, "a batch size of at least 1", |v| *v >= 1)?,
            timers_interval: ms(&["QUEEN_TIMERS_INTERVAL_MS"], 50, 5)?,
            timers_batch: env.parse(&["QUEEN_TIMERS_BATCH_SIZE"], 1000i64, "a batch size from 1 to 10000", |v| (1..=10_000).contains(v))?,
            kv: KvConfig {
                enabled: env.boolean(&["QUEEN_KV_ENABLED"], true)?,
                writers: env.parse(&["QUEEN_KV_GROUP_WRITERS"], 1usize, "a count of at least 1", |v| *v >= 1)?,
                limits: KvLimits {
                    max_value_bytes: env.parse(&["QUEEN_KV_MAX_VALUE_BYTES"], 65_536usize, "a byte count from 1 to 16777216", |v| (1..=16 << 20).contains(v))?,
                    max_key_bytes: env.parse(&["QUEEN_KV_MAX_KEY_BYTES"], 512usize, "a byte count from 1 to 4096", |v| (1..=4096).contains(v))?,
                    max_ops_per_call: env.parse(&["QUEEN_KV_MAX_OPS_PER_CALL"], 256usize, "a count from 1 to 10000", |v| (1..=10_000).contains(v))?,
                    max_keys_per_call: env.parse(&["QUEEN_KV_MAX_KEYS_PER_CALL"], 1024usize, "a count from 1 to 100000", |v| (1..=100_000).contains(v))?,
                    max_read_bytes: env.parse(&["QUEEN_KV_MAX_READ_BYTES"], 4usize << 20, "a byte count of at least 1024", |v| *v >= 1024)?,
                    max_prefix_limit: env.parse(&["QUEEN_KV_PREFIX_LIMIT"], 1000i64, "a row count from 1 to 100000", |v| (1..=100_000).contains(v))?,
                },
                sweep_interval: ms(&["QUEEN_KV_SWEEP_INTERVAL_MS"], 1000, 10)?,
            },
            ephemeral: crate::ephemeral::EphemeralConfig {
                enabled: env.boolean(&["QUEEN_EPHEMERAL_ENABLED"], true)?,
                max_bytes: match env.get(&["QUEEN_EPHEMERAL_MAX_BYTES"]) {
                    Some(_) => env.parse(&["QUEEN_EPHEMERAL_MAX_BYTES"], 0u64, "a byte count of at least 1024", |v| *v >= 1024)?,
                    None => env.parse(&["QUEEN_EPHEMERAL_MAX_MB"], 256u64, "a number of MiB from 1 to 1048576", |v| (1..=1 << 20).contains(v))? << 20,
                },
                defaults: crate::ephemeral::Options {
                    max_bytes: env.parse(&["QUEEN_EPHEMERAL_QUEUE_MAX_BYTES"], 16u64 << 20, "a byte count of at least 1024", |v| *v >= 1024)?,
                    max_length: env.parse(&["QUEEN_EPHEMERAL_QUEUE_MAX_LENGTH"], 10_000usize, "a message count from 1 to 100000000", |v| (1..=100_000_000).contains(v))?,
                    policy: crate::ephemeral::Policy::Reject,
                    ttl: None,
                    lease: Duration::from_secs(env.parse(&["QUEEN_EPHEMERAL_LEASE_S"], 30u64, "seconds from 1 to 3600", |v| (1..=3600).contains(v))?),
                    retry_limit: env.parse(&["QUEEN_EPHEMERAL_RETRY_LIMIT"], 5u32, "a count from 0 to 1000", |v| *v <= 1000)?,
                    window_buffer: None,
                },
                idle: Duration::from_secs(env.parse(&["QUEEN_EPHEMERAL_IMPLICIT_IDLE_S"], 300u64, "seconds of at least 1", |v| *v >= 1)?),
            },
            kafka: KafkaConfig {
                enabled: env.boolean(&["QUEEN_KAFKA_ENABLED"], true)?,
                listen_explicit: env.get(&["QUEEN_KAFKA_LISTEN"]).is_some(),
                listen: env.string(&["QUEEN_KAFKA_LISTEN"], "0.0.0.0:9092"),
                advertised: env.get(&["QUEEN_KAFKA_ADVERTISED"]).map(|(_, v)| v),
                auto_create: env.boolean(&["QUEEN_KAFKA_AUTO_CREATE"], true)?,
                default_partitions: env.parse(&["QUEEN_KAFKA_DEFAULT_PARTITIONS"], 8i32, "a partition count from 1 to 100000", |v| (1..=100_000).contains(v))?,
                max_frame: env.parse(&["QUEEN_KAFKA_MAX_FRAME"], 100usize << 20, "a byte count from 65536 to 1073741824", |v| (65_536..=1 << 30).contains(v))?,
                group_initial_delay: ms(&["QUEEN_KAFKA_GROUP_INITIAL_DELAY_MS"], 0, 0)?,
                producer_expiry: ms(&["QUEEN_KAFKA_PRODUCER_ID_EXPIRATION_MS"], 86_400_000, 1_000)?,
                transactional_id_expiry: ms(&["QUEEN_KAFKA_TRANSACTIONAL_ID_EXPIRATION_MS"], 604_800_000, 1_000)?,
                tls: match (env.get(&["QUEEN_KAFKA_TLS_CERT"]), env.get(&["QUEEN_KAFKA_TLS_KEY"])) {
                    (Some((_, cert)), Some((_, key))) => Some((PathBuf::from(cert), PathBuf::from(key))),
                    (None, None) => None,
                    (Some((var, _)), None) | (None, Some((var, _))) => {
                        return Err(ConfigError { var, value: String::new(), expected: "QUEEN_KAFKA_TLS_CERT and QUEEN_KAFKA_TLS_KEY together".into() })
                    }
                },
            },
            limits: Limits {
                max_connections: env.parse(&["QUEEN_MAX_CONNECTIONS"], 10_000usize, "a connection count of at least 1", |v| *v >= 1)?,
                header_timeout: ms(&["QUEEN_HEADER_TIMEOUT_MS"], 10_000, 10)?,
                body_timeout: ms(&["QUEEN_BODY_TIMEOUT_MS"], 30_000, 10)?,
                max_inflight_push: env.parse(&["QUEEN_MAX_INFLIGHT_PUSH"], 4096usize, "a request count of at least 1", |v| *v >= 1)?,
                max_inflight_pop: env.parse(&["QUEEN_MAX_INFLIGHT_POP"], 10_000usize, "a request count of at least 1", |v| *v >= 1)?,
                max_inflight_ack: env.parse(&["QUEEN_MAX_INFLIGHT_ACK"], 4096usize, "a request count of at least 1", |v| *v >= 1)?,
                max_inflight_admin: env.parse(&["QUEEN_MAX_INFLIGHT_ADMIN"], 256usize, "a request count of at least 1", |v| *v >= 1)?,
            },
        })
    }

    /// Every variable, its default and meaning: the `--help` epilogue and the
    /// table of docs/CONFIGURATION.md are written from this one list (a test
    /// keeps the file equal to `variables_markdown`, and checks that every
    /// variable the parser reads is here).
    pub const VARIABLES: &'static [(&'static str, &'static str, &'static str)] = &[
        ("HOST", "0.0.0.0", "address the HTTP server binds"),
        ("PORT", "6632", "HTTP port (0 = any free port)"),
        ("QUEEN_DATABASE_URL", "", "libpq URL or key=value string of the PostgreSQL to use; several hosts (`host=a,b`) imply target_session_attrs=read-write; TCP keepalives 10 s / 5 s / 3 and tcp_user_timeout 15 s (in seconds) unless given; TLS by libpq's `sslmode` (default prefer; require, verify-ca, verify-full), `sslrootcert` (PEM file or `system`), `sslcert`/`sslkey` (docs/OPERATIONS.md)"),
        ("PG_HOST", "", "PostgreSQL host, or several separated by commas (tried in order; several imply target_session_attrs=read-write, so the broker follows a failover); when neither this nor QUEEN_DATABASE_URL is set, an embedded cluster starts"),
        ("PG_PORT", "5432", "PostgreSQL port"),
        ("PG_USER", "postgres", "PostgreSQL user"),
        ("PG_PASSWORD", "postgres", "PostgreSQL password"),
        ("PG_DATABASE (alias PG_DB)", "postgres", "PostgreSQL database"),
        ("QUEEN_DATA_DIR", "./queen-data", "where the embedded cluster keeps its data; one broker at a time (a second one on it exits at once)"),
        ("DB_POOL_SIZE", "160", "most pooled PostgreSQL connections"),
        ("DB_CONNECTION_TIMEOUT", "2000", "ms a request waits for a pooled connection before 500 pool"),
        ("DB_IDLE_TIMEOUT", "30000", "ms after which an unused pooled connection is closed"),
        ("QUEEN_STMT_TIMEOUT_MS (alias DB_STATEMENT_TIMEOUT)", "30000", "statement timeout in ms (0 = none)"),
        ("QUEEN_MAX_BODY_BYTES", "67108864", "largest request body; larger answers 413"),
        ("QUEEN_TIMERS_INTERVAL_MS", "50", "ms between looks for due timers when none was due (a full batch is followed at once by the next)"),
        ("QUEEN_TIMERS_BATCH_SIZE", "1000", "most timers one fire transaction turns into messages"),
        ("QUEEN_KV_ENABLED", "true", "serve KV; false answers every KV route 503 kv_disabled"),
        ("QUEEN_KV_GROUP_WRITERS", "1", "most shared commits of single-write KV calls (several calls in one transaction) in flight (measured: docs/DECISIONS.md)"),
        ("QUEEN_KV_MAX_VALUE_BYTES", "65536", "largest KV value, as JSON text; larger answers 413 kv_value_too_large"),
        ("QUEEN_KV_MAX_KEY_BYTES", "512", "longest KV key (namespaces: 128 bytes of A-Z a-z 0-9 . _ : -)"),
        ("QUEEN_KV_MAX_OPS_PER_CALL", "256", "most operations in one KV call"),
        ("QUEEN_KV_MAX_KEYS_PER_CALL", "1024", "most keys in one getMany"),
        ("QUEEN_KV_MAX_READ_BYTES", "4194304", "bytes of keys and values the reads (getMany, getPrefix) of one call answer together before they say truncated"),
        ("QUEEN_KV_PREFIX_LIMIT", "1000", "ceiling a getPrefix limit is clamped to"),
        ("QUEEN_KV_SWEEP_INTERVAL_MS", "1000", "ms between passes of the sweeper that reclaims expired keys (they are invisible from the moment they expire)"),
        ("QUEEN_KAFKA_ENABLED", "true", "serve the Kafka wire protocol (docs/KAFKA.md) beside HTTP"),
        ("QUEEN_KAFKA_LISTEN", "0.0.0.0:9092", "address the Kafka listener binds; when set it must bind or the boot fails, when left at the default a port another process holds is skipped with a warning"),
        ("QUEEN_KAFKA_ADVERTISED", "", "host:port Kafka clients are told to connect to (Metadata, FindCoordinator); default: the bound address, or the host name and port when it binds a wildcard"),
        ("QUEEN_KAFKA_AUTO_CREATE", "true", "Metadata and Produce create the topics (queues) they name"),
        ("QUEEN_KAFKA_DEFAULT_PARTITIONS", "8", "partitions a topic advertises at least (its width never shrinks: numeric partitions above it widen it)"),
        ("QUEEN_KAFKA_MAX_FRAME", "104857600", "largest Kafka request frame in bytes; a larger one closes the connection"),
        ("QUEEN_KAFKA_TLS_CERT", "", "PEM certificate chain of the Kafka port; with QUEEN_KAFKA_TLS_KEY, clients connect with TLS (security.protocol SSL or SASL_SSL)"),
        ("QUEEN_KAFKA_TLS_KEY", "", "PEM private key of QUEEN_KAFKA_TLS_CERT"),
        ("QUEEN_KAFKA_GROUP_INITIAL_DELAY_MS", "0", "ms the first rebalance of an empty consumer group waits for more members to join"),
        ("QUEEN_KAFKA_PRODUCER_ID_EXPIRATION_MS", "86400000", "ms after which an idle idempotent producer's id and sequence windows are forgotten (Kafka's producer.id.expiration.ms); its next batch is then taken as it comes"),
        ("QUEEN_KAFKA_TRANSACTIONAL_ID_EXPIRATION_MS", "604800000", "ms after which an idle transactional id is forgotten with its epoch (Kafka's transactional.id.expiration.ms); never one inside a transaction"),
        ("QUEEN_PEER_HINTS", "true", "tell the other brokers on the database which partitions this one wrote (LISTEN/NOTIFY on one connection), so their long-polls wake at once; false: they wake at their next backoff"),
        ("QUEEN_EPHEMERAL_ENABLED", "true", "serve ephemeral (in-memory) queues; false answers their routes 503 ephemeral_disabled"),
        ("QUEEN_EPHEMERAL_MAX_MB", "256", "memory all ephemeral queues together may hold (payloads plus 96 bytes a message, and their bookkeeping: about 200 bytes a partition, 130 a group, 160 a cursor a group holds); a push past it answers 503 ephemeral_memory_full"),
        ("QUEEN_EPHEMERAL_MAX_BYTES", "", "the same budget in bytes; wins over QUEEN_EPHEMERAL_MAX_MB when set"),
        ("QUEEN_EPHEMERAL_QUEUE_MAX_BYTES", "16777216", "a new ephemeral queue's maxBytes"),
        ("QUEEN_EPHEMERAL_QUEUE_MAX_LENGTH", "10000", "a new ephemeral queue's maxLength"),
        ("QUEEN_EPHEMERAL_LEASE_S", "30", "a new ephemeral queue's leaseSeconds"),
        ("QUEEN_EPHEMERAL_RETRY_LIMIT", "5", "a new ephemeral queue's retryLimit (deliveries after the first before a message is dropped)"),
        ("QUEEN_EPHEMERAL_IMPLICIT_IDLE_S", "300", "seconds after which an unused, empty, never configured ephemeral queue is removed, an empty partition not written to is removed, and an unused group stops holding its queue's messages"),
        ("QUEEN_APPLY_SCHEMA", "true", "apply pending migrations at boot"),
        ("LOG_LEVEL (or RUST_LOG)", "info", "log filter (tracing EnvFilter syntax)"),
        ("QUEEN_LOG_JSON", "false", "log as JSON lines"),
        ("QUEEN_V2_FUSION_HOLD_MS", "0", "ms an idle partition's first write waits for company (0: batch only what piles up behind an in-flight write)"),
        ("QUEEN_V2_FUSION_FRAMES", "500", "most messages in one coalesced segment"),
        ("QUEEN_V2_FUSION_BYTES", "4194304", "most uncompressed bytes in one coalesced segment"),
        ("QUEEN_PUSH_GROUP_WRITERS", "1", "most group commits (several partitions' segments in one transaction) in flight (measured: docs/DECISIONS.md)"),
        ("QUEEN_ACK_GROUP_WRITERS", "1", "most shared ack commits (several requests' acks in one transaction) in flight (measured: docs/DECISIONS.md)"),
        ("QUEEN_V2_ZSTD_LEVEL", "3", "zstd level of segment compression"),
        ("QUEEN_DEDUP_MEMORY_ENTRIES", "16000000", "most transactionIds the broker remembers for the dedup windows of the partitions it writes (about 40 bytes each); past it the least recently written partitions are forgotten and checked in PostgreSQL on their next write"),
        ("DEFAULT_TIMEOUT (fallback POP_DEFAULT_TIMEOUT_MS)", "30000", "long-poll timeout in ms of a pop that sends none"),
        ("POP_WAIT_INITIAL_INTERVAL_MS", "100", "first long-poll re-check interval"),
        ("POP_WAIT_BACKOFF_THRESHOLD", "3", "re-checks at the initial interval before backing off"),
        ("POP_WAIT_BACKOFF_MULTIPLIER", "2.0", "backoff growth: initial x attempt x multiplier"),
        ("POP_WAIT_MAX_INTERVAL_MS", "1000", "longest long-poll re-check interval"),
        ("DEFAULT_SUBSCRIPTION_MODE", "all", "where a named group starts when its first pop names no mode: all (alias from_beginning) or new (aliases new-only, new_only); never applies to queue mode"),
        ("QUEEN_HOTLIST", "true", "broker-side candidate ring; false = SQL candidate scan"),
        ("QUEEN_HOTLIST_RESEED_MS", "30000", "how often a candidate ring is reseeded from SQL"),
        ("QUEEN_CURSOR_SEED_CHUNK", "5000", "cursors a new consumer group's first contact writes before it answers, then per background statement until every partition has one"),
        ("QUEEN_POP_ADAPTIVE_PERMITS", "true", "concurrent claims follow PostgreSQL's latency (Vegas); false = three quarters of DB_POOL_SIZE"),
        ("QUEEN_POP_AUTOACK_ASYNC_COMMIT", "false", "true = an autoAck pop's claim commits without waiting for the disk: faster drains, but after a PostgreSQL or machine crash its last ~0.6 s of deliveries may come again (at-least-once instead of at-most-once)"),
        ("QUEEN_POP_LEASE_ASYNC_COMMIT", "false", "true = a leased pop's claim commits without waiting for the disk (leased drains about a quarter faster), but after a PostgreSQL or machine crash, or a failover, the leases of its last ~0.6 s may be lost and their messages handed to a second consumer while the first still holds them"),
        ("QUEEN_CACHE_REFRESH_INTERVAL_MS", "60000", "how often per-queue settings cached in the broker (minPopWaitTime) are reloaded"),
        ("QUEEN_POP_CLAIM_WRITERS", "2", "most shared claims in flight: batch-1 pops that arrive while one runs claim together in one transaction, each with its own lease (measured: docs/DECISIONS.md); 0 = every pop claims in its own transaction"),
        ("QUEEN_POP_FRAME_CACHE_MB", "64", "memory for decompressed segments a pop delivered only in part, kept for the next pop of the same segment (0 = off: every pop decompresses its segment)"),
        ("QUEEN_ACK_REGISTRY_MB", "64", "memory for the ack registry (leased batches resolved without PostgreSQL; 0 = always use the index)"),
        ("RETENTION_INTERVAL", "5000", "ms between retention and dedup-purge passes"),
        ("RETENTION_BATCH_SIZE", "1000", "segments one retention batch removes"),
        ("METRICS_FLUSH_MS", "60000", "ms between analytics samples"),
        ("METRICS_RETENTION_DAYS", "90", "days analytics samples are kept"),
        ("TRACES_RETENTION_DAYS", "7", "days a trace is kept at most; a trace also goes with its message (retention, partition cleanup, queue deletion)"),
        ("QUEEN_SERVER_ID (or HOSTNAME)", "queen-<pid>", "this broker's name in analytics samples"),
        ("PARTITION_CLEANUP_DAYS", "30", "days an emptied partition stays unwritten before it is removed (fractions allowed)"),
        ("QUEEN_PARTITION_CLEANUP_ENABLED", "true", "remove emptied partitions at all"),
        ("QUEEN_ANALYZE_INTERVAL_MS", "1000", "ms between checks for a partition table grown past twice its planner statistics, which are then refreshed (0 = leave it to autovacuum)"),
        ("QUEEN_ENCRYPTION_KEY", "", "64 hex characters: the AES-256-GCM key that seals the payloads of queues with encryptionEnabled; a malformed key stops the boot"),
        ("QUEEN_ENCRYPTION_KEYS", "", "comma list of older keys (64 hex characters each) still read, never written: a key rotation"),
        ("STATS_INTERVAL_MS", "10000", "ms between recomputations of the log's Prometheus gauges (per-queue pending, partitions, dead letters; per-group lag); at most 60000; a tick that takes over 100 ms and more than 5 % of the interval spaces the next out to keep 5 % (about 30 s at 1,000,000 partitions)"),
        ("QUEEN_MAINTENANCE_WINDOW", "50000", "partitions one tick of the log gauges, of the dedup purge's search and one reseed of a candidate ring read, walking in order: each costs the same at any log size, and a log (or queue) larger than this is covered in several (the gauges set once a walk ends)"),
        ("EVICTION_INTERVAL", "60000", "ms between passes of the maxWaitTimeSeconds eviction (messages waited past a queue's limit go to the dead-letter queue)"),
        ("EVICTION_BATCH_SIZE", "1000", "most messages one eviction pass dead-letters"),
        ("FILE_BUFFER_DIR", "/var/lib/queen/buffers", "spool for pushes during push maintenance or a database outage (default `QUEEN_DATA_DIR/spool` on the embedded cluster); a broker replays only the files of its own database"),
        ("FILE_BUFFER_FLUSH_MS", "100", "ms between spool replay attempts"),
        ("QUEEN_MAX_CONNECTIONS", "10000", "open connections; one over the cap is closed at once"),
        ("QUEEN_HEADER_TIMEOUT_MS", "10000", "ms a connection has to send a request's headers"),
        ("QUEEN_BODY_TIMEOUT_MS", "30000", "ms a request has to send its body (408 after)"),
        ("QUEEN_MAX_INFLIGHT_PUSH", "4096", "in-flight pushes; over it: 503 overloaded"),
        ("QUEEN_MAX_INFLIGHT_POP", "10000", "in-flight pops and fetches, parked long-polls included"),
        ("QUEEN_MAX_INFLIGHT_ACK", "4096", "in-flight acks, transactions, lease extensions, trace writes and KV calls"),
        ("QUEEN_MAX_INFLIGHT_ADMIN", "256", "in-flight requests of every other /api route"),
        ("JWT_ENABLED", "false", "require a JWT on every non-public route"),
        ("JWT_ALGORITHM", "HS256", "HS256|HS384|HS512|RS256|RS384|RS512|EdDSA|auto"),
        ("JWT_SECRET", "", "HMAC secret (HS*)"),
        ("JWT_PUBLIC_KEY", "", "PEM public key (RS*, EdDSA); \\n escapes allowed"),
        ("JWT_ISSUER", "", "required iss (empty = any)"),
        ("JWT_AUDIENCE", "", "required aud (empty = any)"),
        ("JWT_CLOCK_SKEW", "30", "seconds of leeway on exp/nbf"),
        ("JWT_SKIP_PATHS", "/health,/metrics/prometheus,/metrics,/", "paths served without a token"),
        ("JWT_ROLES_CLAIM", "role", "claim holding one role"),
        ("JWT_ROLES_ARRAY_CLAIM", "roles", "claim holding a list of roles"),
        ("JWT_ROLE_ADMIN", "admin", "role name of the admin level (also JWT_ROLE_READ_WRITE, JWT_ROLE_READ_ONLY, JWT_ROLE_WRITE_ONLY)"),
        ("METRICS_PUBLIC", "true", "serve /metrics and /metrics/prometheus without a token; false: read-only (with JWT_ENABLED)"),
        ("QUEEN_TENANCY_HEADER", "false", "take each request's tenant from the x-queen-tenant header (a UUID; absent: the default tenant); needs QUEEN_TRUSTED_PROXY"),
        ("QUEEN_TRUSTED_PROXY", "false", "the broker is reached only through a proxy that sets x-queen-tenant and strips the client's copy"),
        ("QUEEN_TENANT_CLAIM", "", "a JWT claim naming the caller's tenant (needs JWT_ENABLED); a header that disagrees is refused"),
        ("QUEEN_TENANCY_ADMIN_ALL", "false", "an admin acts across tenants: lists them, sets their quotas, purges them (without JWT: every caller)"),
        ("QUEEN_TENANCY_ADMIN_CLAIM", "", "a JWT claim which, true in an admin's token, makes that admin an admin across tenants"),
        ("QUEEN_QUOTA_PUSH_MESSAGES_PER_SECOND", "0", "each tenant's pushed messages per second across the brokers, unless set for it (0: no limit)"),
        ("QUEEN_QUOTA_PUSH_BYTES_PER_SECOND", "0", "each tenant's pushed payload bytes per second (0: no limit)"),
        ("QUEEN_QUOTA_STORED_BYTES", "0", "each tenant's stored segment bytes, sampled (0: no limit)"),
        ("QUEEN_QUOTA_QUEUES", "0", "each tenant's queues (0: no limit)"),
        ("QUEEN_QUOTA_KV_READS_PER_SECOND", "0", "each tenant's KV reads per second (0: no limit)"),
        ("QUEEN_QUOTA_KV_WRITES_PER_SECOND", "0", "each tenant's KV writes per second (0: no limit)"),
        ("QUEEN_QUOTA_EPHEMERAL_MESSAGES_PER_SECOND", "0", "each tenant's ephemeral messages pushed per second (0: no limit)"),
        ("QUEEN_QUOTA_EPHEMERAL_BYTES", "0", "each tenant's ephemeral memory on one broker (0: no limit)"),
        ("QUEEN_QUOTA_SAMPLE_MS", "5000", "how often a broker reloads quotas, samples stored bytes and queue counts, and counts the live brokers sharing a rate"),
    ];

    /// The variable table as Markdown, as docs/CONFIGURATION.md holds it:
    /// variable names in code spans, the empty default as nothing.
    pub fn variables_markdown() -> String {
        fn code_names(text: &str) -> String {
            let is_name = |w: &str| w.len() > 2 && w.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            text.split(' ')
                .map(|w| {
                    let core = w.trim_matches(|c: char| "(),".contains(c));
                    if is_name(core) { w.replacen(core, &format!("`{core}`"), 1) } else { w.to_string() }
                })
                .collect::<Vec<_>>()
                .join(" ")
        }
        let mut s = String::from("| Variable | Default | Meaning |\n|---|---|---|\n");
        for (name, default, what) in Config::VARIABLES {
            let d = if default.is_empty() { String::new() } else { format!("`{default}`") };
            s.push_str(&format!("| {} | {d} | {} |\n", code_names(name), what.replace('|', "\\|")));
        }
        s
    }

    /// The variable table as text, for `--help`.
    pub fn variables_help() -> String {
        let mut s = String::from("Environment variables (booleans: true/false, 1/0, yes/no, on/off):\n");
        for (name, default, what) in Config::VARIABLES {
            let d = if default.is_empty() { String::new() } else { format!(" [default: {default}]") };
            s.push_str(&format!("  {name}{d}\n      {what}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_follow_the_spec() {
        let c = parse(&[]).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 6632));
        assert_eq!(c.database, Database::Embedded { data_dir: PathBuf::from("./queen-data") });
        assert_eq!(c.file_buffer_dir, PathBuf::from("./queen-data/spool"), "the embedded cluster's spool lives with its data");
        let c = parse(&[("PG_HOST", "db")]).unwrap();
        assert_eq!(c.file_buffer_dir, PathBuf::from("/var/lib/queen/buffers"));
        let c = parse(&[("QUEEN_DATA_DIR", "/d"), ("FILE_BUFFER_DIR", "/s")]).unwrap();
        assert_eq!(c.file_buffer_dir, PathBuf::from("/s"));
        assert_eq!(c.max_body_bytes, 67_108_864);
        assert_eq!(c.statement_timeout, Duration::from_millis(30_000));
        assert!(c.apply_schema);
        assert_eq!(c.pool_size, 160);
        assert_eq!(c.pop.default_timeout, Duration::from_millis(30_000));
        assert_eq!(c.pop.default_subscription_mode, SubscriptionMode::All);
        assert!(c.pop.hotlist);
    }

    #[test]
    fn the_kafka_listener_defaults_and_its_tls_pair() {
        let k = parse(&[]).unwrap().kafka;
        assert!(k.enabled && k.auto_create && !k.listen_explicit);
        assert_eq!((k.listen.as_str(), k.default_partitions, k.max_frame, k.tls), ("0.0.0.0:9092", 8, 100 << 20, None));
        let k = parse(&[("QUEEN_KAFKA_LISTEN", "127.0.0.1:0"), ("QUEEN_KAFKA_TLS_CERT", "c.pem"), ("QUEEN_KAFKA_TLS_KEY", "k.pem")]).unwrap().kafka;
        assert!(k.listen_explicit);
        assert_eq!(k.tls, Some((PathBuf::from("c.pem"), PathBuf::from("k.pem"))));
        let e = parse(&[("QUEEN_KAFKA_TLS_CERT", "c.pem")]).unwrap_err();
        assert_eq!((e.var, e.expected.as_ref()), ("QUEEN_KAFKA_TLS_CERT", "QUEEN_KAFKA_TLS_CERT and QUEEN_KAFKA_TLS_KEY together"));
        assert_eq!(parse(&[("QUEEN_KAFKA_DEFAULT_PARTITIONS", "0")]).unwrap_err().var, "QUEEN_KAFKA_DEFAULT_PARTITIONS");
    }

    #[test]
    fn default_timeout_wins_over_the_pop_specific_name() {
        let c = parse(&[("POP_DEFAULT_TIMEOUT_MS", "5000")]).unwrap();
        assert_eq!(c.pop.default_timeout, Duration::from_millis(5000));
        let c = parse(&[("POP_DEFAULT_TIMEOUT_MS", "5000"), ("DEFAULT_TIMEOUT", "7000")]).unwrap();
        assert_eq!(c.pop.default_timeout, Duration::from_millis(7000));
    }

    #[test]
    fn the_default_subscription_mode_takes_the_aliases() {
        for v in ["new", "new-only", "NEW_ONLY"] {
            assert_eq!(parse(&[("DEFAULT_SUBSCRIPTION_MODE", v)]).unwrap().pop.default_subscription_mode, SubscriptionMode::New);
        }
        for v in ["all", "from_beginning", "From-Beginning", ""] {
            assert_eq!(parse(&[("DEFAULT_SUBSCRIPTION_MODE", v)]).unwrap().pop.default_subscription_mode, SubscriptionMode::All);
        }
        let e = parse(&[("DEFAULT_SUBSCRIPTION_MODE", "latest")]).unwrap_err();
        assert_eq!(e.var, "DEFAULT_SUBSCRIPTION_MODE");
        assert_eq!(e.expected, format!("one of {}", SubscriptionMode::accepted()), "the message lists every spelling");
    }

    #[test]
    fn pg_host_selects_explicit_parameters_and_pg_db_is_an_alias() {
        let c = parse(&[("PG_HOST", "db"), ("PG_DB", "q"), ("PG_PORT", "6000")]).unwrap();
        assert_eq!(
            c.database,
            Database::Params {
                host: "db".into(),
                port: 6000,
                user: "postgres".into(),
                password: "postgres".into(),
                dbname: "q".into()
            }
        );
        let c = parse(&[("PG_HOST", "db"), ("PG_DB", "q"), ("PG_DATABASE", "p")]).unwrap();
        assert!(matches!(c.database, Database::Params { dbname, .. } if dbname == "p"));
    }

    #[test]
    fn an_encryption_key_is_64_hex_characters_and_a_bad_one_names_no_secret() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
        let c = parse(&[("QUEEN_ENCRYPTION_KEY", hex)]).unwrap();
        let keys = c.encryption.expect("a key");
        assert_eq!(keys.current[..4], [0x00, 0x11, 0x22, 0x33]);
        assert_eq!(keys.current[31], 0xff);
        assert!(!format!("{keys:?}").contains("0011"), "Debug redacts the key");
        assert_eq!(parse(&[]).unwrap().encryption, None);
        for bad in [&hex[..62], "zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", "é0112233445566778899aabbccddeeff00112233445566778899aabbccddeef"] {
            let e = parse(&[("QUEEN_ENCRYPTION_KEY", bad)]).unwrap_err();
            assert_eq!(e.var, "QUEEN_ENCRYPTION_KEY");
            assert!(!e.to_string().contains(&bad[2..10]), "the error never echoes the key: {e}");
        }
        let older = format!("{},{}", "11".repeat(32), "22".repeat(32));
        let c = parse(&[("QUEEN_ENCRYPTION_KEY", hex), ("QUEEN_ENCRYPTION_KEYS", &older)]).unwrap();
        assert_eq!(c.encryption.unwrap().older, vec![[0x11; 32], [0x22; 32]]);
        assert_eq!(parse(&[("QUEEN_ENCRYPTION_KEY", hex), ("QUEEN_ENCRYPTION_KEYS", "abc")]).unwrap_err().var, "QUEEN_ENCRYPTION_KEYS");
        assert_eq!(parse(&[("QUEEN_ENCRYPTION_KEYS", &older)]).unwrap_err().var, "QUEEN_ENCRYPTION_KEYS", "older keys need a current one");
    }

    #[test]
    fn tenancy_needs_a_trusted_proxy_and_its_claim_needs_jwt() {
        assert_eq!(parse(&[]).unwrap().tenancy, TenancyConfig::default());
        let e = parse(&[("QUEEN_TENANCY_HEADER", "true")]).unwrap_err();
        assert_eq!(e.var, "QUEEN_TENANCY_HEADER");
        assert!(e.to_string().contains("QUEEN_TRUSTED_PROXY=true"), "{e}");
        assert!(parse(&[("QUEEN_TENANCY_HEADER", "true"), ("QUEEN_TRUSTED_PROXY", "true")]).unwrap().tenancy.header);
        assert_eq!(parse(&[("QUEEN_TENANT_CLAIM", "tid")]).unwrap_err().var, "QUEEN_TENANT_CLAIM");
        let c = parse(&[("QUEEN_TENANT_CLAIM", " tid "), ("JWT_ENABLED", "true"), ("JWT_SECRET", "s")]).unwrap();
        assert_eq!(c.auth.tenant_claim.as_deref(), Some("tid"));
    }

    #[test]
    fn the_url_wins_over_pg_host() {
        let c = parse(&[("PG_HOST", "db"), ("QUEEN_DATABASE_URL", "postgres://x@y/z")]).unwrap();
        assert_eq!(c.database, Database::Url("postgres://x@y/z".into()));
    }

    #[test]
    fn booleans_accept_the_four_spellings() {
        for (v, want) in [("yes", true), ("OFF", false), ("1", true), ("false", false), ("On", true)] {
            assert_eq!(parse(&[("QUEEN_APPLY_SCHEMA", v)]).unwrap().apply_schema, want, "{v}");
        }
    }

    #[test]
    fn a_malformed_value_names_the_variable_and_the_expectation() {
        let e = parse(&[("PORT", "http")]).unwrap_err();
        assert_eq!(e.var, "PORT");
        assert_eq!(e.to_string(), "invalid PORT=\"http\": expected a port number 0-65535");
        let e = parse(&[("QUEEN_LOG_JSON", "maybe")]).unwrap_err();
        assert_eq!(e.var, "QUEEN_LOG_JSON");
        let e = parse(&[("DB_STATEMENT_TIMEOUT", "-5")]).unwrap_err();
        assert_eq!(e.var, "DB_STATEMENT_TIMEOUT");
    }

    #[test]
    fn jwt_needs_key_material_for_its_algorithm() {
        assert_eq!(parse(&[("JWT_ENABLED", "true")]).unwrap_err().var, "JWT_SECRET");
        assert_eq!(parse(&[("JWT_ENABLED", "true"), ("JWT_ALGORITHM", "RS256")]).unwrap_err().var, "JWT_PUBLIC_KEY");
        assert_eq!(parse(&[("JWT_ENABLED", "1"), ("JWT_ALGORITHM", "auto")]).unwrap_err().var, "JWT_ALGORITHM");
        assert_eq!(parse(&[("JWT_ALGORITHM", "none")]).unwrap_err().var, "JWT_ALGORITHM");
        let c = parse(&[("JWT_ENABLED", "on"), ("JWT_SECRET", "s"), ("JWT_SKIP_PATHS", "/health, /x")]).unwrap();
        assert!(c.auth.enabled);
        assert_eq!(c.auth.skip_paths, ["/health", "/x"]);
    }

    #[test]
    fn the_rust_statement_timeout_name_wins() {
        let c = parse(&[("DB_STATEMENT_TIMEOUT", "5"), ("QUEEN_STMT_TIMEOUT_MS", "7")]).unwrap();
        assert_eq!(c.statement_timeout, Duration::from_millis(7));
    }
}

#[cfg(test)]
mod documentation {
    use super::Config;

    const BEGIN: &str = "<!-- variables: generated from Config::VARIABLES; QUEEN_BLESS=1 cargo test --lib documentation rewrites it -->\n";
    const END: &str = "<!-- end of variables -->";

    /// docs/CONFIGURATION.md's table is `Config::variables_markdown()`, byte
    /// for byte: the page cannot drift from the parser's list.
    #[test]
    fn the_configuration_page_is_the_variable_list() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CONFIGURATION.md");
        let page = std::fs::read_to_string(path).unwrap();
        let start = page.find(BEGIN).expect("the generated section's opening marker") + BEGIN.len();
        let end = page.find(END).expect("the generated section's closing marker");
        let want = Config::variables_markdown();
        if std::env::var_os("QUEEN_BLESS").is_some() {
            std::fs::write(path, format!("{}{want}{}", &page[..start], &page[end..])).unwrap();
            return;
        }
        assert_eq!(page[start..end], want, "docs/CONFIGURATION.md is stale: run QUEEN_BLESS=1 cargo test --lib documentation");
    }

    /// Every variable the parser reads (its name lists in this file) is in
    /// `Config::VARIABLES`, by name or as a named alias.
    #[test]
    fn every_variable_the_parser_reads_is_listed() {
        let source = include_str!("config.rs");
        let listed: Vec<&str> = Config::VARIABLES
            .iter()
            .flat_map(|(n, _, w)| n.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).chain(w.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))))
            .collect();
        let mut read = Vec::new();
        for chunk in source.split("&[\"").skip(1) {
            let list = &chunk[..chunk.find(']').unwrap()];
            read.extend(list.split(", ").map(|n| n.trim_matches('"').to_string()));
        }
        assert!(read.len() > 50, "the scan found the parser's names: {read:?}");
        for name in read.iter().filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')) {
            assert!(listed.contains(&name.as_str()), "{name} is read but not in Config::VARIABLES");
        }
    }
}
