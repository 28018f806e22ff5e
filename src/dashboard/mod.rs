//! The dashboard (issue 31 §1): a page at `/` and its assets under
//! `/dashboard/`, compiled into the binary (no Node, no network, works
//! offline). The page is a client of the documented API like any other:
//! every number it shows comes from a route in docs/API.md, so what an
//! operator sees is what a script would read. The one chart library is
//! uPlot (MIT, vendored whole with its licence under `assets/vendor/`).

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// `(name, content type, bytes)` of every asset.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("assets/app.js")),
    ("app.css", "text/css; charset=utf-8", include_bytes!("assets/app.css")),
    ("uPlot.iife.min.js", "text/javascript; charset=utf-8", include_bytes!("assets/vendor/uPlot.iife.min.js")),
    ("uPlot.min.css", "text/css; charset=utf-8", include_bytes!("assets/vendor/uPlot.min.css")),
    ("uPlot.LICENSE", "text/plain; charset=utf-8", include_bytes!("assets/vendor/uPlot.LICENSE")),
];

const INDEX: &str = include_str!("assets/index.html");

/// `GET /`: the page.
pub async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], INDEX).into_response()
}

/// `GET /dashboard/{file}`: an asset.
pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, kind, bytes)) => ([(header::CONTENT_TYPE, *kind), (header::CACHE_CONTROL, "no-cache")], *bytes).into_response(),
        None => (StatusCode::NOT_FOUND, axum::Json(serde_json::json!({"error": format!("no dashboard asset {file:?}")}))).into_response(),
    }
}
