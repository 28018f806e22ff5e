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
    /// No primary PostgreSQL answers right now (down, restarting, failing
    /// over): `503` with `Retry-After`, the code `database_unavailable`.
    /// The request changed nothing; the same request sent again once a
    /// primary answers is safe (`DbError::unavailable`).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The database or the broker failed; the client may retry.
    #[error("{0}")]
    Internal(String),
    /// A push to a queue that encrypts, on a broker without the key: 503
    /// `encryption_key_missing`, without Retry-After (the same broker will
    /// answer the same until it is given the key).
    #[error("{0}")]
    NoKey(String),
    /// An encrypted payload did not open (crypto::OpenError); 500 naming
    /// the partition.
    #[error("decrypt failed")]
    Decrypt { partition_id: i64, detail: String },
    /// A tenant's quota refuses the request (`tenancy::quota`): 429
    /// `rate_limited` with `Retry-After`, or 403 `quota_exceeded`.
    #[error("quota")]
    Quota(crate::tenancy::quota::Refused),
}

impl From<crate::tenancy::quota::Refused> for ApiError {
    fn from(r: crate::tenancy::quota::Refused) -> Self {
        ApiError::Quota(r)
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unavailable(_) | ApiError::NoKey(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Pool | ApiError::Internal(_) | ApiError::Decrypt { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Quota(crate::tenancy::quota::Refused::Rate { .. }) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Quota(_) => StatusCode::FORBIDDEN,
        }
    }
}

impl From<&crate::push::PushError> for ApiError {
    fn from(e: &crate::push::PushError) -> Self {
        use crate::push::PushError;
        match e {
            // An outage or a busy pool answers as on every route.
            PushError::Db(db) if db.met_by_all() => ApiError::from_db(db),
            PushError::NoKey(k) => ApiError::NoKey(k.to_string()),
            other => ApiError::Internal(format!("push failed: {other}")),
        }
    }
}

impl ApiError {
    /// A database failure as an answer: an outage is a retryable 503, a busy
    /// pool the seeds' `500 pool`, anything else a 500 naming the failure.
    pub fn from_db(e: &crate::db::DbError) -> ApiError {
        if e.unavailable() {
            ApiError::Unavailable(e.to_string())
        } else if matches!(e, crate::db::DbError::Pool(_)) {
            ApiError::Pool
        } else {
            ApiError::Internal(e.to_string())
        }
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(e: crate::db::DbError) -> Self {
        ApiError::from_db(&e)
    }
}

impl From<crate::pop::PopError> for ApiError {
    fn from(e: crate::pop::PopError) -> Self {
        match e {
            crate::pop::PopError::Pool => ApiError::Pool,
            crate::pop::PopError::Unavailable(e) => ApiError::from_db(&e),
            crate::pop::PopError::Timeout => ApiError::Internal("pop failed".into()),
            crate::pop::PopError::Decrypt(d) => ApiError::Decrypt { partition_id: d.partition_id, detail: d.to_string() },
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Quota(refused) = self {
            return refused.into_response();
        }
        if let ApiError::Unavailable(_) = &self {
            // Every request fails alike during an outage: one line per 5 s.
            static OUTAGE: crate::telemetry::Throttle = crate::telemetry::Throttle::new(5_000);
            if let Some(skipped) = OUTAGE.admit() {
                tracing::warn!(error = %self, skipped, "request answered 503: the database is unavailable");
            }
        } else if matches!(self, ApiError::NoKey(_)) {
            // Logged once, where the refusal is decided (crypto::Encryption::sealing).
        } else if self.status().is_server_error() {
            tracing::warn!(error = %self, "request failed");
        }
        let body = match &self {
            ApiError::Decrypt { partition_id, detail } => {
                json!({ "error": self.to_string(), "partitionId": partition_id.to_string(), "detail": detail })
            }
            ApiError::Unavailable(_) => json!({ "error": self.to_string(), "code": "database_unavailable" }),
            ApiError::NoKey(_) => json!({ "error": self.to_string(), "code": "encryption_key_missing" }),
            _ => json!({ "error": self.to_string() }),
        };
        if matches!(self, ApiError::Unavailable(_)) {
            return (self.status(), [(axum::http::header::RETRY_AFTER, "1")], Json(body)).into_response();
        }
        (self.status(), Json(body)).into_response()
    }
}
