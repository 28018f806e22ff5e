//! Tenants (issue 49): whose namespace a request acts in.
//!
//! A tenant is an opaque UUID, as upstream's: it comes from the
//! `x-queen-tenant` header, set by a trusted proxy that strips the
//! client's copy (`QUEEN_TENANCY_HEADER`, which the configuration refuses
//! without `QUEEN_TRUSTED_PROXY`), or from a claim of the caller's verified
//! token (`QUEEN_TENANT_CLAIM`), in which case a header that disagrees is
//! refused. A request that names none runs as the default tenant, which is
//! also every request's tenant while both are off: one bool decides, so a
//! broker without tenancy pays nothing here.
//!
//! Shaped as one function the front door calls after authentication
//! ([`resolve`]), answering either the tenant or the refusal itself (400 for
//! a malformed header, 403 for a reserved tenant, a missing or disagreeing
//! claim), so that no handler ever sees a request whose tenant is in doubt.
//!
//! Isolation by name: a tenant's queue is stored behind the tenant's
//! prefix ([`Tenant::inner`], migration 0039), so everything keyed by a
//! queue's name or id inside the broker and the database is per tenant
//! without knowing it; names are mapped in at the edge and shown without
//! the prefix ([`shown`]), and an id a request names (a partition id in an
//! ack) is checked against the tenant ([`Owners`]). Every family keeps its
//! data so: KV namespaces, lock namespaces, timers, stream queries, trace
//! names and ephemeral queues are stored behind the same prefix, and the
//! reads across queues (listings, status, analytics, the discovery pop)
//! are confined to the tenant's names. A route the rules below do not know
//! ([`isolated`]) is refused whenever tenancy is on (403
//! `tenant_unsupported`), for the default tenant too: a route added without
//! thinking of tenants would read or write across all of them
//! (tests/api_reference.rs holds every route of the router to the rules).

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use uuid::Uuid;

use crate::config::Config;

pub mod quota;
use crate::http::auth::Principal;

/// The tenant of a request that names none (upstream's `DEFAULT_TENANT`).
pub const DEFAULT_TENANT: &str = "00000000-0000-0000-0000-000000000001";

/// The header a trusted proxy sets.
pub const HEADER: &str = "x-queen-tenant";

/// Upstream's system tenant and its proxy's: no route acts on either.
const RESERVED: [Uuid; 2] = [Uuid::from_u128(0xfffd), Uuid::from_u128(0xfffe)];

/// A request's tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tenant(pub Uuid);

impl Default for Tenant {
    fn default() -> Self {
        Tenant(Uuid::from_u128(1))
    }
}

impl Tenant {
    pub fn is_default(&self) -> bool {
        *self == Tenant::default()
    }

    /// [`Tenant::inner`], owned.
    pub fn stored(&self, name: &str) -> String {
        self.inner(name).into_owned()
    }

    /// [`Tenant::stored`] of a name the caller owns: unchanged, without a
    /// copy, when it is stored as given (the default tenant's names).
    pub fn into_stored(&self, name: String) -> String {
        match self.inner(&name) {
            std::borrow::Cow::Borrowed(_) => name,
            std::borrow::Cow::Owned(stored) => stored,
        }
    }

    /// Whether the stored name `stored` is this tenant's.
    pub fn owns(&self, stored: &str) -> bool {
        match stored.strip_prefix(MARK) {
            None => self.is_default(),
            Some(rest) => !self.is_default() && rest.len() > 37 && rest.as_bytes()[36] == MARK as u8 && rest[..36] == self.0.hyphenated().to_string(),
        }
    }

    /// An SQL condition true of the stored names in column `col` that are
    /// this tenant's (the text holds only the tenant's UUID, no input).
    pub fn owns_sql(&self, col: &str) -> String {
        if self.is_default() {
            format!("left({col}, 1) <> chr(1)")
        } else {
            format!("starts_with({col}, chr(1) || '{}' || chr(1))", self.0.hyphenated())
        }
    }

