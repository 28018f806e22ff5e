//! The CLI's side of the HTTP API: one client with the operator's token,
//! and the mapping of every failure to an exit code and a one-line message.
//! The CLI is a client of the documented routes like any other: it never
//! reads the database.

use std::process::ExitCode;

use reqwest::Method;
use serde_json::Value;

/// A command's failure: the code the process exits with, and what it says.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

/// The exit codes (docs/OPERATIONS.md, "The operator CLI").
pub mod exit {
    /// The broker refused the request (400, 401, 403, 409, 413, 429).
    pub const REFUSED: u8 = 1;
    /// Bad usage: a missing `--yes`, an unreadable input line (clap's own
    /// errors exit 2 as well).
    pub const USAGE: u8 = 2;
    /// The broker could not be reached, or failed (5xx).
    pub const UNAVAILABLE: u8 = 3;
    /// What was named does not exist (404).
    pub const NOT_FOUND: u8 = 4;
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure { code: exit::USAGE, message: message.into() }
    }

    pub fn not_found(message: impl Into<String>) -> Failure {
        Failure { code: exit::NOT_FOUND, message: message.into() }
    }

    pub fn exit(self) -> ExitCode {
        eprintln!("queen: {}", self.message);
        ExitCode::from(self.code)
    }
}

/// A broker at `url`, called with `token` as a bearer when given.
#[derive(Clone)]
pub struct Broker {
    url: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Broker {
    pub fn new(url: &str, token: Option<String>) -> Broker {
        Broker { url: url.trim_end_matches('/').to_string(), token, http: reqwest::Client::new() }
    }

    /// Calls `path` (with its query) and answers the JSON body of a 2xx
    /// (`Null` for an empty one, as a 204 has).
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        let mut req = self.http.request(method.clone(), format!("{}{path}", self.url));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await.map_err(|e| Failure {
            code: exit::UNAVAILABLE,
            message: format!("cannot reach the broker at {}: {}", self.url, root_cause(&e)),
        })?;
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        let json: Value = if text.trim().is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        if status.is_success() {
            return Ok(json);
        }
        let said = json
            .get("error")
            .or_else(|| json.get("detail"))
            .map(|e| e.as_str().map(str::to_string).unwrap_or_else(|| e.to_string()))
            .unwrap_or_else(|| json.to_string());
        let detail = json.get("detail").and_then(Value::as_str).filter(|d| *d != said);
        let message = match detail {
            Some(d) => format!("{method} {path}: {} {said}: {d}", status.as_u16()),
            None => format!("{method} {path}: {} {said}", status.as_u16()),
        };
        let code = match status.as_u16() {
            404 => exit::NOT_FOUND,
            500.. => exit::UNAVAILABLE,
            _ => exit::REFUSED,
        };
        Err(Failure { code, message })
    }

    pub async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, Failure> {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Result<Value, Failure> {
        self.call(Method::DELETE, path, None).await
    }
}

fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// A path segment, percent-encoded (queue and group names may hold `/`).
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query string from pairs (values encoded; `None`s left out).
pub fn query(pairs: &[(&str, Option<String>)]) -> String {
    let set: Vec<(&str, &str)> = pairs.iter().filter_map(|(k, v)| v.as_deref().map(|v| (*k, v))).collect();
    if set.is_empty() {
        String::new()
    } else {
        format!("?{}", serde_urlencoded::to_string(set).expect("pairs encode"))
    }
}
