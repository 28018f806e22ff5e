//! `GET /metrics` (JSON, API.md §2.9), `GET /metrics/prometheus` (text
//! exposition), and the count and timing of every request.

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::AppState;

/// One request being counted and timed, under its route pattern (never the
/// raw path: queue names would make the label set unbounded).
pub struct Observed {
    route: String,
    method: String,
    started: Instant,
}

impl Observed {
    pub fn start(req: &Request) -> Observed {
        // `{queue}` becomes `:queue`: braces inside label values trip common parsers.
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map(|m| m.as_str().replace('{', ":").replace('}', ""))
            .unwrap_or_else(|| "unmatched".into());
        Observed { route, method: req.method().to_string(), started: Instant::now() }
    }

    pub fn finish(self, state: &AppState, response: &Response) {
        state.telemetry.requests.fetch_add(1, Ordering::Relaxed);
        metrics::histogram!(crate::metrics::REQUEST_DURATION, "route" => self.route, "method" => self.method,
                            "status" => response.status().as_u16().to_string())
            .record(self.started.elapsed().as_secs_f64());
    }
}

pub async fn json(State(state): State<AppState>) -> Json<Value> {
    let t = &state.telemetry;
    let uptime = t.uptime_seconds().max(0.001);
    let requests = t.requests.load(Ordering::Relaxed);
    let pushed = t.pushed.load(Ordering::Relaxed);
    let popped = t.popped.load(Ordering::Relaxed);
    let acked = t.acked.load(Ordering::Relaxed);
    let pool = state.pool.status();
    let (rss, user, system) = crate::metrics::process_usage();
    Json(json!({
        "uptime": uptime.round() as u64,
        "requests": {"total": requests, "rate": requests as f64 / uptime},
        "messages": {"total": pushed, "rate": pushed as f64 / uptime, "pushed": pushed, "popped": popped, "acked": acked},
        "database": {"poolSize": pool.max_size, "connections": pool.size, "idleConnections": pool.available,
                     "inUse": pool.size - pool.available, "waitingRequests": pool.waiting,
                     "popPermits": state.pop.permit_limit()},
        "memory": {"rss": rss, "rssMb": (rss as f64 / 1048576.0 * 10.0).round() / 10.0},
        "cpu": {"userSeconds": user, "systemSeconds": system, "percent": (user + system) / uptime * 100.0},
        "longPolls": {"parked": t.parked.load(Ordering::Relaxed)},
    }))
}

pub async fn prometheus(State(state): State<AppState>) -> Response {
    let text = state.telemetry.prometheus_text(
        &state.pool,
        state.pop.hotlist_ready(),
        state.pop.permit_limit(),
        state.coalescer.dedup().entries(),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
