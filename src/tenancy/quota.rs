//! Quotas per tenant (issue 49): how fast a tenant may push, read and write
//! KV and push ephemeral messages, and how much it may keep.
//!
//! Rates are token buckets in the broker, one per tenant and limit, so a
//! request pays a map lookup under one small lock and never a database round
//! trip. A rate is the tenant's across every broker on the database: each
//! broker enforces its share, the rate divided by the live brokers it last
//! counted (`queen.brokers`), and a bucket holds one second of its share, so
//! the tenant's burst is one second of its rate too. Totals (stored bytes,
//! queue count) are sampled from the database every `QUEEN_QUOTA_SAMPLE_MS`
//! and checked against the sample; the queues a broker creates between two
//! samples count at once. Ephemeral memory is the broker's own (ephemeral
//! queues live in one broker's memory), so its limit is per broker.
//!
//! The limits: the defaults of the configuration (`QUEEN_QUOTA_*`), and
//! over them what `POST /api/v1/resources/quota` stored for a tenant
//! (`queen.tenant_quotas`, migration 0042), one row per kind (`queues`,
//! `kv`, `ephemeral`, as upstream's route names kinds; `queues` are the
//! durable ones): a field present in the row replaces the default (null: no
//! limit), a field absent keeps it, and `enabled: false` refuses the kind
//! to the tenant altogether. The broker that takes the POST applies it at
//! once; the others at their next sample.
//!
//! Tolerance across brokers (docs/OPERATIONS.md): while the count of live
//! brokers is right, the brokers together admit at most the rate plus one
//! second's burst; for one sample interval after a broker joins or leaves,
//! each keeps its old share (at most one share too much or too little). A
//! total may be passed by what the brokers write within one sample interval.
//!
//! With no limit anywhere (no default, no row) every check is one atomic
//! load.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use deadpool_postgres::Pool;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::Tenant;
use crate::config::QuotaLimits;
use crate::db::DbError;

/// The kinds a quota row covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The durable queues: pushes, storage, queue count.
    Queues,
    Kv,
    Ephemeral,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Queues, Kind::Kv, Kind::Ephemeral];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Queues => "queues",
            Kind::Kv => "kv",
            Kind::Ephemeral => "ephemeral",
        }
    }

    pub fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == text)
    }

    /// The limits of this kind.
    pub fn limits(self) -> impl Iterator<Item = Limit> {
        Limit::ALL.into_iter().filter(move |l| l.kind() == self)
    }
}

/// One limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    PushMessages,
    PushBytes,
    StoredBytes,
    Queues,
    KvReads,
    KvWrites,
    EphemeralMessages,
    EphemeralBytes,
}

impl Limit {
    pub const ALL: [Limit; 8] = [
        Limit::PushMessages,
        Limit::PushBytes,
        Limit::StoredBytes,
        Limit::Queues,
        Limit::KvReads,
        Limit::KvWrites,
        Limit::EphemeralMessages,
        Limit::EphemeralBytes,
    ];

    pub fn kind(self) -> Kind {
        match self {
            Limit::PushMessages | Limit::PushBytes | Limit::StoredBytes | Limit::Queues => Kind::Queues,
            Limit::KvReads | Limit::KvWrites => Kind::Kv,
            Limit::EphemeralMessages | Limit::EphemeralBytes => Kind::Ephemeral,
        }
    }

