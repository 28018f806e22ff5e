//! In-flight request caps per route family (push, pop, ack, admin): a
//! request over its family's cap answers `503 {"error", "code":"overloaded"}`
//! with `Retry-After: 1` at once, so one family flooding the broker cannot
//! starve the others. Every route that does work is in a family: the
//! streams runtime's calls count with the acks (a cycle per batch, as a
//! consume loop's acks), and the probes (`/health`, `/status`, the
//! metrics) have a small cap of their own ([`MAX_INFLIGHT_PROBE`]), so a
//! flood of them cannot pile up database round trips while a monitor still
//! gets an answer when the other families are full. Only the dashboard's
//! static files are uncapped.

use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::AppState;

/// In-flight probes (`/health`, `/status`, `/metrics…`) at once.
pub const MAX_INFLIGHT_PROBE: usize = 64;

/// One semaphore per family.
pub struct InFlight {
    pub push: Semaphore,
    pub pop: Semaphore,
    pub ack: Semaphore,
    pub admin: Semaphore,
    pub probe: Semaphore,
}

impl InFlight {
    pub fn new(l: &crate::config::Limits) -> InFlight {
        InFlight {
            push: Semaphore::new(l.max_inflight_push),
            pop: Semaphore::new(l.max_inflight_pop),
            ack: Semaphore::new(l.max_inflight_ack),
            admin: Semaphore::new(l.max_inflight_admin),
            probe: Semaphore::new(MAX_INFLIGHT_PROBE),
        }
    }

    fn family(&self, method: &Method, path: &str) -> Option<(&'static str, &Semaphore)> {
        if matches!(path, "/health" | "/status" | "/metrics" | "/metrics/prometheus") {
            return Some(("probe", &self.probe));
        }
        if path.starts_with("/streams/") {
            return Some(("ack", &self.ack));
        }
        if !path.starts_with("/api/") {
            return None;
        }
        Some(if method == Method::POST && (path == "/api/v1/push" || path == "/api/v1/ephemeral/push") {
            ("push", &self.push)
        } else if path.starts_with("/api/v1/pop") || path == "/api/v1/fetch" || path == "/api/v1/ephemeral/pop" {
            // A fetch long-polls as a pop does: it counts with them.
            ("pop", &self.pop)
        } else if path.starts_with("/api/v1/ack")
            || path == "/api/v1/ephemeral/ack"
            || path.starts_with("/api/v1/lease/")
            || path == "/api/v1/transaction"
            || (method == Method::POST && (path == "/api/v1/traces" || path == "/api/v1/kv" || path == "/api/v1/locks" || path == "/api/v1/timers"))
        {
            // A consume loop's per-message calls: traces and KV calls are
            // among them.
            ("ack", &self.ack)
        } else {
            ("admin", &self.admin)
        })
    }
}

/// Takes a permit of the request's family, or answers 503 at once when the
/// family is at its cap. `None` for uncapped paths (health, metrics). The
/// error is the 503 itself (see `auth::check`).
#[allow(clippy::result_large_err)]
pub fn admit<'a>(state: &'a AppState, req: &Request) -> Result<Option<SemaphorePermit<'a>>, Response> {
    let Some((family, gate)) = state.inflight.family(req.method(), req.uri().path()) else {
        return Ok(None);
    };
    match gate.try_acquire() {
        Ok(permit) => Ok(Some(permit)),
        Err(_) => {
            metrics::counter!("queen_requests_shed_total", "family" => family).increment(1);
            Err((
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                Json(json!({"error": format!("too many in-flight {family} requests; retry shortly"), "code": "overloaded"})),
            )
                .into_response())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_working_route_counts_in_a_family() {
        let limits = crate::config::Limits {
            max_connections: 10,
            header_timeout: std::time::Duration::from_secs(1),
            body_timeout: std::time::Duration::from_secs(1),
            max_inflight_push: 1,
            max_inflight_pop: 1,
            max_inflight_ack: 1,
            max_inflight_admin: 1,
        };
        let f = InFlight::new(&limits);
        let family = |m: Method, p: &str| f.family(&m, p).map(|(name, _)| name);
        assert_eq!(family(Method::POST, "/streams/v1/cycle"), Some("ack"));
        assert_eq!(family(Method::POST, "/streams/v1/state/get"), Some("ack"));
        assert_eq!(family(Method::POST, "/streams/v1/queries"), Some("ack"));
        assert_eq!(family(Method::GET, "/health"), Some("probe"));
        assert_eq!(family(Method::GET, "/status"), Some("probe"));
        assert_eq!(family(Method::GET, "/metrics/prometheus"), Some("probe"));
        assert_eq!(family(Method::POST, "/api/v1/push"), Some("push"));
        assert_eq!(family(Method::GET, "/api/v1/status"), Some("admin"));
        assert_eq!(family(Method::GET, "/dashboard/app.js"), None, "static files only");
        assert_eq!(family(Method::GET, "/"), None);
    }
}
