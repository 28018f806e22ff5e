//! An ephemeral queue's bounds (`POST /api/v1/ephemeral/configure`), their
//! defaults from the environment (`QUEEN_EPHEMERAL_*`) and their validation.
//! A closed list, as the client's: an option the broker does not know is a
//! 400 naming it, never silently dropped, because every one of them bounds
//! something.

use std::time::Duration;

use serde_json::{json, Map, Value};

/// What a full queue does with a push that does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Refuse the whole push: `429` with `Retry-After`.
    Reject,
    /// Drop the queue's oldest messages until the push fits (a feed).
    DropOldest,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Reject => "reject",
            Policy::DropOldest => "drop_oldest",
        }
    }

    fn parse(s: &str) -> Option<Policy> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "reject" | "refuse" | "block" => Some(Policy::Reject),
            "drop_oldest" | "dropoldest" | "drop" => Some(Policy::DropOldest),
            _ => None,
        }
    }
}

/// A waiting pop that finds fewer than `count` messages waits up to `ms`
/// for more, so that a trickle is answered in fuller batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowBuffer {
    pub ms: u64,
    pub count: usize,
}

/// One queue's bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub max_bytes: u64,
    pub max_length: usize,
    pub policy: Policy,
    /// Messages older than this are dropped (None: never).
    pub ttl: Option<Duration>,
    pub lease: Duration,
    /// Deliveries after the first before a message is dropped.
    pub retry_limit: u32,
    pub window_buffer: Option<WindowBuffer>,
}

impl Options {
    /// The answer's shape of the options (the wire's names).
    pub fn to_json(&self) -> Value {
        json!({
            "maxBytes": self.max_bytes,
            "maxLength": self.max_length,
            "policy": self.policy.as_str(),
            "ttlSeconds": self.ttl.map_or(0.0, |t| t.as_secs_f64()),
            "leaseSeconds": self.lease.as_secs_f64(),
            "retryLimit": self.retry_limit,
            "windowBuffer": self.window_buffer.map(|w| json!({"ms": w.ms, "count": w.count})),
        })
    }

    /// These options with the knobs of a configure body applied; `Err` is
    /// `(field, problem)`. `max_bytes_cap` is the broker-wide budget, which
    /// no queue's may exceed.
    pub fn apply(&self, body: &Map<String, Value>, max_bytes_cap: u64) -> Result<Options, (String, String)> {
        let mut o = self.clone();
        for (k, v) in body {
            let field = format!("options.{k}");
            let bad = |problem: &str| Err((field.clone(), problem.to_string()));
            let snake = k.as_str();
            match snake {
                "maxBytes" | "max_bytes" => match v.as_u64() {
                    Some(n) if n >= 1 && n <= max_bytes_cap => o.max_bytes = n,
                    _ => return bad(&format!("a byte count from 1 to {max_bytes_cap} (the broker's QUEEN_EPHEMERAL_MAX_MB)")),
                },
                "maxLength" | "max_length" => match v.as_u64() {
                    Some(n) if (1..=100_000_000).contains(&n) => o.max_length = n as usize,
                    _ => return bad("a message count from 1 to 100000000"),
                },
                "policy" => match v.as_str().and_then(Policy::parse) {
                    Some(p) => o.policy = p,
                    None => return bad("reject or drop_oldest"),
                },
                "ttlSeconds" | "ttl_seconds" => match v.as_f64() {
                    Some(0.0) => o.ttl = None,
                    Some(s) if s > 0.0 && s <= 30.0 * 86_400.0 => o.ttl = Some(Duration::from_secs_f64(s)),
                    _ => return bad("seconds from 0 (no expiry) to 2592000"),
                },
                "leaseSeconds" | "lease_seconds" => match v.as_f64() {
                    Some(s) if s > 0.0 && s <= 3600.0 => o.lease = Duration::from_secs_f64(s),
                    _ => return bad("seconds, more than 0 and at most 3600"),
                },
                "retryLimit" | "retry_limit" => match v.as_u64() {
                    Some(n) if n <= 1000 => o.retry_limit = n as u32,
                    _ => return bad("a whole number from 0 to 1000"),
                },
                "windowBuffer" | "window_buffer" => match v {
                    Value::Null => o.window_buffer = None,
                    Value::Object(w) => {
                        let ms = w.get("ms").map_or(Some(0), Value::as_u64);
                        let count = w.get("count").map_or(Some(1), Value::as_u64);
                        match (ms, count) {
                            (Some(ms), Some(count)) if ms <= 60_000 && (1..=10_000).contains(&count) => {
                                o.window_buffer = (ms > 0).then_some(WindowBuffer { ms, count: count as usize })
                            }
                            _ => return bad("{ms: 0..60000, count: 1..10000}"),
                        }
                    }
                    _ => return bad("{ms, count} or null"),
                },
                _ => {
                    return bad("not an ephemeral option (maxBytes, maxLength, policy, ttlSeconds, leaseSeconds, retryLimit, windowBuffer)")
                }
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Options {
        Options {
            max_bytes: 1000,
            max_length: 10,
            policy: Policy::Reject,
            ttl: None,
            lease: Duration::from_secs(30),
            retry_limit: 5,
            window_buffer: None,
        }
    }

    fn apply(v: Value) -> Result<Options, (String, String)> {
        base().apply(v.as_object().unwrap(), 4096)
    }

    #[test]
    fn knobs_apply_in_either_spelling_and_leave_the_others() {
        let o = apply(json!({"maxLength": 3, "ttl_seconds": 1.5, "policy": "drop-oldest", "windowBuffer": {"ms": 20, "count": 8}})).unwrap();
        assert_eq!(o.max_length, 3);
        assert_eq!(o.ttl, Some(Duration::from_millis(1500)));
        assert_eq!(o.policy, Policy::DropOldest);
        assert_eq!(o.window_buffer, Some(WindowBuffer { ms: 20, count: 8 }));
        assert_eq!(o.max_bytes, 1000);
        assert_eq!(o.retry_limit, 5);
    }

    #[test]
    fn a_bad_or_unknown_knob_names_its_field() {
        assert_eq!(apply(json!({"maxBytes": 5000})).unwrap_err().0, "options.maxBytes");
        assert_eq!(apply(json!({"maxLength": 0})).unwrap_err().0, "options.maxLength");
        assert_eq!(apply(json!({"policy": "lifo"})).unwrap_err().0, "options.policy");
        assert_eq!(apply(json!({"leaseSeconds": 0})).unwrap_err().0, "options.leaseSeconds");
        assert_eq!(apply(json!({"ttl_second": 1})).unwrap_err().0, "options.ttl_second");
        assert_eq!(apply(json!({"windowBuffer": {"count": 0}})).unwrap_err().0, "options.windowBuffer");
    }
}