    /// An SQL expression of the name in column `col` as this tenant knows
    /// it (on a name [`Tenant::owns_sql`] holds of).
    pub fn shown_sql(&self, col: &str) -> String {
        if self.is_default() {
            col.to_string()
        } else {
            format!("substr({col}, 39)")
        }
    }

    /// Moves push items to this tenant's queues: their stored names, each
    /// distinct name mapped once (a request's items mostly share one).
    pub fn own(&self, items: &mut [crate::push::PushItem<'_>]) {
        if self.is_default() {
            return;
        }
        let mut last: Option<(String, String)> = None;
        for item in items.iter_mut() {
            let stored = match &last {
                Some((given, stored)) if *given == *item.queue => stored.clone(),
                _ => {
                    let stored = self.stored(&item.queue);
                    last = Some((item.queue.to_string(), stored.clone()));
                    stored
                }
            };
            item.queue = std::borrow::Cow::Owned(stored);
        }
    }

    /// The stored name of this tenant's queue `name`: the name itself for
    /// the default tenant, else the name behind the tenant's prefix
    /// (see [`MARK`]).
    pub fn inner<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        if self.is_default() {
            if name.starts_with(MARK) {
                // Spelled like another tenant's stored name: mapped where no
                // queue is (no route creates a queue whose name holds a
                // control character), so it names nothing.
                return std::borrow::Cow::Owned(format!("{MARK}{MARK}{name}"));
            }
            std::borrow::Cow::Borrowed(name)
        } else {
            std::borrow::Cow::Owned(format!("{MARK}{}{MARK}{name}", self.0.hyphenated()))
        }
    }
}

/// What opens and closes a tenant's prefix in a stored queue name. A
/// control character: no name a client gives can hold one
/// (`push::validate::check_name`), so no default-tenant name can ever
/// spell another tenant's prefix.
pub const MARK: char = '\u{1}';

/// A stored queue name as its tenant knows it: the prefix removed. Every
/// answer that shows a queue name passes it through here; a request only
/// ever reaches its own tenant's queues, so which tenant does not matter.
pub fn shown(stored: &str) -> &str {
    match stored.strip_prefix(MARK) {
        Some(rest) if rest.len() > 37 && rest.as_bytes()[36] == MARK as u8 => &rest[37..],
        _ => stored,
    }
}

/// A handler names its tenant by taking a `Tenant`: the one the front door
/// recorded, else the default (which it never records).
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Tenant {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Tenant>().copied().unwrap_or_default())
    }
}

/// The Prometheus labels of a stored queue name: the name as its tenant
/// knows it, and for a tenant other than the default its `tenant` (as
/// upstream's series carry it; the default tenant's carry none, so a broker
/// without tenancy exports what it always did).
pub fn queue_labels(stored: &str) -> Vec<metrics::Label> {
    let name = shown(stored);
    if name.len() == stored.len() {
        vec![metrics::Label::new("queue", stored.to_string())]
    } else {
        vec![metrics::Label::new("queue", name.to_string()), metrics::Label::new("tenant", stored[1..37].to_string())]
    }
}

