//! The pop's query parameters (API.md §2.2), parsed once with the broker's
//! defaults applied. An unparseable number or boolean is a 400 that names the
//! parameter; an unparseable `subscriptionFrom` is ignored, as the seed says.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};

use crate::config::{parse_bool, PopConfig, SubscriptionMode};

/// The implicit group of competing consumers.
pub const QUEUE_MODE: &str = "__QUEUE_MODE__";
/// Default message budget of one call.
pub const DEFAULT_BATCH: i32 = 200;
/// Largest budget one call may ask for.
pub const MAX_BATCH: i32 = 10_000;
/// The longest long-poll a pop may ask for (`timeout`, ms): an hour. A
/// parked pop holds a connection and an in-flight permit; past this a
/// client should poll again.
pub const MAX_TIMEOUT_MS: i64 = 3_600_000;
/// The longest lease a pop (`leaseSeconds`) or a lease extension
/// (`seconds`) may ask for: a week. Longer, a crashed consumer's messages
/// would be out of reach for longer than any retention.
pub const MAX_LEASE_SECONDS: i64 = 7 * 86_400;

/// Which partitions a pop may claim from.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// Any partitions of one queue.
    Wildcard { queue: String },
    /// Exactly one named partition.
    Specific { queue: String, partition: String },
    /// Every queue whose labels match (at least one is set).
    /// By labels, among the tenant's queues (`tenancy`).
    Discovery { tenant: uuid::Uuid, namespace: Option<String>, task: Option<String> },
}

/// A pop request with every default applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PopParams {
    pub batch: i32,
    /// Most partitions one call claims; 0 = no cap.
    pub partitions: i32,
    pub wait: bool,
    pub timeout: Duration,
    /// `None` = the queue's leaseTime.
    pub lease_seconds: Option<i32>,
    pub group: String,
    pub auto_ack: bool,
    /// First-contact intent: `Some("new")` skips the backlog.
    pub intent_mode: Option<&'static str>,
    pub intent_from: Option<DateTime<Utc>>,
    /// The client let the broker choose `batch`/`partitions`.
    pub autopilot: bool,
    /// Answer as `QPF1` frames (API.md §3.4).
    pub frames: bool,
    /// The claim commits without waiting for the WAL flush: an autoAck pop
    /// when `QUEEN_POP_AUTOACK_ASYNC_COMMIT` is on, a leased one when
    /// `QUEEN_POP_LEASE_ASYNC_COMMIT` is (docs/DECISIONS.md).
    pub async_commit: bool,
}

/// The older clients' snake_case spellings of the pop's camelCase query
/// parameters (docs/DECISIONS.md "Every spelling a client sends"): the
/// camelCase one wins when a request carries both.
pub const QUERY_SPELLINGS: &[(&str, &str)] = &[
    ("consumerGroup", "consumer_group"),
    ("autoAck", "auto_ack"),
    ("subscriptionMode", "subscription_mode"),
    ("subscriptionFrom", "subscription_from"),
    ("leaseSeconds", "lease_seconds"),
];

