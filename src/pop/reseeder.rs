//! The background reseeder: idle hot-list rings learn what the broker cannot
//! see itself (another broker's pushes, seeks, retention) from one query per
//! tick for every ring that fell due, instead of one query per ring.
//!
//! Why: a ring is reseeded every `QUEEN_HOTLIST_RESEED_MS`; with the reseed
//! done by a pop parked on the ring, 10,000 parked consumers meant ~330
//! single-ring queries a second, each a permit, a connection, a round trip
//! and a wake-up (most of an idle broker's CPU). Rings with candidates ready
//! are busy anyway and keep reseeding on their own pops. A reseed that finds
//! pending partitions opens the queue's wake gate, so the pops parked on an
//! idle ring sleep until their deadline or a gate, never on a timer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::{claim, PopError, PopService};

/// Most rings one query reseeds.
const MAX_RINGS: usize = 2_000;

/// How often due rings are collected: a quarter of the reseed interval,
/// between 50 ms and 1 s (a ring's reseed is late by at most this much).
pub fn tick_for(reseed_every: Duration) -> Duration {
    (reseed_every / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

impl PopService {
    /// Reseeds up to [`MAX_RINGS`] due idle rings in one round trip; returns
    /// how many. A failure leaves them for their next period.
    pub async fn reseed_idle_rings(&self) -> Result<usize, PopError> {
        let dropped = self.hotlist.evict_idle(super::hotlist::RING_IDLE);
        if dropped > 0 {
            tracing::debug!(rings = dropped, "dropped candidate rings no pop used for 15 minutes");
        }
        metrics::gauge!("queen_hotlist_rings").set(self.hotlist.rings() as f64);
        metrics::gauge!("queen_hotlist_feed_entries").set(self.hotlist.feed_entries() as f64);
        let due = self.hotlist.take_due_idle(MAX_RINGS);
        if due.is_empty() {
            return Ok(0);
        }
        let after: Vec<String> = due.iter().map(|(queue, group)| self.hotlist.reseed_after(queue, group)).collect();
        let pending = {
            let _permit = self.permit().await?;
            let client = self.connection().await?;
            claim::pending_partitions_window(&client, &due, &after, self.cfg.hotlist_reseed_window).await?
        };
        for ((queue, group), found) in due.iter().zip(pending) {
            let wake = !found.pending.is_empty();
            self.hotlist.reseed_window(queue, group, found);
            if wake {
                self.wake.pushed(queue);
            }
        }
        Ok(due.len())
    }

    /// Runs the reseeder until shutdown and hands idle rings to it.
    pub fn spawn_reseeder(self: &Arc<Self>, mut shutdown: broadcast::Receiver<()>) {
        self.hotlist.reseed_in_background();
        let pops = self.clone();
        let tick = tick_for(pops.cfg.hotlist_reseed);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        if let Err(e) = pops.reseed_idle_rings().await {
                            tracing::debug!(error = %e, "background reseed failed; rings retry next period");
                        }
                    }
                    _ = shutdown.recv() => return,
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tick_follows_the_reseed_interval_within_bounds() {
        assert_eq!(tick_for(Duration::from_secs(30)), Duration::from_secs(1));
        assert_eq!(tick_for(Duration::from_millis(400)), Duration::from_millis(100));
        assert_eq!(tick_for(Duration::from_millis(100)), Duration::from_millis(50));
    }
}