/// The tenant whose stored name `stored` is.
pub fn owner_of(stored: &str) -> Uuid {
    match stored.strip_prefix(MARK) {
        Some(rest) if rest.len() > 37 && rest.as_bytes()[36] == MARK as u8 => Uuid::parse_str(&rest[..36]).unwrap_or(Tenant::default().0),
        _ => Tenant::default().0,
    }
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Routes whose tenant the front door does not resolve: those that act on
/// the whole broker, not on a tenant's data (health, metrics, the broker
/// list and the broker's own state, the documentation and the dashboard's
/// files), and `/auth/me`, which resolves its own with the token it
/// verifies (`http::identity`).
pub fn broker_wide(path: &str) -> bool {
    matches!(
        path,
        "/" | "/health" | "/metrics" | "/metrics/prometheus" | "/status" | "/api/v1/openapi.json"
            | "/auth/login" | "/auth/logout" | "/auth/me"
            | "/api/v1/status/buffers" | "/api/v1/analytics/system-metrics" | "/api/v1/analytics/worker-metrics"
            | "/api/v1/analytics/postgres-stats" | "/api/v1/analytics/queue-parked-replicas"
    ) || path.starts_with("/dashboard/")
        || path.starts_with("/api/v1/system/")
}

/// The routes whose data is kept per tenant: every route of the router but
/// the broker-wide ones ([`broker_wide`]). A route missing here is refused
/// while tenancy is on (see the module's doc).
pub fn isolated(method: &Method, path: &str) -> bool {
    let get = method == Method::GET;
    (method == Method::POST
        && matches!(path, "/api/v1/push" | "/api/v1/ack" | "/api/v1/ack/batch" | "/api/v1/configure" | "/api/v1/transaction"))
        || (method == Method::POST && path.starts_with("/api/v1/lease/") && path.ends_with("/extend"))
        || (get && (path.starts_with("/api/v1/pop/queue/") || path == "/api/v1/pop"))
        || (get && path == "/api/v1/resources/queues")
        || (get && path.starts_with("/api/v1/resources/queues/") && path.matches('/').count() == 5)
        // One queue named in the path: the depth, its deletion, a group's
        // cursors on it and their seeks.
        || (get && path.starts_with("/api/v1/resources/queues/") && path.ends_with("/depth") && path.matches('/').count() == 6)
        || (method == Method::DELETE && path.starts_with("/api/v1/resources/queues/") && path.matches('/').count() == 5)
        || (path.starts_with("/api/v1/consumer-groups/") && path.contains("/queues/")
            && (method == Method::DELETE && path.matches('/').count() == 6
                || method == Method::POST && path.ends_with("/seek") && matches!(path.matches('/').count(), 7 | 9)))
        // The consumer groups: listed, looked up and deleted on the tenant's queues.
        || (get && (path == "/api/v1/consumer-groups" || path == "/api/v1/consumer-groups/lagging"))
        || ((get || method == Method::DELETE) && path.starts_with("/api/v1/consumer-groups/") && path.matches('/').count() == 4)
        // KV (the tenant's namespaces), locks (its locks namespace) and the
        // consumers its clients publish there.
        || (method == Method::POST && matches!(path, "/api/v1/kv" | "/api/v1/locks" | "/api/v1/resources/kv/list"))
        || (path.starts_with("/api/v1/kv/") && matches!(*method, Method::GET | Method::PUT | Method::DELETE))
        || (get && matches!(path, "/api/v1/resources/kv/namespaces" | "/api/v1/consumers"))
        // Dead letters and messages (by the tenant's queue names and
        // partition ids), traces (by partition id and the tenant's names),
        // the reads by offset, the status and analytics reads and the
        // resource roll-ups (confined to the tenant's queues).
        || (path.starts_with("/api/v1/messages") || path.starts_with("/api/v1/dlq") || path.starts_with("/api/v1/traces")
            || path.starts_with("/api/v1/status") || path.starts_with("/api/v1/analytics/"))
        || (method == Method::POST && matches!(path, "/api/v1/fetch" | "/api/v1/partitions/changed" | "/api/v1/stats/refresh"))
        || (get && matches!(path, "/api/v1/resources/overview" | "/api/v1/resources/namespaces" | "/api/v1/resources/tasks"))
        || (method == Method::POST && path.starts_with("/api/v1/consumer-groups/") && path.ends_with("/subscription"))
        // The tenants' routes: they act on the caller's tenant, or on another
        // for an admin across tenants (`http::tenants`).
        || matches!(path, "/api/v1/resources/quota" | "/api/v1/resources/tenants" | "/api/v1/resources/tenant")
        // Streams: queries by the tenant's stored names, their ids checked.
        || (method == Method::POST && path.starts_with("/streams/v1/"))
        // Ephemeral queues, kept in memory by their stored names.
        || path.starts_with("/api/v1/ephemeral/")
        // Timers, kept by their (stored) queue name.
        || (method == Method::POST && path == "/api/v1/timers")
        || (path.starts_with("/api/v1/timers/") && (get || method == Method::DELETE))
}

fn refuse(status: StatusCode, error: &str, code: &str) -> Response {
    (status, Json(json!({ "error": error, "code": code }))).into_response()
}

/// Whether a reserved tenant (no route acts on it).
pub fn reserved(t: Tenant) -> bool {
    RESERVED.contains(&t.0)
}

/// Whether the caller acts across tenants (lists them, sets quotas, purges
/// another, picks one in the dashboard): with tenancy off, any caller the
/// route's level admits (there is one tenant); with it on, an admin
/// (without JWT: any caller) under `QUEEN_TENANCY_ADMIN_ALL`, or an admin
/// whose token's `QUEEN_TENANCY_ADMIN_CLAIM` is true.
pub fn admin_all(cfg: &Config, principal: Option<&Principal>) -> bool {
    if !enabled(cfg) {
        return true;
    }
    match principal {
        None => cfg.tenancy.admin_all && !cfg.auth.enabled,
        Some(p) => p.may(crate::http::auth::Level::Admin) && (cfg.tenancy.admin_all || p.admin_all),
    }
}

/// A UUID as upstream reads one: 8-4-4-4-12 hex digits, any case, spaces
/// around ignored.
pub fn parse(text: &str) -> Option<Uuid> {
    let t = text.trim();
    (t.len() == 36 && t.as_bytes().iter().enumerate().all(|(i, b)| if [8, 13, 18, 23].contains(&i) { *b == b'-' } else { b.is_ascii_hexdigit() }))
        .then(|| Uuid::parse_str(t).ok())
        .flatten()
}

/// The tenant a verified token's claim names (`QUEEN_TENANT_CLAIM`):
/// `Ok(None)` when claims do not name tenants; else the tenant, or why the
/// token names none (the message and its code). The one rule for HTTP's
/// bearer tokens and the Kafka listener's SASL tokens.
pub fn claimed(cfg: &Config, p: &Principal) -> Result<Option<Tenant>, (&'static str, &'static str)> {
    if cfg.auth.tenant_claim.is_none() {
        return Ok(None);
    }
    match p.tenant.as_deref() {
        None => Err(("the token names no tenant (its tenant claim is missing)", "tenant_claim_missing")),
        Some(text) => parse(text).map(|t| Some(Tenant(t))).ok_or(("the token's tenant claim is not a UUID", "tenant_claim_invalid")),
    }
}

/// The tenant of a request, given its headers and (if its token was
/// verified) its principal; or the answer that refuses it. `aware`: the
/// route keeps its data per tenant ([`isolated`], and `/auth/me`).
#[allow(clippy::result_large_err)]
pub fn resolve(cfg: &Config, aware: bool, headers: &HeaderMap, principal: Option<&Principal>) -> Result<Tenant, Response> {
    let claim_mode = cfg.auth.tenant_claim.is_some();
    if !cfg.tenancy.header && !claim_mode {
        return Ok(Tenant::default());
    }
    // An admin across tenants names the tenant it acts in (the dashboard's
    // selector) in the header, whichever source names the others'.
    let acting = principal.is_some_and(|p| admin_all(cfg, Some(p)));
    let from_header = match (cfg.tenancy.header || acting, headers.get(HEADER)) {
        (true, Some(v)) if !v.as_bytes().iter().all(u8::is_ascii_whitespace) => match v.to_str().ok().and_then(parse) {
            Some(t) => Some(Tenant(t)),
            None => return Err(refuse(StatusCode::BAD_REQUEST, "x-queen-tenant: must be a UUID (8-4-4-4-12 hex digits)", "bad_request")),
        },
        _ => None,
    };
    let from_claim = match principal {
        Some(p) => claimed(cfg, p).map_err(|(why, code)| refuse(StatusCode::FORBIDDEN, why, code))?,
        None => None,
    };
    let tenant = match (from_claim, from_header) {
        (_, Some(h)) if acting => h,
        (Some(c), Some(h)) if c != h => {
            return Err(refuse(StatusCode::FORBIDDEN, "x-queen-tenant disagrees with the token's tenant claim", "tenant_mismatch"));
        }
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => Tenant::default(),
    };
    if RESERVED.contains(&tenant.0) {
        return Err(refuse(StatusCode::FORBIDDEN, "this tenant is reserved: no route acts on it", "reserved_tenant"));
    }
    // A route not yet per tenant reads and writes across every tenant's
    // queues, so with tenancy on it serves no one, the default tenant
    // included (its listings would show the others' queues).
    if !aware {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "with tenancy on this route is not served yet: its data is not kept per tenant",
            "tenant_unsupported",
        ));
    }
    Ok(tenant)
}