impl PopParams {
    /// Parses form-decoded query pairs.
    pub fn parse(pairs: &[(String, String)], cfg: &PopConfig) -> Result<PopParams, String> {
        let get = |k: &str| {
            let alias = QUERY_SPELLINGS.iter().find(|(camel, _)| *camel == k).map(|(_, snake)| *snake);
            let value = |name: &str| pairs.iter().rev().find(|(key, _)| key == name).map(|(_, v)| v.trim());
            value(k).or_else(|| alias.and_then(value))
        };
        let int = |k: &str| -> Result<Option<i64>, String> {
            match get(k) {
                None | Some("") => Ok(None),
                Some(v) => v.parse::<i64>().map(Some).map_err(|_| format!("{k}: must be an integer, got {v:?}")),
            }
        };
        let boolean = |k: &str| -> Result<Option<bool>, String> {
            match get(k) {
                None | Some("") => Ok(None),
                Some(v) => parse_bool(v).map(Some).ok_or_else(|| format!("{k}: must be true or false, got {v:?}")),
            }
        };
        let batch = match int("batch")? {
            None => DEFAULT_BATCH,
            Some(b) if (1..=MAX_BATCH as i64).contains(&b) => b as i32,
            Some(b) => return Err(format!("batch: must be from 1 to {MAX_BATCH}, got {b}")),
        };
        let partitions = int("partitions")?.map_or(1, |p| p.clamp(0, i32::MAX as i64) as i32);
        let timeout = match int("timeout")? {
            None => cfg.default_timeout,
            Some(t) if (0..=MAX_TIMEOUT_MS).contains(&t) => Duration::from_millis(t as u64),
            Some(t) => return Err(format!("timeout: must be from 0 to {MAX_TIMEOUT_MS} ms, got {t}")),
        };
        let lease_seconds = match int("leaseSeconds")? {
            Some(s) if s > MAX_LEASE_SECONDS => return Err(format!("leaseSeconds: at most {MAX_LEASE_SECONDS}, got {s}")),
            // Zero or less: the queue's leaseTime, as before.
            s => s.filter(|s| *s > 0).map(|s| s as i32),
        };
        let group = get("consumerGroup").filter(|g| !g.is_empty()).unwrap_or(QUEUE_MODE).to_string();
        // A group name keys a cursor row and a candidate ring: bounded as a
        // queue name is.
        crate::push::validate::check_name(&group).map_err(|e| format!("consumerGroup: {e}"))?;
        let mode = match get("subscriptionMode") {
            None | Some("") => None,
            Some(m) => Some(
                SubscriptionMode::parse(m).ok_or_else(|| {
                    format!("subscriptionMode: must be one of {}, got {m:?}", SubscriptionMode::accepted())
                })?,
            ),
        };
        let (mut intent_mode, mut intent_from) = (None, None);
        if group != QUEUE_MODE {
            match get("subscriptionFrom") {
                Some(f) if f.eq_ignore_ascii_case("now") => intent_mode = Some("new"),
                Some(f) if !f.is_empty() => intent_from = parse_timestamp(f),
                _ => {}
            }
            if intent_mode.is_none() && intent_from.is_none() {
                intent_mode = match mode.unwrap_or(cfg.default_subscription_mode) {
                    SubscriptionMode::New => Some("new"),
                    SubscriptionMode::All => None,
                };
            }
        }
        let frames = boolean("frames")?.unwrap_or(false);
        let auto_ack = boolean("autoAck")?.unwrap_or(false);
        boolean("conflation")?;
        Ok(PopParams {
            batch,
            partitions,
            wait: boolean("wait")?.unwrap_or(false),
            timeout,
            lease_seconds,
            group,
            auto_ack,
            intent_mode,
            intent_from,
            autopilot: boolean("autopilot")?.unwrap_or(false),
            frames,
            async_commit: if auto_ack { cfg.autoack_async_commit } else { cfg.lease_async_commit },
        })
    }

    /// Candidates a hot-list pop takes: clamp(partitions × 2, 2, 256), what
    /// the claim may use plus as many spare in case some turn out empty (a pop
    /// whose candidates were all empty looks again). Candidates out with one
    /// pop are out of reach of the others until it settles them: taking
    /// sixteen or more let one pop hold every partition of a ten-partition
    /// queue, and four consumers drained it 25-33 % slower (framed and
    /// autoAck pops, docs/PERFORMANCE.md).
    pub fn ring_candidates(&self) -> usize {
        if self.partitions <= 0 {
            256
        } else {
            (self.partitions as usize).saturating_mul(2).clamp(2, 256)
        }
    }

    /// Candidates the SQL scan fetches: 512 from 128 partitions (or no cap),
    /// else clamp(partitions × 4, 64, 512); more than needed, since some will
    /// be taken by concurrent pops or turn out empty.
    pub fn scan_candidates(&self) -> i32 {
        if self.partitions <= 0 || self.partitions >= 128 {
            512
        } else {
            (self.partitions * 4).clamp(64, 512)
        }
    }
}

