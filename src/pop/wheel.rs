//! The revisit wheel: when a partition that a visibility option hides
//! becomes claimable, its queue's parked pops are woken (seeds/life-of-a-pop.md,
//! "Step 2: visibility gates").
//!
//! Two options hide committed messages. `delayedProcessing` stays enforced in
//! SQL on every path; the wheel only knows when the hidden head becomes
//! visible (a push to the queue, plus the delay; or the time a claim
//! reported with its `deferred` verdict) and opens the queue's wake gate then,
//! so a parked pop gets the message at its visibility time instead of at its
//! next backoff re-check. `windowBuffer` on the hot-list path is the
//! broker's own hold ([`Wheel::window_held`]): the first push into a closed
//! partition starts a hold of the window; the hold ends when the window
//! elapses (the wheel opens the gate) or, for a pop whose batch is already
//! full, at once; a claim from the partition closes it again. Claims of such
//! a partition skip the SQL debounce, which stays the floor on the SQL path
//! and wherever the broker does not know the queue's window.
//!
//! Shaped as one task over an ordered map of due times, woken early only
//! when an entry earlier than its next one arrives, with bounded work per
//! turn and the broker's shutdown signal. Each (queue, partition) has at most
//! one pending entry, its earliest: a later one is not needed, because the
//! claim that follows the earliest reports the next time if any.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;

use super::hotlist::HotList;
use super::wake::WakeGates;

/// Due entries one turn handles before it yields; the rest follow at once.
const MAX_PER_TURN: usize = 1024;
/// Past a visibility time reported by PostgreSQL, the wake waits this much
/// more: the two clocks may differ a little, and a wake that comes early
/// finds the partition still hidden and is scheduled again no sooner than
/// this (never a busy loop).
const SLACK: Duration = Duration::from_millis(5);
/// An open window (elapsed, nobody claimed since) is forgotten after this long.
const OPEN_FORGET: Duration = Duration::from_secs(3600);

type Key = (Arc<str>, i64);

/// A windowBuffer partition's hold, on this broker.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Window {
    /// A push started it; it ends at `until`.
    Held { until: Instant },
    /// The window elapsed and nothing was claimed since: pushes do not hold it again.
    Open { since: Instant },
}

#[derive(Default)]
struct Inner {
    /// Due times, each with the partitions due then.
    due: BTreeMap<Instant, Vec<(Key, Arc<str>)>>,
    /// The pending due time of each partition (its earliest).
    pending: HashMap<Key, Instant>,
    windows: HashMap<Key, Window>,
    last_sweep: Option<Instant>,
}

#[derive(Default)]
pub struct Wheel {
    inner: Mutex<Inner>,
    /// An entry earlier than every other arrived: the task re-reads its next time.
    earlier: Notify,
}

impl Wheel {
    /// Revisit (queue, partition) at `at`.
    pub fn schedule(&self, queue: &str, pid: i64, partition: &str, at: Instant) {
        let key: Key = (Arc::from(queue), pid);
        let mut inner = self.inner.lock().expect("wheel lock poisoned");
        if inner.pending.get(&key).is_some_and(|t| *t <= at) {
            return;
        }
        let first = inner.due.keys().next().is_none_or(|t| at < *t);
        if let Some(old) = inner.pending.insert(key.clone(), at) {
            if let Some(list) = inner.due.get_mut(&old) {
                list.retain(|(k, _)| *k != key);
                if list.is_empty() {
                    inner.due.remove(&old);
                }
            }
        }
        inner.due.entry(at).or_default().push((key, Arc::from(partition)));
        drop(inner);
        if first {
            self.earlier.notify_one();
        }
    }

    /// A push committed to a partition of a queue with `delayedProcessing`:
    /// its segment becomes visible `delay` from now (its created_at is no
    /// later than this moment).
    pub fn delayed_push(&self, queue: &str, pid: i64, partition: &str, delay: Duration) {
        self.schedule(queue, pid, partition, Instant::now() + delay + SLACK);
    }

    /// A claim reported (queue, partition) hidden until `visible_at`
    /// (PostgreSQL's clock): revisit then.
    pub fn deferred(&self, queue: &str, pid: i64, partition: &str, visible_at: chrono::DateTime<chrono::Utc>) {
        let ahead = (visible_at - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO);
        self.schedule(queue, pid, partition, Instant::now() + ahead.max(SLACK) + SLACK);
    }

    /// A push committed to a partition of a queue with `windowBuffer`: a
    /// closed partition starts its hold of `window`.
    pub fn window_push(&self, queue: &str, pid: i64, partition: &str, window: Duration) {
        let key: Key = (Arc::from(queue), pid);
        let until = Instant::now() + window;
        {
            let mut inner = self.inner.lock().expect("wheel lock poisoned");
            if inner.windows.contains_key(&key) {
                return;
            }
            inner.windows.insert(key, Window::Held { until });
        }
        self.schedule(queue, pid, partition, until);
    }

    /// Whether the broker holds (queue, partition) back now.
    pub fn window_held(&self, queue: &str, pid: i64) -> bool {
        let inner = self.inner.lock().expect("wheel lock poisoned");
        matches!(inner.windows.get(&(Arc::from(queue), pid)), Some(Window::Held { until }) if *until > Instant::now())
    }

