//! `minPopWaitTime` (a queue option, ms, clamped to 60000): a non-empty but
//! under-full pop may wait for more messages so that one claim carries more.
//!
//! The wait happens here, in the broker, before any permit or connection is
//! taken: waiting inside the stored function would pin a connection, a
//! backend and row locks for the whole window. It applies only to a wildcard
//! pop that asked to block (`wait=true`) with `batch > 1`, only when the
//! hot-list knows how many messages are ready (never on an empty queue), and
//! ends at the first of: the batch would be full, the window elapsed, the
//! caller's deadline.
//!
//! The settings come from a cache refreshed every
//! `QUEEN_CACHE_REFRESH_INTERVAL_MS`; a broker where no queue uses the option
//! pays one atomic load per pop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;

use super::hotlist::HotList;

#[derive(Default)]
pub struct MinPopWait {
    any: AtomicBool,
    windows: Mutex<HashMap<String, Duration>>,
}

impl MinPopWait {
    /// The window of `queue`, if it has one. One atomic load when no queue does.
    pub fn window(&self, queue: &str) -> Option<Duration> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.windows.lock().expect("min-wait lock poisoned").get(queue).copied()
    }

    /// Reloads the queues that use the option.
    pub async fn refresh(&self, pool: &Pool) -> Result<(), crate::db::DbError> {
        let client = pool.get().await?;
        let rows = client
            .query("SELECT name, min_pop_wait_time FROM queen.queues WHERE min_pop_wait_time > 0", &[])
            .await?;
        let windows: HashMap<String, Duration> = rows
            .iter()
            .map(|r| (r.get::<_, String>(0), Duration::from_millis(r.get::<_, i32>(1).clamp(0, 60_000) as u64)))
            .collect();
        self.any.store(!windows.is_empty(), Ordering::Relaxed);
        *self.windows.lock().expect("min-wait lock poisoned") = windows;
        Ok(())
    }

    /// Refreshes on a fixed cadence until shutdown.
    pub fn spawn_refresh(self: &std::sync::Arc<Self>, pool: Pool, every: Duration, mut shutdown: broadcast::Receiver<()>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Err(e) = me.refresh(&pool).await {
                            tracing::debug!(error = %e, "queue settings refresh failed; keeping the last ones");
                        }
                    }
                    _ = shutdown.recv() => return,
                }
            }
        });
    }
}

/// Holds an under-full, non-empty pop until the batch would fill, `window`
/// elapses or `deadline` passes. Returns at once when the ring cannot say how
/// much is ready, or nothing is, or enough is. Returns whether it held.
pub async fn hold_for_a_fuller_batch(
    hotlist: &HotList,
    gate: &Notify,
    queue: &str,
    group: &str,
    batch: i32,
    window: Duration,
    deadline: Instant,
) -> bool {
    let until = (Instant::now() + window).min(deadline);
    let mut held = false;
    loop {
        let woken = gate.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        match hotlist.estimate(queue, group) {
            Some(n) if n > 0 && n < batch as u64 => held = true,
            _ => return held,
        }
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep_until(until) => return held,
        }
    }
}
