//! Logging: `tracing` to stdout, plain or JSON lines (`QUEEN_LOG_JSON`),
//! filtered by `LOG_LEVEL`/`RUST_LOG`. One line per lifecycle event, none per
//! message.

use tracing_subscriber::EnvFilter;

pub fn init(filter: &str, json: bool) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// A log line that may repeat hundreds of times a second while PostgreSQL is
/// away (every request, every tick): written at most once per `period`, with
/// how many were left out since. "One line per lifecycle event" holds for an
/// outage too: the first failure is logged at once, the rest as a count.
pub struct Throttle {
    period_ms: u64,
    /// Milliseconds since the process epoch of the last line written, plus one
    /// (0: none yet).
    last: std::sync::atomic::AtomicU64,
    skipped: std::sync::atomic::AtomicU64,
}

impl Throttle {
    pub const fn new(period_ms: u64) -> Throttle {
        Throttle { period_ms, last: std::sync::atomic::AtomicU64::new(0), skipped: std::sync::atomic::AtomicU64::new(0) }
    }

    /// `Some(lines left out since the last one)` when a line may be written
    /// now; `None` (and one more left out) otherwise.
    pub fn admit(&self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let now = EPOCH.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now < last + self.period_ms {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self.last.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.skipped.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;

    #[test]
    fn a_throttle_admits_the_first_line_then_counts_the_rest_until_its_period_ends() {
        let t = Throttle::new(50);
        assert_eq!(t.admit(), Some(0));
        assert_eq!(t.admit(), None);
        assert_eq!(t.admit(), None);
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(t.admit(), Some(2), "the two left out are counted");
        assert_eq!(t.admit(), None);
    }
}
