//! Wake gates: where parked long-polls wait for a push.
//!
//! One gate per queue (and one for discovery pops, which any push may
//! concern). The first push to a queue in a tick opens its gate at once (an
//! idle queue's consumer should not wait for the ticker: that wait was most
//! of the wake latency's p99); later pushes in the same tick only mark the
//! queue dirty, and a ticker opens the gates of dirty queues every 5 ms, so a
//! hot queue costs at most two wake-ups per tick rather than one per push. A lost wake costs at most one backoff
//! interval: the re-check schedule is the correctness floor, the gate only
//! makes delivery fast.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, Notify};

/// How often dirty queues' gates are opened.
pub const TICK: Duration = Duration::from_millis(5);

#[derive(Default)]
pub struct WakeGates {
    gates: Mutex<HashMap<String, Arc<Notify>>>,
    discovery: Arc<Notify>,
    dirty: Mutex<HashSet<String>>,
    /// Queues whose gate a push opened at once since the last tick.
    opened: Mutex<HashSet<String>>,
}

impl WakeGates {
    /// The gate of one queue (created on first use by a waiter).
    pub fn queue(&self, queue: &str) -> Arc<Notify> {
        let mut gates = self.gates.lock().expect("gates lock poisoned");
        gates.entry(queue.to_string()).or_default().clone()
    }

    /// The gate discovery pops wait on.
    pub fn discovery(&self) -> Arc<Notify> {
        self.discovery.clone()
    }

    /// A push to `queue` committed (or a lease was released): the first in
    /// this tick opens the gate now, the rest wait for the tick.
    pub fn pushed(&self, queue: &str) {
        let first = {
            let mut opened = self.opened.lock().expect("opened lock poisoned");
            !opened.contains(queue) && opened.insert(queue.to_string())
        };
        if first {
            metrics::counter!(crate::metrics::WAKE_OPENS, "how" => "push").increment(1);
            if let Some(g) = self.gates.lock().expect("gates lock poisoned").get(queue) {
                g.notify_waiters();
            }
            self.discovery.notify_waiters();
            return;
        }
        let mut dirty = self.dirty.lock().expect("dirty lock poisoned");
        if !dirty.contains(queue) {
            dirty.insert(queue.to_string());
        }
    }

    /// Opens the gates of every queue pushed to since the last tick.
    pub fn tick(&self) {
        self.opened.lock().expect("opened lock poisoned").clear();
        let dirty: Vec<String> = self.dirty.lock().expect("dirty lock poisoned").drain().collect();
        if dirty.is_empty() {
            return;
        }
        metrics::counter!(crate::metrics::WAKE_OPENS, "how" => "tick").increment(dirty.len() as u64);
        let mut gates = self.gates.lock().expect("gates lock poisoned");
        for q in dirty {
            if let Some(g) = gates.get(&q) {
                g.notify_waiters();
            }
        }
        // Gates nobody holds any more are dropped, so the map follows the
        // queues being waited on now.
        gates.retain(|_, g| Arc::strong_count(g) > 1);
        self.discovery.notify_waiters();
    }

    /// Runs the ticker until shutdown.
    pub fn spawn_ticker(self: &Arc<Self>, mut shutdown: broadcast::Receiver<()>) {
        let gates = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(TICK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = every.tick() => gates.tick(),
                    _ = shutdown.recv() => return,
                }
            }
        });
    }
}

/// The long-poll re-check interval after `attempt` empty re-checks (a wake
/// resets the count): the initial interval for the first `threshold`, then
/// initial × attempt × multiplier, capped.
pub fn backoff_interval(attempt: u32, cfg: &crate::config::PopConfig) -> Duration {
    if attempt < cfg.backoff_threshold {
        return cfg.wait_initial;
    }
    let grown = cfg.wait_initial.as_secs_f64() * attempt as f64 * cfg.backoff_multiplier;
    Duration::from_secs_f64(grown).min(cfg.wait_max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_backoff_follows_the_documented_schedule() {
        let cfg = Config::from_lookup(|_| None).unwrap().pop;
        let ms: Vec<u128> = (0..7).map(|a| backoff_interval(a, &cfg).as_millis()).collect();
        assert_eq!(ms, [100, 100, 100, 600, 800, 1000, 1000]);
    }

    #[tokio::test]
    async fn a_push_opens_the_gate_on_the_next_tick() {
        let gates = WakeGates::default();
        let gate = gates.queue("q");
        let waiter = gate.notified();
        tokio::pin!(waiter);
        waiter.as_mut().enable();
        gates.pushed("q");
        gates.pushed("other");
        gates.tick();
        tokio::time::timeout(Duration::from_millis(100), waiter).await.expect("woken");
    }

    #[tokio::test]
    async fn the_first_push_in_a_tick_opens_the_gate_at_once_and_later_ones_wait_for_the_tick() {
        let gates = WakeGates::default();
        let gate = gates.queue("q");
        let first = gate.notified();
        tokio::pin!(first);
        first.as_mut().enable();
        gates.pushed("q");
        tokio::time::timeout(Duration::from_millis(100), first).await.expect("woken without a tick");

        let second = gate.notified();
        tokio::pin!(second);
        second.as_mut().enable();
        gates.pushed("q");
        assert!(tokio::time::timeout(Duration::from_millis(50), second.as_mut()).await.is_err(), "bounded: no second wake-up before the tick");
        gates.tick();
        tokio::time::timeout(Duration::from_millis(100), second).await.expect("woken by the tick");
    }
}
