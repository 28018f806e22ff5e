//! The queue settings the pop path acts on in the broker: `minPopWaitTime`
//! (the hold for a fuller batch), `delayedProcessing` and `windowBuffer` (the
//! revisit wheel's schedule).
//!
//! Only queues that set one of them are kept, so a broker where none does
//! pays one atomic load per pop. The cache is reloaded every
//! `QUEEN_CACHE_REFRESH_INTERVAL_MS` (changes made through other brokers), and
//! a `/configure` on this broker updates it at once.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_postgres::Pool;

/// The largest `minPopWaitTime` honoured (seeds/consuming.md: clamped to 60000).
pub const MAX_MIN_POP_WAIT: Duration = Duration::from_millis(60_000);

/// One queue's timing options; zero is off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueTimings {
    pub min_pop_wait: Duration,
    pub delayed: Duration,
    pub window: Duration,
}

impl QueueTimings {
    /// From the three columns (ms, s, s).
    pub fn from_columns(min_pop_wait_ms: i32, delayed_s: i32, window_s: i32) -> QueueTimings {
        QueueTimings {
            min_pop_wait: Duration::from_millis(min_pop_wait_ms.max(0) as u64).min(MAX_MIN_POP_WAIT),
            delayed: Duration::from_secs(delayed_s.max(0) as u64),
            window: Duration::from_secs(window_s.max(0) as u64),
        }
    }

    fn is_off(&self) -> bool {
        *self == QueueTimings::default()
    }
}

/// The queues that set a timing, as this broker knows them (`crate::cache`).
#[derive(Default)]
pub struct QueueSettings {
    by_queue: crate::cache::Reloaded<HashMap<String, QueueTimings>>,
}

impl QueueSettings {
    /// `queue`'s timings, if it sets any. One atomic load when no queue does.
    pub fn get(&self, queue: &str) -> Option<QueueTimings> {
        self.by_queue.read(|m| m.get(queue).copied())
    }

    /// The `minPopWaitTime` of `queue`, if it has one.
    pub fn min_pop_wait(&self, queue: &str) -> Option<Duration> {
        self.get(queue).map(|t| t.min_pop_wait).filter(|w| !w.is_zero())
    }

    /// A configure on this broker: effective for the next pop.
    pub fn set(&self, queue: &str, t: QueueTimings) {
        self.by_queue.change(|map| {
            if t.is_off() {
                map.remove(queue);
            } else {
                map.insert(queue.to_string(), t);
            }
        });
    }

    /// Reloads every queue that sets one of the options.
    pub async fn refresh(&self, pool: &Pool) -> Result<(), crate::db::DbError> {
        let since = self.by_queue.generation();
        let client = pool.get().await?;
        let rows = client
            .query(
                "SELECT name, min_pop_wait_time, delayed_processing, window_buffer FROM queen.queues
                 WHERE min_pop_wait_time > 0 OR delayed_processing > 0 OR window_buffer > 0",
                &[],
            )
            .await?;
        let map: HashMap<String, QueueTimings> =
            rows.iter().map(|r| (r.get::<_, String>(0), QueueTimings::from_columns(r.get(1), r.get(2), r.get(3)))).collect();
        self.by_queue.replace_unless_changed(since, map);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_without_timings_costs_nothing_and_a_set_takes_effect_at_once() {
        let s = QueueSettings::default();
        assert_eq!(s.get("q"), None);
        s.set("q", QueueTimings::from_columns(2000, 0, 0));
        assert_eq!(s.min_pop_wait("q"), Some(Duration::from_millis(2000)));
        s.set("q", QueueTimings::from_columns(90_000, 0, 0));
        assert_eq!(s.min_pop_wait("q"), Some(MAX_MIN_POP_WAIT), "clamped to 60000");
        s.set("q", QueueTimings::default());
        assert_eq!(s.get("q"), None);
        assert_eq!(s.by_queue.read(|m| Some(m.len())), None, "empty again: one atomic load");
    }
}
