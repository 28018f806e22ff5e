//! Query strings: form-decoded (`+` is a space) pairs with typed accessors
//! that answer 400 naming the parameter when a value does not parse.

use chrono::{DateTime, Utc};

use super::error::ApiError;

/// Form-decoded query parameters with typed, 400-on-garbage accessors.
pub struct Params(pub Vec<(String, String)>);

impl Params {
    pub fn parse(raw: Option<String>) -> Result<Params, ApiError> {
        serde_urlencoded::from_str(raw.as_deref().unwrap_or(""))
            .map(Params)
            .map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))
    }

    pub fn text(&self, key: &str) -> Option<String> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    pub fn int(&self, key: &str, default: i64, min: i64, max: i64) -> Result<i64, ApiError> {
        match self.text(key) {
            None => Ok(default),
            Some(v) => v
                .parse::<i64>()
                .ok()
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| ApiError::BadRequest(format!("{key}: must be an integer from {min} to {max}, got {v:?}"))),
        }
    }

    pub fn time(&self, key: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
        self.text(key)
            .map(|v| {
                crate::pop::params::parse_timestamp(&v)
                    .ok_or_else(|| ApiError::BadRequest(format!("{key}: must be an ISO-8601 timestamp, got {v:?}")))
            })
            .transpose()
    }
}