    /// The field of the quota route (within its kind, as upstream spells
    /// the ones it has).
    pub fn field(self) -> &'static str {
        match self {
            Limit::PushMessages | Limit::EphemeralMessages => "maxMessagesPerSecond",
            Limit::PushBytes => "maxBytesPerSecond",
            Limit::StoredBytes => "maxStoredBytes",
            Limit::Queues => "maxQueues",
            Limit::KvReads => "maxReadsPerSecond",
            Limit::KvWrites => "maxWritesPerSecond",
            Limit::EphemeralBytes => "maxBytes",
        }
    }

    /// The name a refusal gives: unique across kinds.
    pub fn name(self) -> &'static str {
        match self {
            Limit::PushMessages => "pushMessagesPerSecond",
            Limit::PushBytes => "pushBytesPerSecond",
            Limit::StoredBytes => "storedBytes",
            Limit::Queues => "queues",
            Limit::KvReads => "kvReadsPerSecond",
            Limit::KvWrites => "kvWritesPerSecond",
            Limit::EphemeralMessages => "ephemeralMessagesPerSecond",
            Limit::EphemeralBytes => "ephemeralBytes",
        }
    }

    fn is_rate(self) -> bool {
        matches!(self, Limit::PushMessages | Limit::PushBytes | Limit::KvReads | Limit::KvWrites | Limit::EphemeralMessages)
    }

    pub fn get(self, l: &QuotaLimits) -> Option<u64> {
        match self {
            Limit::PushMessages => l.push_messages_per_second,
            Limit::PushBytes => l.push_bytes_per_second,
            Limit::StoredBytes => l.stored_bytes,
            Limit::Queues => l.queues,
            Limit::KvReads => l.kv_reads_per_second,
            Limit::KvWrites => l.kv_writes_per_second,
            Limit::EphemeralMessages => l.ephemeral_messages_per_second,
            Limit::EphemeralBytes => l.ephemeral_bytes,
        }
    }

    fn set(self, l: &mut QuotaLimits, v: Option<u64>) {
        *match self {
            Limit::PushMessages => &mut l.push_messages_per_second,
            Limit::PushBytes => &mut l.push_bytes_per_second,
            Limit::StoredBytes => &mut l.stored_bytes,
            Limit::Queues => &mut l.queues,
            Limit::KvReads => &mut l.kv_reads_per_second,
            Limit::KvWrites => &mut l.kv_writes_per_second,
            Limit::EphemeralMessages => &mut l.ephemeral_messages_per_second,
            Limit::EphemeralBytes => &mut l.ephemeral_bytes,
        } = v;
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// A rate is spent: 429 `rate_limited`, `Retry-After` the seconds until
    /// the request would fit (`wait_ms` to the millisecond: the Kafka
    /// listener waits that long instead of refusing).
    Rate { limit: Limit, retry_after: u64, wait_ms: u64 },
    /// A total is reached: 403 `quota_exceeded`.
    Total { limit: Limit, quota: u64, usage: u64 },
    /// The kind is switched off for the tenant: 403 `quota_exceeded`.
    Disabled { kind: Kind },
}

impl Refused {
    /// What the refusal says to the caller (an HTTP body's `error`, a Kafka
    /// error message).
    pub fn message(&self) -> String {
        match self {
            Refused::Rate { limit, retry_after, .. } => {
                format!("rate limited: the tenant's {} quota is spent; retry after {retry_after} s", limit.name())
            }
            Refused::Total { limit, quota, usage } => format!("quota exceeded: {} is at {usage} of the tenant's {quota}", limit.name()),
            Refused::Disabled { kind } => format!("quota exceeded: {} are not enabled for this tenant", kind.name()),
        }
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let error = self.message();
        match self {
            Refused::Rate { limit, retry_after, .. } => {
                let mut r = (
                    StatusCode::TOO_MANY_REQUESTS,
                    Json(json!({"error": error, "code": "rate_limited", "limit": limit.name(), "retryAfter": retry_after})),
                )
                    .into_response();
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
                r
            }
            Refused::Total { limit, quota, usage } => (
                StatusCode::FORBIDDEN,
                Json(json!({"error": error, "code": "quota_exceeded", "limit": limit.name(), "quota": quota, "usage": usage})),
            )
                .into_response(),
            Refused::Disabled { kind } => (
                StatusCode::FORBIDDEN,
                Json(json!({"error": error, "code": "quota_exceeded", "limit": format!("{}.enabled", kind.name())})),
            )
                .into_response(),
        }
    }
}

/// What a tenant's row of one kind says.
#[derive(Debug, Clone, PartialEq)]
pub struct KindRow {
    pub enabled: bool,
    /// The limits the row sets (None: no limit); the others keep the default.
    pub set: Vec<(Limit, Option<u64>)>,
}

