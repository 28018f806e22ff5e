//! Authentication and roles (API.md §1.1, §5.5): JWT bearer tokens checked
//! against the route's level.
//!
//! Levels: PUBLIC, READ_ONLY, WRITE_ONLY, READ_WRITE, ADMIN; roles
//! `admin` ⊃ `read-write` ⊃ {`read-only`, `write-only}` (a write-only role
//! is not a reader). Missing token: 401 `Authentication required`; a token
//! that does not verify: 401 with the reason; a valid token below the
//! route's level: 403 `Insufficient permissions`. The token's `sub` rides
//! along to the push path, which stamps it as `producerSub`.

use std::collections::HashSet;

use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Value};

use super::AppState;
use crate::config::AuthConfig;

/// What a route requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Public,
    ReadOnly,
    WriteOnly,
    ReadWrite,
    Admin,
}

/// The longest JWT `sub` accepted: it rides in every frame the caller
/// pushes, as `producerSub`, beside a transactionId of the same bound.
pub const MAX_SUB_BYTES: usize = crate::push::validate::MAX_TRANSACTION_ID_BYTES;

/// The caller, once verified: its subject, and which levels its roles
/// grant (for the routes whose level depends on the body: a timer cancel,
/// a stream registration that resets).
#[derive(Debug, Clone, Default)]
pub struct Principal {
    pub sub: Option<String>,
    /// The value of the token's tenant claim (`QUEEN_TENANT_CLAIM`), as
    /// text; None without the setting or the claim.
    pub tenant: Option<String>,
    /// The token's admin-across-tenants claim is true
    /// (`QUEEN_TENANCY_ADMIN_CLAIM`; `tenancy::admin_all` reads it).
    pub admin_all: bool,
    /// The levels granted, indexed by `Level as usize`.
    granted: [bool; 5],
}

impl Principal {
    /// Whether the caller's roles reach `need`.
    pub fn may(&self, need: Level) -> bool {
        self.granted[need as usize]
    }
}

/// Whether the caller of a request may do what needs `need`: always when
/// authentication is off (no principal was recorded), else by its roles.
pub fn permits(principal: Option<&Principal>, need: Level) -> bool {
    principal.is_none_or(|p| p.may(need))
}

/// The 403 of a body-dependent level: which part of the request needs more.
pub fn insufficient(detail: &str) -> Response {
    (StatusCode::FORBIDDEN, Json(json!({ "error": "Insufficient permissions", "detail": detail }))).into_response()
}

/// Whether `/metrics` and `/metrics/prometheus` are served without a
/// token (`METRICS_PUBLIC`, default true, as upstream); false makes them
/// read-only.
fn metrics_path(path: &str) -> bool {
    matches!(path, "/metrics" | "/metrics/prometheus")
}

/// The level of a request (the route map of API.md §1.1).
pub fn level(method: &Method, path: &str) -> Level {
    let get = method == Method::GET || method == Method::HEAD;
    let post = method == Method::POST;
    let delete = method == Method::DELETE;
    // The identity routes check the token themselves (`http::identity`).
    if matches!(path, "/health" | "/metrics" | "/metrics/prometheus" | "/" | "/api/v1/openapi.json" | "/auth/me" | "/auth/login" | "/auth/logout")
        || path.starts_with("/dashboard/")
    {
        return Level::Public;
    }
    if path.starts_with("/api/v1/system/")
        || path == "/api/v1/system"
        || path.starts_with("/internal/")
        || (delete && (path.starts_with("/api/v1/consumer-groups/") || path.starts_with("/api/v1/resources/queues/") || path == "/api/v1/dlq"))
        || (post && path == "/api/v1/stats/refresh")
        // Ephemeral queues lose their messages as a durable queue does.
        || (post && path == "/api/v1/ephemeral/reset")
        || (delete && path.starts_with("/api/v1/ephemeral/queue/"))
        // The tenants: quotas set, the listing, the purge.
        || (post && path == "/api/v1/resources/quota")
        || (get && path == "/api/v1/resources/tenants")
        || (delete && path == "/api/v1/resources/tenant")
    {
        return Level::Admin;
    }
    const READ_PREFIXES: &[&str] = &[
        "/status", "/api/v1/status", "/api/v1/analytics", "/api/v1/resources/", "/api/v1/messages", "/api/v1/consumer-groups",
        "/api/v1/dlq", "/api/v1/traces", "/api/v1/kv", "/api/v1/timers", "/api/v1/ephemeral/queues", "/api/v1/consumers",
    ];
    if get && READ_PREFIXES.iter().any(|p| path.starts_with(p)) {
        return Level::ReadOnly;
    }
    if post && matches!(path, "/api/v1/fetch" | "/api/v1/partitions/changed" | "/api/v1/resources/kv/list" | "/streams/v1/state/get") {
        return Level::ReadOnly;
    }
    if post && matches!(path, "/api/v1/push" | "/api/v1/timers" | "/api/v1/ephemeral/push") {
        return Level::WriteOnly;
    }
    Level::ReadWrite
}