/// The partition id an ack of another tenant's partition is sent on with:
/// no partition has it, so the ack answers as one naming an unknown
/// partition does, and a foreign id never shows that it exists.
pub const NO_PARTITION: &str = "0";

/// Partition ids' tenants, looked up once: an id names one partition for
/// ever (ids are never reused) and a partition never changes queue, so what
/// is known stays true. Bounded: forgotten whole past [`OWNERS_KEPT`].
#[derive(Default)]
pub struct Owners {
    known: std::sync::Mutex<std::collections::HashMap<i64, Uuid>>,
}

/// Partition ids whose tenant is remembered at most.
const OWNERS_KEPT: usize = 200_000;

impl Owners {
    /// Which of `ids` belong to another tenant than `tenant` (an id no
    /// partition has is not among them: it is unknown to every tenant).
    pub async fn foreign(&self, pool: &deadpool_postgres::Pool, tenant: Tenant, ids: &[i64]) -> Result<Vec<i64>, crate::db::DbError> {
        self.foreign_with(pool, tenant, ids, |_| None).await
    }

    /// [`Owners::foreign`], asking `hint` first of an id not remembered
    /// (the ack asks the registry of leased batches, which knows the queue
    /// of each partition this broker delivered from: a leased drain then
    /// looks up no partition in the database).
    pub async fn foreign_with(
        &self,
        pool: &deadpool_postgres::Pool,
        tenant: Tenant,
        ids: &[i64],
        hint: impl Fn(i64) -> Option<Uuid>,
    ) -> Result<Vec<i64>, crate::db::DbError> {
        let mut foreign = Vec::new();
        let missing: Vec<i64> = {
            let mut known = self.known.lock().expect("owners lock");
            let mut missing = Vec::new();
            for &id in ids {
                let owner = match known.get(&id) {
                    Some(t) => Some(*t),
                    None => hint(id).inspect(|t| {
                        if known.len() >= OWNERS_KEPT {
                            known.clear();
                        }
                        known.insert(id, *t);
                    }),
                };
                match owner {
                    Some(t) if t != tenant.0 => foreign.push(id),
                    Some(_) => {}
                    None => missing.push(id),
                }
            }
            missing
        };
        if missing.is_empty() {
            return Ok(foreign);
        }
        let client = pool.get().await?;
        let rows = client
            .query(
                "SELECT p.id, q.tenant_id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE p.id = ANY ($1)",
                &[&missing],
            )
            .await?;
        let found: Vec<(i64, Uuid)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        foreign.extend(found.iter().filter(|(_, t)| *t != tenant.0).map(|(id, _)| *id));
        let mut known = self.known.lock().expect("owners lock");
        if known.len() + found.len() > OWNERS_KEPT {
            known.clear();
        }
        known.extend(found);
        Ok(foreign)
    }
}