/// A tenant's limits in force.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Effective {
    pub limits: QuotaLimits,
    disabled: [bool; 3],
}

impl Effective {
    pub fn enabled(&self, kind: Kind) -> bool {
        !self.disabled[kind as usize]
    }
}

/// A token bucket holding at most one second of its rate.
#[derive(Debug, Clone)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Refills for the time passed at `rate`; the tokens now.
    fn refill(&mut self, rate: f64, now: Instant) -> f64 {
        let cap = rate.max(1.0);
        self.tokens = (self.tokens + rate * now.duration_since(self.at).as_secs_f64()).min(cap);
        self.at = now;
        self.tokens
    }
}

/// What a broker knows of its tenants' usage.
#[derive(Default)]
struct Usage {
    /// Sampled stored bytes (tenants with such a limit).
    stored: HashMap<Uuid, u64>,
    /// The queues of the tenants with a queue limit: sampled, plus the ones
    /// this broker created since.
    queues: HashMap<Uuid, HashSet<String>>,
    /// The queues this broker admitted, until a sample sees them (or
    /// [`ADMITTED_FOR`] passes: the push that would have created one
    /// failed). A sample whose read ran before such a push committed would
    /// otherwise drop the queue from `queues`, and the next new queue would
    /// pass the count.
    admitted: HashMap<Uuid, HashMap<String, Instant>>,
    buckets: HashMap<(Uuid, Limit), Bucket>,
}

/// How long an admitted queue counts without a sample having seen it.
const ADMITTED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Default)]
struct Inner {
    rows: HashMap<Uuid, HashMap<Kind, KindRow>>,
    usage: Usage,
    /// Live brokers at the last sample (a rate's share is rate / brokers).
    brokers: u64,
    sampled_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The tenants whose push rate may be in debt (a throttled Kafka
    /// produce, or a request larger than a second's rate), until a check
    /// finds the debt paid.
    debtors: HashSet<Uuid>,
}

/// This broker's quotas: the limits in force and the usage it tracks.
pub struct Quotas {
    defaults: QuotaLimits,
    /// Whether any limit exists (a default or a row): else no check looks further.
    active: AtomicBool,
    inner: Mutex<Inner>,
    /// How many tenants `Inner::debtors` holds, read without the lock: the
    /// Kafka listener asks before every frame whether its tenant is in
    /// debt, and while nobody is, that costs one atomic load.
    debtors: AtomicUsize,
    /// Held through a whole [`Quotas::sample`]: samples run one after
    /// another, so one that read the rows before a quota was stored can no
    /// longer land after the sample of that store and put the old rows back.
    sampling: tokio::sync::Mutex<()>,
}

impl Quotas {
    pub fn new(defaults: QuotaLimits) -> Quotas {
        Quotas {
            defaults,
            active: AtomicBool::new(defaults != QuotaLimits::default()),
            inner: Mutex::new(Inner { brokers: 1, ..Default::default() }),
            debtors: AtomicUsize::new(0),
            sampling: tokio::sync::Mutex::new(()),
        }
    }

    /// The limits in force for `tenant`.
    pub fn effective(&self, tenant: Tenant) -> Effective {
        effective(&self.defaults, self.inner.lock().expect("quotas").rows.get(&tenant.0))
    }

    /// The tenant's stored row of each kind.
    pub fn rows(&self, tenant: Tenant) -> HashMap<Kind, KindRow> {
        self.inner.lock().expect("quotas").rows.get(&tenant.0).cloned().unwrap_or_default()
    }

    /// A push of `messages` messages, `bytes` payload bytes, to the stored
    /// queue names `queues`: admitted (its tokens taken, its new queues
    /// counted) or refused, taking nothing.
    pub fn push(&self, tenant: Tenant, queues: &[&str], messages: u64, bytes: u64) -> Result<(), Refused> {
        self.push_as(tenant, queues, messages, bytes, false).map(drop)
    }