    /// A claim delivered from (queue, partition): the next push holds it again.
    pub fn window_claimed(&self, queue: &str, pid: i64) {
        self.inner.lock().expect("wheel lock poisoned").windows.remove(&(Arc::from(queue), pid));
    }

    /// When the next entry is due.
    fn next_due(&self) -> Option<Instant> {
        self.inner.lock().expect("wheel lock poisoned").due.keys().next().copied()
    }

    /// Takes up to `max` entries due by `now`, opening the windows they end.
    fn take_due(&self, now: Instant, max: usize) -> Vec<(Arc<str>, i64, Arc<str>)> {
        let mut inner = self.inner.lock().expect("wheel lock poisoned");
        let mut out = Vec::new();
        while out.len() < max {
            let Some(&at) = inner.due.keys().next() else { break };
            if at > now {
                break;
            }
            let mut list = inner.due.remove(&at).expect("the key just read");
            while out.len() < max {
                let Some((key, partition)) = list.pop() else { break };
                inner.pending.remove(&key);
                if let Some(w) = inner.windows.get_mut(&key) {
                    if matches!(w, Window::Held { until } if *until <= now) {
                        *w = Window::Open { since: now };
                    }
                }
                out.push((key.0, key.1, partition));
            }
            if !list.is_empty() {
                inner.due.insert(at, list);
            }
        }
        if inner.last_sweep.is_none_or(|t| now.duration_since(t) > OPEN_FORGET / 60) {
            inner.last_sweep = Some(now);
            inner.windows.retain(|_, w| !matches!(w, Window::Open { since } if now.duration_since(*since) > OPEN_FORGET));
        }
        out
    }

    /// Runs the wheel until shutdown: each due partition is offered to the
    /// queue's rings again and its queue's wake gate is opened.
    pub fn spawn(self: &Arc<Self>, hotlist: Arc<HotList>, gates: Arc<WakeGates>, mut shutdown: broadcast::Receiver<()>) {
        let wheel = self.clone();
        tokio::spawn(async move {
            loop {
                let earlier = wheel.earlier.notified();
                tokio::pin!(earlier);
                earlier.as_mut().enable();
                let sleep = async {
                    match wheel.next_due() {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = sleep => {}
                    _ = &mut earlier => continue,
                    _ = shutdown.recv() => return,
                }
                loop {
                    let batch = wheel.take_due(Instant::now(), MAX_PER_TURN);
                    for (queue, pid, partition) in &batch {
                        hotlist.reoffer(queue, *pid, partition);
                        gates.pushed(queue);
                    }
                    if batch.len() < MAX_PER_TURN {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_entry_comes_due_at_its_time_once_and_the_earliest_wins() {
        let w = Wheel::default();
        let t0 = Instant::now();
        w.schedule("q", 1, "p", t0 + Duration::from_secs(2));
        w.schedule("q", 1, "p", t0 + Duration::from_secs(5)); // later: not needed
        w.schedule("q", 1, "p", t0 + Duration::from_secs(1)); // earlier: replaces
        w.schedule("q", 2, "r", t0 + Duration::from_secs(3));
        assert!(w.take_due(t0, 10).is_empty());
        let due: Vec<i64> = w.take_due(t0 + Duration::from_secs(1), 10).iter().map(|d| d.1).collect();
        assert_eq!(due, [1]);
        assert!(w.take_due(t0 + Duration::from_secs(2), 10).is_empty(), "the replaced entry is gone");
        let due: Vec<i64> = w.take_due(t0 + Duration::from_secs(9), 10).iter().map(|d| d.1).collect();
        assert_eq!(due, [2]);
        assert!(w.inner.lock().unwrap().pending.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn work_per_turn_is_bounded() {
        let w = Wheel::default();
        let at = Instant::now();
        for pid in 0..10 {
            w.schedule("q", pid, "p", at);
        }
        assert_eq!(w.take_due(at, 4).len(), 4);
        assert_eq!(w.take_due(at, 4).len(), 4);
        assert_eq!(w.take_due(at, 4).len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_holds_from_the_first_push_until_it_elapses_and_a_claim_closes_it() {
        let w = Wheel::default();
        let t0 = Instant::now();
        w.window_push("q", 1, "p", Duration::from_secs(3));
        assert!(w.window_held("q", 1));
        tokio::time::advance(Duration::from_secs(1)).await;
        w.window_push("q", 1, "p", Duration::from_secs(3)); // does not extend the hold
        tokio::time::advance(Duration::from_millis(2100)).await;
        assert!(!w.window_held("q", 1), "ended at the window, counted from the first push");
        assert_eq!(w.take_due(Instant::now(), 10).len(), 1, "and the wheel revisits it then");
        assert!(Instant::now() >= t0 + Duration::from_secs(3));
        w.window_push("q", 1, "p", Duration::from_secs(3));
        assert!(!w.window_held("q", 1), "open until a claim");
        w.window_claimed("q", 1);
        w.window_push("q", 1, "p", Duration::from_secs(3));
        assert!(w.window_held("q", 1), "the first push after a claim holds again");
    }
}