/// Whether requests may name tenants at all (either source is on): only
/// then is a partition id's tenant ever checked.
pub fn enabled(cfg: &Config) -> bool {
    cfg.tenancy.header || cfg.auth.tenant_claim.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_read_as_upstream_reads_them() {
        assert_eq!(parse(" 00000000-0000-0000-0000-00000000000A ").map(|u| u.as_u128()), Some(10));
        assert_eq!(Tenant(parse("00000000-0000-0000-0000-000000000001").unwrap()), Tenant::default());
        assert_eq!(Tenant::default().to_string(), DEFAULT_TENANT);
        for bad in ["", "1", "00000000000000000000000000000001", "{00000000-0000-0000-0000-000000000001}", "0000000g-0000-0000-0000-000000000001"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert!(RESERVED.contains(&parse("00000000-0000-0000-0000-00000000FFFD").unwrap()));
    }

    #[test]
    fn the_isolated_routes_by_shape() {
        let yes = [
            (Method::POST, "/api/v1/push"),
            (Method::POST, "/api/v1/transaction"),
            (Method::GET, "/api/v1/pop/queue/q/partition/p"),
            (Method::GET, "/api/v1/resources/queues/q"),
            (Method::GET, "/api/v1/resources/queues/q/depth"),
            (Method::DELETE, "/api/v1/resources/queues/q"),
            (Method::DELETE, "/api/v1/consumer-groups/g/queues/q"),
            (Method::POST, "/api/v1/consumer-groups/g/queues/q/seek"),
            (Method::POST, "/api/v1/consumer-groups/g/queues/q/partitions/p/seek"),
            (Method::POST, "/api/v1/lease/l/extend"),
            (Method::GET, "/api/v1/consumer-groups"),
            (Method::GET, "/api/v1/consumer-groups/lagging"),
            (Method::GET, "/api/v1/consumer-groups/g"),
            (Method::DELETE, "/api/v1/consumer-groups/g"),
            (Method::PUT, "/api/v1/kv/ns/a/b"),
            (Method::GET, "/api/v1/messages"),
            (Method::POST, "/api/v1/consumer-groups/g/subscription"),
            (Method::GET, "/api/v1/analytics/queue-lag"),
            (Method::GET, "/api/v1/ephemeral/queues"),
            (Method::POST, "/streams/v1/cycle"),
            (Method::POST, "/api/v1/locks"),
            (Method::GET, "/api/v1/resources/kv/namespaces"),
        ];
        let no = [
            (Method::GET, "/api/v1/resources/queues/q/other/depth"),
        ];
        for (m, p) in yes {
            assert!(isolated(&m, p), "{m} {p}");
        }
        for (m, p) in no {
            assert!(!isolated(&m, p), "{m} {p}");
        }
    }

    #[test]
    fn a_tenants_queue_names_are_its_own_and_shown_without_their_prefix() {
        let other = Tenant(Uuid::from_u128(0xabc));
        let third = Tenant(Uuid::from_u128(0xabd));
        assert_eq!(Tenant::default().inner("orders"), "orders");
        let stored = other.inner("orders");
        assert_eq!(stored, "\u{1}00000000-0000-0000-0000-000000000abc\u{1}orders");
        assert_eq!(shown(&stored), "orders");
        assert_eq!(shown("orders"), "orders");
        assert_eq!((owner_of(&stored), owner_of("orders")), (other.0, Tenant::default().0));
        assert!(other.owns(&stored) && !third.owns(&stored) && !Tenant::default().owns(&stored) && Tenant::default().owns("orders"));
        assert_ne!(third.inner("orders"), stored, "the same name in two tenants is two queues");
        assert_eq!(shown("\u{1}short"), "\u{1}short", "not a prefix: shown as it is");
        // The default tenant spelling another tenant's stored name reaches nothing of it.
        let spelled = Tenant::default().inner(&stored).into_owned();
        assert_ne!(spelled, stored);
        assert_eq!(shown(&spelled), spelled, "not any tenant's stored name");
    }
}