    /// A push admitted past a spent rate, leaving the tenant's buckets in
    /// debt (the totals still refuse), answering how long paying it takes:
    /// the Kafka listener's, which then reads nothing more of the tenant's
    /// connections until the debt is paid ([`Quotas::push_debt`]), as
    /// Kafka's brokers throttle.
    pub fn push_throttled(&self, tenant: Tenant, queues: &[&str], messages: u64, bytes: u64) -> Result<std::time::Duration, Refused> {
        self.push_as(tenant, queues, messages, bytes, true)
    }

    /// How long until the tenant's push rate is out of debt on this broker
    /// (`None`: it is not in debt).
    pub fn push_debt(&self, tenant: Tenant) -> Option<std::time::Duration> {
        if !self.active.load(Ordering::Relaxed) || self.debtors.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut inner = self.inner.lock().expect("quotas");
        if !inner.debtors.contains(&tenant.0) {
            return None;
        }
        let eff = effective(&self.defaults, inner.rows.get(&tenant.0));
        self.debt(&mut inner, tenant, &eff)
    }

    /// The tenant's push debt now, keeping `debtors` in step with it.
    fn debt(&self, inner: &mut Inner, tenant: Tenant, eff: &Effective) -> Option<std::time::Duration> {
        let brokers = inner.brokers.max(1);
        let now = Instant::now();
        let mut wait = 0f64;
        for limit in [Limit::PushMessages, Limit::PushBytes] {
            let (Some(rate), Some(b)) = (limit.get(&eff.limits), inner.usage.buckets.get_mut(&(tenant.0, limit))) else { continue };
            let share = rate as f64 / brokers as f64;
            let tokens = b.refill(share, now);
            if tokens < 0.0 && share > 0.0 {
                wait = wait.max(-tokens / share);
            }
        }
        let changed = if wait > 0.0 { inner.debtors.insert(tenant.0) } else { inner.debtors.remove(&tenant.0) };
        if changed {
            self.debtors.store(inner.debtors.len(), Ordering::Relaxed);
        }
        (wait > 0.0).then(|| std::time::Duration::from_secs_f64(wait.min(3600.0)))
    }

    /// A push admitted (`Ok` with the debt it left, zero for none) or refused.
    fn push_as(&self, tenant: Tenant, queues: &[&str], messages: u64, bytes: u64, into_debt: bool) -> Result<std::time::Duration, Refused> {
        let Some((mut inner, eff)) = self.gate(tenant, Kind::Queues)? else { return Ok(std::time::Duration::ZERO) };
        if let Some(quota) = eff.limits.stored_bytes {
            let usage = inner.usage.stored.get(&tenant.0).copied().unwrap_or(0);
            if usage >= quota {
                return Err(Refused::Total { limit: Limit::StoredBytes, quota, usage });
            }
        }
        let mut new: Vec<&str> = Vec::new();
        if let Some(quota) = eff.limits.queues {
            let known = inner.usage.queues.entry(tenant.0).or_default();
            new = queues.iter().copied().filter(|q| !known.contains(*q)).collect();
            new.sort_unstable();
            new.dedup();
            if !new.is_empty() && known.len() as u64 + new.len() as u64 > quota {
                return Err(Refused::Total { limit: Limit::Queues, quota, usage: known.len() as u64 });
            }
        }
        let brokers = inner.brokers;
        take(&mut inner.usage.buckets, tenant, &eff, brokers, &[(Limit::PushMessages, messages), (Limit::PushBytes, bytes)], into_debt)?;
        if !new.is_empty() {
            let now = Instant::now();
            inner.usage.admitted.entry(tenant.0).or_default().extend(new.iter().map(|q| (q.to_string(), now)));
            inner.usage.queues.entry(tenant.0).or_default().extend(new.into_iter().map(str::to_string));
        }
        Ok(self.debt(&mut inner, tenant, &eff).unwrap_or_default())
    }

    /// The first steps of every check: nothing to check (no limit
    /// anywhere: `None`), the kind switched off for the tenant, or the
    /// state locked with the tenant's limits in force.
    #[allow(clippy::type_complexity)]
    fn gate(&self, tenant: Tenant, kind: Kind) -> Result<Option<(std::sync::MutexGuard<'_, Inner>, Effective)>, Refused> {
        if !self.active.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let inner = self.inner.lock().expect("quotas");
        let eff = effective(&self.defaults, inner.rows.get(&tenant.0));
        if !eff.enabled(kind) {
            return Err(Refused::Disabled { kind });
        }
        Ok(Some((inner, eff)))
    }

