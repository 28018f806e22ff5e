//! The HTTP surface: the axum router, one file per route family, and the
//! conversion of errors into JSON answers. Handlers are thin: parse, call the
//! path that does the work, render.

pub mod body;
pub mod error;
pub mod health;
pub mod push;

use std::sync::Arc;

use axum::http::{Method, Uri};
use axum::routing::{get, post};
use axum::Router;
use deadpool_postgres::Pool;

use crate::config::Config;
use crate::push::Coalescer;
use error::ApiError;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub coalescer: Coalescer,
}

/// The whole route table.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health::health))
        .route("/api/v1/push", post(push::push))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no such route: {method} {}", uri.path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