/// ISO-8601 / RFC 3339; a timestamp without an offset is read as UTC.
pub fn parse_timestamp(s: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
        .map(|n| n.and_utc())
        .or_else(|| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").ok().map(|d| d.and_hms_opt(0, 0, 0).expect("midnight").and_utc()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn parse(q: &str) -> Result<PopParams, String> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q).unwrap();
        PopParams::parse(&pairs, &Config::from_lookup(|_| None).unwrap().pop)
    }

    #[test]
    fn defaults_follow_the_seed() {
        let p = parse("").unwrap();
        assert_eq!((p.batch, p.partitions, p.wait, p.auto_ack), (200, 1, false, false));
        assert_eq!(p.timeout, Duration::from_millis(30_000));
        assert_eq!(p.group, QUEUE_MODE);
        assert_eq!(p.lease_seconds, None);
        assert_eq!((p.intent_mode, p.intent_from), (None, None));
    }

    #[test]
    fn the_client_default_pop_parses() {
        let p = parse("autopilot=true&wait=true&timeout=30000").unwrap();
        assert!(p.autopilot && p.wait);
        assert_eq!(p.batch, 200);
    }

    #[test]
    fn non_positive_lease_seconds_mean_absent_and_partitions_zero_means_no_cap() {
        let p = parse("leaseSeconds=0&partitions=-3").unwrap();
        assert_eq!(p.lease_seconds, None);
        assert_eq!(p.partitions, 0);
        assert_eq!(p.ring_candidates(), 256);
        assert_eq!(p.scan_candidates(), 512);
        assert_eq!(parse("partitions=4").unwrap().ring_candidates(), 8);
        assert_eq!(parse("partitions=1").unwrap().ring_candidates(), 2);
        assert_eq!(parse("partitions=1").unwrap().scan_candidates(), 64);
    }

    #[test]
    fn unparseable_values_name_the_parameter() {
        assert!(parse("batch=ten").unwrap_err().starts_with("batch:"));
        assert!(parse("batch=0").unwrap_err().starts_with("batch:"));
        assert!(parse("wait=maybe").unwrap_err().starts_with("wait:"));
        assert!(parse("timeout=-1").unwrap_err().starts_with("timeout:"));
        assert!(parse("autoAck=2").unwrap_err().starts_with("autoAck:"));
        assert!(parse("leaseSeconds=x").unwrap_err().starts_with("leaseSeconds:"));
    }

    #[test]
    fn intent_is_ignored_in_queue_mode() {
        let p = parse("subscriptionMode=new&subscriptionFrom=now").unwrap();
        assert_eq!((p.intent_mode, p.intent_from), (None, None));
    }

    #[test]
    fn subscription_from_now_or_a_timestamp_and_unparseable_is_ignored() {
        assert_eq!(parse("consumerGroup=g&subscriptionFrom=now").unwrap().intent_mode, Some("new"));
        let p = parse("consumerGroup=g&subscriptionFrom=2026-01-02T03:04:05Z").unwrap();
        assert_eq!(p.intent_from.unwrap().to_rfc3339(), "2026-01-02T03:04:05+00:00");
        let p = parse("consumerGroup=g&subscriptionFrom=yesterday-ish").unwrap();
        assert_eq!((p.intent_mode, p.intent_from), (None, None));
        assert_eq!(parse("consumerGroup=g&subscriptionMode=new-only").unwrap().intent_mode, Some("new"));
        let snake = parse("consumer_group=g&auto_ack=true&subscription_mode=new&lease_seconds=9").unwrap();
        assert_eq!((snake.group.as_str(), snake.auto_ack, snake.intent_mode, snake.lease_seconds), ("g", true, Some("new"), Some(9)));
        assert_eq!(parse("consumer_group=old&consumerGroup=new").unwrap().group, "new", "camelCase wins");
    }

    #[test]
    fn form_decoding_turns_plus_into_space() {
        assert_eq!(parse("consumerGroup=billing+team").unwrap().group, "billing team");
    }
}