    /// A push of `items` (stored names).
    pub fn push_items(&self, tenant: Tenant, items: &[crate::push::PushItem<'_>]) -> Result<(), Refused> {
        self.push_and_schedule(tenant, items, &[])
    }

    /// A push of `items` with timers scheduled by `timers` (each a message
    /// to come: counted now, so timers are no way around the push rate),
    /// admitted or refused together.
    pub fn push_and_schedule(&self, tenant: Tenant, items: &[crate::push::PushItem<'_>], timers: &[crate::timers::TimerOp]) -> Result<(), Refused> {
        if !self.active.load(Ordering::Relaxed) {
            return Ok(());
        }
        let scheduled = timers.iter().filter_map(|op| match op {
            crate::timers::TimerOp::Schedule { queue, payload, .. } => Some((queue.as_str(), payload.len() as u64)),
            crate::timers::TimerOp::Cancel { .. } => None,
        });
        let load: Vec<(&str, u64)> = items.iter().map(|i| (&*i.queue, i.payload.len() as u64)).chain(scheduled).collect();
        if load.is_empty() {
            return Ok(());
        }
        let mut queues: Vec<&str> = Vec::new();
        for (queue, _) in &load {
            if queues.last() != Some(queue) && !queues.contains(queue) {
                queues.push(queue);
            }
        }
        self.push(tenant, &queues, load.len() as u64, load.iter().map(|(_, b)| b).sum())
    }

    /// A KV call of `reads` reading and `writes` writing operations.
    pub fn kv(&self, tenant: Tenant, reads: u64, writes: u64) -> Result<(), Refused> {
        let Some((mut inner, eff)) = self.gate(tenant, Kind::Kv)? else { return Ok(()) };
        let brokers = inner.brokers;
        take(&mut inner.usage.buckets, tenant, &eff, brokers, &[(Limit::KvReads, reads), (Limit::KvWrites, writes)], false)
    }

    /// An ephemeral push of `messages` messages holding `bytes`, the tenant
    /// holding `held()` bytes of this broker's memory already.
    pub fn ephemeral(&self, tenant: Tenant, messages: u64, bytes: u64, held: impl FnOnce() -> u64) -> Result<(), Refused> {
        let Some((mut inner, eff)) = self.gate(tenant, Kind::Ephemeral)? else { return Ok(()) };
        if let Some(quota) = eff.limits.ephemeral_bytes {
            let usage = held();
            if usage + bytes > quota {
                return Err(Refused::Total { limit: Limit::EphemeralBytes, quota, usage });
            }
        }
        let brokers = inner.brokers;
        take(&mut inner.usage.buckets, tenant, &eff, brokers, &[(Limit::EphemeralMessages, messages)], false)
    }

    /// What each of the tenant's rates has left on this broker, the live
    /// brokers sharing it, and when the broker last sampled.
    pub fn usage(&self, tenant: Tenant) -> Value {
        let mut inner = self.inner.lock().expect("quotas");
        let eff = effective(&self.defaults, inner.rows.get(&tenant.0));
        let brokers = inner.brokers;
        let now = Instant::now();
        let mut available = Map::new();
        for limit in Limit::ALL.into_iter().filter(|l| l.is_rate()) {
            if let Some(rate) = limit.get(&eff.limits) {
                let share = rate as f64 / brokers as f64;
                let tokens = inner
                    .usage
                    .buckets
                    .get_mut(&(tenant.0, limit))
                    .map_or(share.max(1.0), |b| b.refill(share, now));
                available.insert(limit.name().into(), json!(tokens.floor().max(0.0)));
            }
        }
        json!({
            "availableOnThisBroker": available,
            "brokers": brokers,
            "sampledAt": inner.sampled_at.map(crate::json::iso_ms),
        })
    }

    /// Reloads the rows, counts the live brokers and samples the totals
    /// the limits in force need.
    pub async fn sample(&self, pool: &Pool) -> Result<(), DbError> {
        let _one_at_a_time = self.sampling.lock().await;
        let client = pool.get().await?;
        let rows = client.query("SELECT tenant_id, kind, enabled, limits::text FROM queen.tenant_quotas", &[]).await?;
        let mut by_tenant: HashMap<Uuid, HashMap<Kind, KindRow>> = HashMap::new();
        for r in &rows {
            let Some(kind) = Kind::parse(r.get::<_, &str>(1)) else { continue };
            let limits: Value = serde_json::from_str(r.get(3)).unwrap_or(Value::Null);
            by_tenant.entry(r.get(0)).or_default().insert(kind, KindRow { enabled: r.get(2), set: row_limits(kind, &limits) });
        }
        let live: i64 = client
            .query_one(
                "SELECT count(*) FROM queen.brokers WHERE heartbeat_at > now() - make_interval(secs => $1)",
                &[&crate::cluster::LIVE_WITHIN_SECONDS],
            )
            .await?
            .get(0);
        // Whose totals to sample: every tenant's when a default limits them,
        // else those whose row does.
        let needs = |limit: Limit| -> Option<Vec<Uuid>> {
            if limit.get(&self.defaults).is_some() {
                return Some(Vec::new());
            }
            let some: Vec<Uuid> = by_tenant.iter().filter(|(_, rows)| limit.get(&effective(&self.defaults, Some(rows)).limits).is_some()).map(|(t, _)| *t).collect();
            (!some.is_empty()).then_some(some)
        };
        let mut stored = HashMap::new();
        if let Some(tenants) = needs(Limit::StoredBytes) {
            let rows = client
                .query(
                    "SELECT q.tenant_id, COALESCE(sum(pg_column_size(s.blob)), 0)::bigint
                     FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id JOIN queen.segments s ON s.partition_id = p.id
                     WHERE cardinality($1::uuid[]) = 0 OR q.tenant_id = ANY ($1) GROUP BY 1",
                    &[&tenants],
                )
                .await?;
            stored = rows.iter().map(|r| (r.get::<_, Uuid>(0), r.get::<_, i64>(1) as u64)).collect();
        }
        let mut queues: HashMap<Uuid, HashSet<String>> = HashMap::new();
        if let Some(tenants) = needs(Limit::Queues) {
            let rows = client
                .query("SELECT tenant_id, name FROM queen.queues WHERE cardinality($1::uuid[]) = 0 OR tenant_id = ANY ($1)", &[&tenants])
                .await?;
            for r in &rows {
                queues.entry(r.get(0)).or_default().insert(r.get(1));
            }
        }
        let mut inner = self.inner.lock().expect("quotas");
        self.active.store(self.defaults != QuotaLimits::default() || !by_tenant.is_empty(), Ordering::Relaxed);
        inner.rows = by_tenant;
        inner.brokers = (live.max(1)) as u64;
        inner.usage.stored = stored;
        // Queues admitted here that the read did not see yet still count.
        let now = Instant::now();
        for (tenant, admitted) in &mut inner.usage.admitted {
            let seen = queues.get(tenant);
            admitted.retain(|q, at| !seen.is_some_and(|s| s.contains(q)) && now.duration_since(*at) < ADMITTED_FOR);
            if !admitted.is_empty() {
                queues.entry(*tenant).or_default().extend(admitted.keys().cloned());
            }
        }
        inner.usage.admitted.retain(|_, a| !a.is_empty());
        inner.usage.queues = queues;
        inner.sampled_at = Some(chrono::Utc::now());
        Ok(())
    }

    /// Forgets a purged tenant's usage.
    pub fn forget(&self, tenant: Tenant) {
        let mut inner = self.inner.lock().expect("quotas");
        inner.usage.stored.remove(&tenant.0);
        inner.usage.queues.remove(&tenant.0);
        inner.usage.admitted.remove(&tenant.0);
        inner.usage.buckets.retain(|(t, _), _| *t != tenant.0);
    }
}

/// The limits of a stored row's JSON (fields of other kinds, or not
/// numbers, are not there: the route stores only what it validated).
fn row_limits(kind: Kind, limits: &Value) -> Vec<(Limit, Option<u64>)> {
    kind.limits().filter_map(|l| limits.get(l.field()).map(|v| (l, v.as_u64()))).collect()
}

fn effective(defaults: &QuotaLimits, rows: Option<&HashMap<Kind, KindRow>>) -> Effective {
    let mut eff = Effective { limits: *defaults, disabled: [false; 3] };
    for (kind, row) in rows.into_iter().flatten() {
        eff.disabled[*kind as usize] = !row.enabled;
        for (limit, v) in &row.set {
            limit.set(&mut eff.limits, *v);
        }
    }
    eff
}

/// Takes `amounts` from the tenant's buckets, all or none: a request larger
/// than a bucket holds passes when the bucket is full (and leaves it in
/// debt), so no request is refused for ever. `into_debt`: taken whatever
/// the buckets hold (the caller waits the debt out instead).
fn take(
    buckets: &mut HashMap<(Uuid, Limit), Bucket>,
    tenant: Tenant,
    eff: &Effective,
    brokers: u64,
    amounts: &[(Limit, u64)],
    into_debt: bool,
) -> Result<(), Refused> {
    let now = Instant::now();
    let mut wait: Option<(Limit, f64)> = None;
    for &(limit, n) in amounts {
        let Some(rate) = limit.get(&eff.limits).filter(|_| n > 0) else { continue };
        let share = rate as f64 / brokers as f64;
        let b = buckets.entry((tenant.0, limit)).or_insert_with(|| Bucket { tokens: share.max(1.0), at: now });
        let tokens = b.refill(share, now);
        let need = (n as f64).min(share.max(1.0));
        if tokens < need {
            let secs = if share > 0.0 { (need - tokens) / share } else { f64::INFINITY };
            if wait.is_none_or(|(_, w)| secs > w) {
                wait = Some((limit, secs));
            }
        }
    }
    if let Some((limit, secs)) = wait.filter(|_| !into_debt) {
        let wait_ms = (secs * 1000.0).ceil().clamp(1.0, 3_600_000.0) as u64;
        return Err(Refused::Rate { limit, retry_after: (secs.ceil() as u64).clamp(1, 3600), wait_ms });
    }
    for &(limit, n) in amounts {
        if let Some(b) = buckets.get_mut(&(tenant.0, limit)) {
            b.tokens -= n as f64;
        }
    }
    Ok(())
}

/// Stores `tenant`'s row of `kind` (replacing the one before) and applies it here.
pub async fn store(pool: &Pool, quotas: &Quotas, tenant: Tenant, kind: Kind, enabled: bool, limits: &Map<String, Value>) -> Result<(), DbError> {
    pool.get()
        .await?
        .execute(
            "INSERT INTO queen.tenant_quotas (tenant_id, kind, enabled, limits) VALUES ($1, $2, $3, $4::text::jsonb)
             ON CONFLICT (tenant_id, kind) DO UPDATE SET enabled = EXCLUDED.enabled, limits = EXCLUDED.limits, updated_at = now()",
            &[&tenant.0, &kind.name(), &enabled, &Value::Object(limits.clone()).to_string()],
        )
        .await?;
    quotas.sample(pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(rows: &[(Kind, KindRow)]) -> (Quotas, Tenant) {
        let t = Tenant(Uuid::from_u128(7));
        let q = Quotas::new(QuotaLimits::default());
        q.active.store(true, Ordering::Relaxed);
        q.inner.lock().unwrap().rows.insert(t.0, rows.iter().cloned().collect());
        (q, t)
    }

    #[test]
    fn a_rate_admits_one_second_then_refuses_with_the_wait() {
        let (q, t) = quotas(&[(Kind::Queues, KindRow { enabled: true, set: vec![(Limit::PushMessages, Some(10))] })]);
        assert_eq!(q.push(t, &["a"], 6, 0), Ok(()));
        assert_eq!(q.push(t, &["a"], 4, 0), Ok(()));
        assert!(matches!(q.push(t, &["a"], 1, 0), Err(Refused::Rate { limit: Limit::PushMessages, retry_after: 1, wait_ms: 1..=1000 })));
        // Another tenant, and another limit, are not touched.
        assert_eq!(q.push(Tenant(Uuid::from_u128(8)), &["a"], 100, 0), Ok(()));
        assert_eq!(q.kv(t, 1000, 1000), Ok(()));
    }

    #[test]
    fn a_throttled_push_goes_into_debt_and_says_how_long_paying_it_takes() {
        let (q, t) = quotas(&[(Kind::Queues, KindRow { enabled: true, set: vec![(Limit::PushMessages, Some(10))] })]);
        assert_eq!(q.push_debt(t), None);
        let owed = q.push_throttled(t, &["a"], 30, 0).expect("admitted past the rate");
        assert!(owed > std::time::Duration::from_millis(1900) && owed <= std::time::Duration::from_secs(2), "{owed:?}");
        let debt = q.push_debt(t).expect("in debt");
        assert!(debt > std::time::Duration::from_millis(1900) && debt <= owed, "{debt:?}");
        assert!(matches!(q.push(t, &["a"], 1, 0), Err(Refused::Rate { .. })), "an HTTP push is refused meanwhile");
        assert_eq!(q.push_debt(Tenant(Uuid::from_u128(8))), None, "another tenant owes nothing");
        // Paid (as if two seconds had passed): the tenant is out of debt, and
        // the check before each Kafka frame is back to one atomic load.
        for b in q.inner.lock().unwrap().usage.buckets.values_mut() {
            b.at -= std::time::Duration::from_secs(3);
        }
        assert_eq!(q.debtors.load(Ordering::Relaxed), 1);
        assert_eq!(q.push_debt(t), None);
        assert_eq!(q.debtors.load(Ordering::Relaxed), 0, "no debtor left");
    }

    #[test]
    fn a_request_larger_than_a_second_passes_on_a_full_bucket_and_leaves_a_debt() {
        let (q, t) = quotas(&[(Kind::Queues, KindRow { enabled: true, set: vec![(Limit::PushBytes, Some(100))] })]);
        assert_eq!(q.push(t, &["a"], 1, 1000), Ok(()));
        match q.push(t, &["a"], 1, 1) {
            Err(Refused::Rate { limit: Limit::PushBytes, retry_after, .. }) => assert!((9..=10).contains(&retry_after), "{retry_after}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn totals_and_switched_off_kinds_refuse_and_take_nothing() {
        let (q, t) = quotas(&[
            (Kind::Queues, KindRow { enabled: true, set: vec![(Limit::Queues, Some(2)), (Limit::PushMessages, Some(5))] }),
            (Kind::Kv, KindRow { enabled: false, set: vec![] }),
        ]);
        assert_eq!(q.push(t, &["a", "b"], 1, 0), Ok(()));
        assert_eq!(q.push(t, &["c"], 1, 0), Err(Refused::Total { limit: Limit::Queues, quota: 2, usage: 2 }));
        assert_eq!(q.push(t, &["a"], 3, 0), Ok(()), "the refused push took no token");
        assert_eq!(q.kv(t, 1, 0), Err(Refused::Disabled { kind: Kind::Kv }));
        assert_eq!(q.ephemeral(t, 1, 10, || 0), Ok(()));
    }

    #[test]
    fn a_row_overrides_the_defaults_field_by_field() {
        let defaults = QuotaLimits { push_messages_per_second: Some(5), queues: Some(3), ..Default::default() };
        let rows: HashMap<Kind, KindRow> = [(Kind::Queues, KindRow { enabled: true, set: vec![(Limit::PushMessages, None)] })].into();
        let eff = effective(&defaults, Some(&rows));
        assert_eq!((eff.limits.push_messages_per_second, eff.limits.queues), (None, Some(3)));
        assert_eq!(row_limits(Kind::Kv, &json!({"maxReadsPerSecond": 4, "maxWritesPerSecond": null, "maxQueues": 1})),
                   vec![(Limit::KvReads, Some(4)), (Limit::KvWrites, None)]);
    }
}
