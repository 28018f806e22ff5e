//! The one place where failures become HTTP answers: every error is JSON with
//! an `error` field, and the status is chosen here.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An answer that is not a success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is wrong; the message names the field and the problem.
    #[error("{0}")]
    BadRequest(String),
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("request body not received within {ms} ms")]
    BodyTimeout { ms: u64 },
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    /// No pooled connection in time.
    #[error("pool")]
    Pool,
    /// The database or the broker failed; the client may retry.
    #[error("{0}")]
    Internal(String),
    /// An encrypted payload did not open (crypto::OpenError); 500 naming
    /// the partition.
    #[error("decrypt failed")]
    Decrypt { partition_id: i64, detail: String },
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Pool | ApiError::Internal(_) | ApiError::Decrypt { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<&crate::push::PushError> for ApiError {
    fn from(e: &crate::push::PushError) -> Self {
        use crate::db::DbError;
        use crate::push::PushError;
        match e {
            PushError::Db(DbError::Pool(_)) => ApiError::Pool,
            other => ApiError::Internal(format!("push failed: {other}")),
        }
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(e: crate::db::DbError) -> Self {
        match e {
            crate::db::DbError::Pool(_) => ApiError::Pool,
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<crate::pop::PopError> for ApiError {
    fn from(e: crate::pop::PopError) -> Self {
        match e {
            crate::pop::PopError::Pool => ApiError::Pool,
            crate::pop::PopError::Timeout => ApiError::Internal("pop failed".into()),
            crate::pop::PopError::Decrypt(d) => ApiError::Decrypt { partition_id: d.partition_id, detail: d.to_string() },
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            tracing::warn!(error = %self, "request failed");
        }
        let body = match &self {
            ApiError::Decrypt { partition_id, detail } => {
                json!({ "error": self.to_string(), "partitionId": partition_id.to_string(), "detail": detail })
            }
            _ => json!({ "error": self.to_string() }),
        };
        (self.status(), Json(body)).into_response()
    }
}