/// Whether a set of roles satisfies a level.
fn allows(roles: &HashSet<String>, cfg: &AuthConfig, need: Level) -> bool {
    let has = |r: &str| roles.contains(r);
    let admin = has(&cfg.role_admin);
    let rw = admin || has(&cfg.role_read_write);
    match need {
        Level::Public => true,
        Level::ReadOnly => rw || has(&cfg.role_read_only),
        Level::WriteOnly => rw || has(&cfg.role_write_only),
        Level::ReadWrite => rw,
        Level::Admin => admin,
    }
}

fn deny(status: StatusCode, error: &str) -> Response {
    (status, Json(json!({ "error": error }))).into_response()
}

/// Verifies a token; the claims, or the reason it does not verify.
pub fn verify(token: &str, cfg: &AuthConfig) -> Result<Value, String> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| format!("Invalid token: {e}"))?;
    let alg = header.alg;
    let allowed = match cfg.algorithm {
        Some(a) => a == alg,
        None => true, // auto: whatever the key material can verify
    };
    if !allowed {
        return Err(format!("Invalid token: algorithm {alg:?} is not accepted"));
    }
    let key = match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => cfg.secret.as_ref().map(|s| DecodingKey::from_secret(s.as_bytes())),
        Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512 => {
            cfg.public_key.as_ref().and_then(|k| DecodingKey::from_rsa_pem(k.as_bytes()).ok())
        }
        Algorithm::EdDSA => cfg.public_key.as_ref().and_then(|k| DecodingKey::from_ed_pem(k.as_bytes()).ok()),
        _ => None,
    }
    .ok_or_else(|| format!("Invalid token: no key for algorithm {alg:?}"))?;
    let mut v = Validation::new(alg);
    v.leeway = cfg.clock_skew_seconds;
    v.validate_exp = true;
    v.required_spec_claims = HashSet::from(["exp".to_string()]);
    match &cfg.issuer {
        Some(iss) => v.set_issuer(&[iss]),
        None => v.iss = None,
    }
    match &cfg.audience {
        Some(aud) => v.set_audience(&[aud]),
        None => v.validate_aud = false,
    }
    jsonwebtoken::decode::<Value>(token, &key, &v).map(|d| d.claims).map_err(|e| match e.kind() {
        jsonwebtoken::errors::ErrorKind::ExpiredSignature => "Token expired".to_string(),
        jsonwebtoken::errors::ErrorKind::InvalidSignature => "Invalid token signature".to_string(),
        jsonwebtoken::errors::ErrorKind::InvalidIssuer => "Invalid token issuer".to_string(),
        jsonwebtoken::errors::ErrorKind::InvalidAudience => "Invalid token audience".to_string(),
        _ => format!("Invalid token: {e}"),
    })
}

fn roles_of(claims: &Value, cfg: &AuthConfig) -> HashSet<String> {
    let mut roles = HashSet::new();
    if let Some(r) = claims.get(&cfg.roles_claim).and_then(Value::as_str) {
        roles.insert(r.to_string());
    }
    if let Some(list) = claims.get(&cfg.roles_array_claim).and_then(Value::as_array) {
        roles.extend(list.iter().filter_map(Value::as_str).map(str::to_string));
    }
    roles
}

/// The caller a token names: verified, with the levels its roles grant and
/// its subject (bounded: it is stamped into every frame the caller pushes);
/// or why the token is refused. HTTP's bearer tokens and the Kafka
/// listener's SASL PLAIN passwords both come here.
pub fn principal(token: &str, cfg: &AuthConfig) -> Result<Principal, String> {
    principal_of(&verify(token, cfg)?, cfg)
}

/// The principal of verified `claims`.
fn principal_of(claims: &Value, cfg: &AuthConfig) -> Result<Principal, String> {
    let roles = roles_of(claims, cfg);
    let granted = [Level::Public, Level::ReadOnly, Level::WriteOnly, Level::ReadWrite, Level::Admin].map(|l| allows(&roles, cfg, l));
    let sub = claims.get("sub").and_then(Value::as_str).map(str::to_string);
    if sub.as_ref().is_some_and(|s| s.len() > MAX_SUB_BYTES) {
        return Err(format!("Invalid token: sub is longer than {MAX_SUB_BYTES} bytes"));
    }
    let tenant = cfg.tenant_claim.as_ref().and_then(|c| claims.get(c)).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string));
    let admin_all = cfg
        .admin_all_claim
        .as_ref()
        .and_then(|c| claims.get(c))
        .is_some_and(|v| v.as_bool() == Some(true) || v.as_str().and_then(crate::config::parse_bool) == Some(true));
    Ok(Principal { sub, tenant, admin_all, granted })
}

/// The caller a token names, as `GET /auth/me` shows it: the principal,
/// the roles its token lists, and its `email` claim.
pub fn identity(token: &str, cfg: &AuthConfig) -> Result<(Principal, Vec<String>, Option<String>), String> {
    let claims = verify(token, cfg)?;
    let principal = principal_of(&claims, cfg)?;
    let mut roles: Vec<String> = roles_of(&claims, cfg).into_iter().collect();
    roles.sort();
    Ok((principal, roles, claims.get("email").and_then(Value::as_str).map(str::to_string)))
}

/// Lets public and skipped paths through and checks the rest's token,
/// recording the caller as a `Principal`; otherwise the 401/403 answer.
/// Called by `http::front_door`. The error is the answer itself, built only
/// for a refused request: boxing it would cost every refusal an allocation.
#[allow(clippy::result_large_err)]
pub fn check(state: &AppState, req: &mut Request) -> Result<(), Response> {
    let cfg = &state.config.auth;
    if !cfg.enabled {
        return Ok(());
    }
    let path = req.uri().path().to_string();
    let private_metrics = !cfg.metrics_public && metrics_path(&path);
    let need = if private_metrics { Level::ReadOnly } else { level(req.method(), &path) };
    if need == Level::Public || (!private_metrics && cfg.skip_paths.iter().any(|p| p == &path)) {
        return Ok(());
    }
    let Some(raw) = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return Err(deny(StatusCode::UNAUTHORIZED, "Authentication required"));
    };
    // A raw token without the `Bearer ` prefix is accepted too.
    let token = raw.strip_prefix("Bearer ").or_else(|| raw.strip_prefix("bearer ")).unwrap_or(raw).trim();
    if token.is_empty() {
        return Err(deny(StatusCode::UNAUTHORIZED, "Authentication required"));
    }
    let principal = match principal(token, cfg) {
        Ok(p) => p,
        Err(reason) => return Err(deny(StatusCode::UNAUTHORIZED, &reason)),
    };
    if !principal.may(need) {
        return Err(deny(StatusCode::FORBIDDEN, "Insufficient permissions"));
    }
    req.extensions_mut().insert(principal);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_map_of_the_spec() {
        use Level::*;
        let cases = [
            (Method::GET, "/health", Public),
            (Method::GET, "/auth/me", Public),
            (Method::POST, "/auth/logout", Public),
            (Method::GET, "/metrics/prometheus", Public),
            (Method::POST, "/api/v1/push", WriteOnly),
            (Method::GET, "/api/v1/pop/queue/q", ReadWrite),
            (Method::POST, "/api/v1/ack", ReadWrite),
            (Method::POST, "/api/v1/configure", ReadWrite),
            (Method::GET, "/api/v1/resources/queues", ReadOnly),
            (Method::GET, "/api/v1/status/queues", ReadOnly),
            (Method::GET, "/api/v1/consumer-groups/g", ReadOnly),
            (Method::DELETE, "/api/v1/consumer-groups/g", Admin),
            (Method::DELETE, "/api/v1/resources/queues/q", Admin),
            (Method::POST, "/api/v1/stats/refresh", Admin),
            (Method::POST, "/api/v1/system/maintenance", Admin),
            (Method::GET, "/api/v1/system/maintenance", Admin),
            (Method::POST, "/api/v1/consumer-groups/g/queues/q/seek", ReadWrite),
            (Method::DELETE, "/api/v1/messages/1/t", ReadWrite),
            (Method::DELETE, "/api/v1/dlq", Admin),
            (Method::POST, "/api/v1/ephemeral/reset", Admin),
            (Method::DELETE, "/api/v1/ephemeral/queue/q", Admin),
            (Method::POST, "/api/v1/ephemeral/configure", ReadWrite),
            (Method::GET, "/api/v1/dlq", ReadOnly),
            (Method::POST, "/api/v1/dlq/7/replay", ReadWrite),
        ];
        for (m, p, want) in cases {
            assert_eq!(level(&m, p), want, "{m} {p}");
        }
    }

    #[test]
    fn a_write_only_role_is_not_a_reader_and_admin_is_everything() {
        let cfg = AuthConfig::default();
        let roles = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        assert!(allows(&roles(&["write-only"]), &cfg, Level::WriteOnly));
        assert!(!allows(&roles(&["write-only"]), &cfg, Level::ReadOnly));
        assert!(!allows(&roles(&["read-only"]), &cfg, Level::WriteOnly));
        assert!(allows(&roles(&["read-write"]), &cfg, Level::ReadOnly));
        assert!(!allows(&roles(&["read-write"]), &cfg, Level::Admin));
        assert!(allows(&roles(&["admin"]), &cfg, Level::Admin));
        assert!(!allows(&roles(&[]), &cfg, Level::ReadOnly));
    }
}
