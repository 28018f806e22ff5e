//! An adaptive limit on concurrent database work, Vegas-style: the latency of
//! the work itself decides how many may run at once.
//!
//! Why: PostgreSQL on a few cores does its best work with a handful of
//! statements running; past that, more concurrency only adds queueing inside
//! PostgreSQL (lock waits, context switches) and every statement gets slower.
//! 128 leased consumers on 100 partitions drained 150k msg/s with the fixed
//! 120 pop permits and 185k with 9 (docs/PERFORMANCE.md). The right number
//! depends on the machine and the load, so it is measured, not configured.
//!
//! How: samples (time from permit to release) are averaged per window of at
//! least `limit` samples and `MIN_SPAN` of time. The best window average of the last one to two epochs is
//! the no-load latency; `limit × (1 − no_load / average)` estimates how many
//! of the permit holders were queueing rather than working. Few queueing →
//! one more permit (only while the permits are actually in use, so an idle
//! broker does not grow a limit it never tests); many → one fewer. The
//! no-load estimate is forgotten epoch by epoch so that a lasting change in
//! the work (bigger batches, a bigger table) becomes the new normal.
//!
//! Permits are a `tokio` semaphore; shrinking retires permits as they come
//! back instead of taking them from their holders.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit};

/// How long a no-load estimate lives: the best window of this epoch and the
/// previous one is the reference.
const EPOCH: Duration = Duration::from_secs(30);
/// Fewest samples in a window.
const MIN_WINDOW: u32 = 8;
/// Shortest window. The no-load latency is the best window of an epoch, and
/// the best of thousands of 8-claim windows is an outlier far below the
/// typical one: on two cores, where claims share the CPU with acks, HTTP and
/// the clients, every later window then looked like queueing, and the limit
/// fell to its floor and stayed there while fewer permits only made claims
/// slower (a pop batch 1 + ack loop over 100 partitions, 32 consumers:
/// 2,800 msg/s at the first run's limit of 7, 1,900 from the second on at 3;
/// 2,500–2,700 throughout with the fixed permits). A window of 50 ms holds
/// hundreds of claims under load, and its average moves with the load, not
/// with one claim's luck.
const MIN_SPAN: Duration = Duration::from_millis(50);

/// The Vegas arithmetic, apart from the semaphore, so it can be tested with
/// made-up latencies.
#[derive(Debug)]
pub struct Vegas {
    limit: usize,
    min: usize,
    max: usize,
    sum: Duration,
    samples: u32,
    /// Most permits held at once during the window.
    peak: usize,
    window_started: Instant,
    best_this_epoch: Option<Duration>,
    best_last_epoch: Option<Duration>,
    epoch_started: Instant,
}

impl Vegas {
    pub fn new(initial: usize, min: usize, max: usize, now: Instant) -> Vegas {
        let min = min.max(1);
        let max = max.max(min);
        Vegas {
            limit: initial.clamp(min, max),
            min,
            max,
            sum: Duration::ZERO,
            samples: 0,
            peak: 0,
            window_started: now,
            best_this_epoch: None,
            best_last_epoch: None,
            epoch_started: now,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// One finished piece of work: how long it held its permit, and how many
    /// permits were held when it started. Returns the new limit when it moved.
    pub fn sample(&mut self, rtt: Duration, in_use: usize, now: Instant) -> Option<usize> {
        self.sum += rtt;
        self.samples += 1;
        self.peak = self.peak.max(in_use);
        if self.samples < MIN_WINDOW.max(self.limit as u32) || now.duration_since(self.window_started) < MIN_SPAN {
            return None;
        }
        let average = self.sum / self.samples;
        let busy = self.peak * 2 >= self.limit;
        self.sum = Duration::ZERO;
        self.samples = 0;
        self.peak = 0;
        self.window_started = now;

        if now.duration_since(self.epoch_started) >= EPOCH {
            self.best_last_epoch = self.best_this_epoch.take();
            self.epoch_started = now;
        }
        self.best_this_epoch = Some(self.best_this_epoch.map_or(average, |b| b.min(average)));
        let no_load = match self.best_last_epoch {
            Some(last) => last.min(self.best_this_epoch.expect("just set")),
            None => self.best_this_epoch.expect("just set"),
        };

        let limit = self.limit as f64;
        let queueing = limit * (1.0 - no_load.as_secs_f64() / average.as_secs_f64().max(1e-9));
        // Netflix's Vegas thresholds (3 and 6 × log10 of the limit), floored so
        // that a small limit still moves on a clear signal.
        let log = limit.log10().max(0.5);
        let before = self.limit;
        if queueing >= 6.0 * log {
            self.limit = (self.limit - 1).max(self.min);
        } else if queueing <= 3.0 * log && busy {
            self.limit = (self.limit + 1).min(self.max);
        }
        (self.limit != before).then_some(self.limit)
    }
}

/// Permits for one kind of database work, as many as `Vegas` allows.
pub struct AdaptiveLimiter {
    permits: Semaphore,
    state: Mutex<State>,
}

struct State {
    vegas: Vegas,
    /// Permits held right now.
    in_use: usize,
    /// Permits to retire as they come back (the limit shrank below what is out).
    debt: usize,
    /// `false`: a fixed limit (the adaptive part switched off).
    adaptive: bool,
}

/// A held permit; the work's latency is recorded when it is dropped.
pub struct LimitPermit<'a> {
    limiter: &'a AdaptiveLimiter,
    permit: Option<SemaphorePermit<'a>>,
    started: Instant,
    in_use: usize,
}

impl AdaptiveLimiter {
    /// Starts at `initial` permits, moving between `min` and `max`; with
    /// `adaptive` false it stays at `max`.
    pub fn new(initial: usize, min: usize, max: usize, adaptive: bool) -> AdaptiveLimiter {
        let vegas = Vegas::new(if adaptive { initial } else { max }, min, max, Instant::now());
        AdaptiveLimiter {
            permits: Semaphore::new(vegas.limit()),
            state: Mutex::new(State { vegas, in_use: 0, debt: 0, adaptive }),
        }
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.state.lock().expect("limiter lock poisoned").vegas.limit()
    }

    /// Waits up to `wait` for a permit.
    pub async fn acquire(&self, wait: Duration) -> Option<LimitPermit<'_>> {
        let permit = tokio::time::timeout(wait, self.permits.acquire()).await.ok()?.ok()?;
        Some(self.held(permit))
    }

    /// A permit only if one is free now.
    pub fn try_acquire(&self) -> Option<LimitPermit<'_>> {
        self.permits.try_acquire().ok().map(|p| self.held(p))
    }

    fn held<'a>(&'a self, permit: SemaphorePermit<'a>) -> LimitPermit<'a> {
        let mut st = self.state.lock().expect("limiter lock poisoned");
        st.in_use += 1;
        LimitPermit { limiter: self, permit: Some(permit), started: Instant::now(), in_use: st.in_use }
    }

    fn release(&self, permit: SemaphorePermit<'_>, rtt: Duration, in_use: usize) {
        let mut st = self.state.lock().expect("limiter lock poisoned");
        st.in_use -= 1;
        if st.adaptive {
            let before = st.vegas.limit();
            if let Some(after) = st.vegas.sample(rtt, in_use, Instant::now()) {
                if after > before {
                    // Pay down retirements first, then add.
                    let grow = after - before;
                    let repaid = grow.min(st.debt);
                    st.debt -= repaid;
                    self.permits.add_permits(grow - repaid);
                } else {
                    st.debt += before - after;
                }
            }
        }
        if st.debt > 0 {
            st.debt -= 1;
            permit.forget();
        }
        // Otherwise the permit goes back to the semaphore as it drops.
    }
}

impl Drop for LimitPermit<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.limiter.release(permit, self.started.elapsed(), self.in_use);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` samples of `rtt` with `in_use` permits held, `MIN_WINDOW`
    /// of them per `MIN_SPAN` (so a window is `max(MIN_WINDOW, limit)` samples).
    fn feed(v: &mut Vegas, n: usize, rtt: Duration, in_use: usize, now: &mut Instant) {
        for _ in 0..n {
            *now += MIN_SPAN / MIN_WINDOW;
            v.sample(rtt, in_use, *now);
        }
    }

    #[test]
    fn latency_noise_that_concurrency_does_not_cause_leaves_the_limit_up() {
        // Claims sharing two cores with other work: a heavy-tailed latency
        // (0.5 to 15 ms, 2.9 ms on average) that does not depend on the limit.
        // The best of thousands of eight-claim windows is far below a typical
        // one, and with such windows the limit fell to 3 or 4 and stayed.
        const MS: [f64; 12] = [0.5, 0.6, 0.8, 1.0, 1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 8.0, 15.0];
        let mut now = Instant::now();
        let mut v = Vegas::new(8, 2, 20, now);
        let mut seed: u64 = 12345;
        for _ in 0..40_000 {
            now += Duration::from_micros(500);
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let rtt = Duration::from_secs_f64(MS[((seed >> 33) % 12) as usize] / 1000.0);
            let in_use = v.limit();
            v.sample(rtt, in_use, now);
        }
        assert!(v.limit() >= 8, "noise alone shrank the limit to {}", v.limit());
    }

    #[test]
    fn a_busy_limit_with_flat_latency_grows_to_its_maximum() {
        let mut now = Instant::now();
        let mut v = Vegas::new(4, 2, 20, now);
        for _ in 0..100 {
            let l = v.limit();
            feed(&mut v, l.max(8), Duration::from_millis(2), l, &mut now);
        }
        assert_eq!(v.limit(), 20);
    }

    #[test]
    fn an_idle_limit_does_not_grow() {
        let mut now = Instant::now();
        let mut v = Vegas::new(4, 2, 20, now);
        feed(&mut v, 400, Duration::from_millis(2), 1, &mut now);
        assert_eq!(v.limit(), 4);
    }

    #[test]
    fn latency_that_grows_with_concurrency_settles_the_limit_where_queueing_starts() {
        // A server that runs 4 pieces of work at a time at 2 ms each: with
        // `limit` in flight, each waits limit/4 service times.
        let mut now = Instant::now();
        let mut v = Vegas::new(2, 2, 100, now);
        let rtt = |limit: usize| Duration::from_micros(2000 * (limit.max(4) as u64) / 4);
        let mut seen = Vec::new();
        for _ in 0..400 {
            let l = v.limit();
            feed(&mut v, l.max(8), rtt(l), l, &mut now);
            seen.push(v.limit());
        }
        let settled = &seen[300..];
        assert!(settled.iter().all(|&l| (4..=12).contains(&l)), "settled at {settled:?}");
        assert!(seen.iter().max().copied().unwrap() <= 16, "overshot to {:?}", seen.iter().max());
    }

    #[test]
    fn a_limit_shrinks_when_latency_jumps_and_recovers_in_a_later_epoch() {
        let mut now = Instant::now();
        let mut v = Vegas::new(16, 2, 16, now);
        feed(&mut v, 64, Duration::from_millis(1), 16, &mut now);
        assert_eq!(v.limit(), 16);
        feed(&mut v, 200, Duration::from_millis(10), 16, &mut now);
        assert!(v.limit() <= 4, "ten times the no-load latency is queueing; limit {}", v.limit());
        // The slower work lasts: once the fast epoch has been forgotten it is
        // the new no-load latency and the limit grows back.
        now += EPOCH;
        feed(&mut v, 50, Duration::from_millis(10), 2, &mut now);
        now += EPOCH;
        for _ in 0..200 {
            let l = v.limit();
            feed(&mut v, l.max(8), Duration::from_millis(10), l, &mut now);
        }
        assert_eq!(v.limit(), 16);
    }

    #[tokio::test]
    async fn shrinking_retires_returned_permits_and_growing_adds_them() {
        let l = AdaptiveLimiter::new(4, 1, 8, true);
        let held: Vec<_> = (0..4).map(|_| l.try_acquire().expect("four permits")).collect();
        assert!(l.try_acquire().is_none(), "the fifth must wait");
        {
            let mut st = l.state.lock().unwrap();
            st.vegas.limit = 2;
            st.debt = 2;
        }
        drop(held);
        let again: Vec<_> = (0..2).map(|_| l.try_acquire().expect("two permits")).collect();
        assert!(l.try_acquire().is_none(), "two permits were retired");
        drop(again);
        assert_eq!(l.permits.available_permits(), 2);
    }

    #[tokio::test]
    async fn a_fixed_limiter_stays_at_its_maximum() {
        let l = AdaptiveLimiter::new(2, 1, 5, false);
        assert_eq!(l.limit(), 5);
        let held: Vec<_> = (0..5).map(|_| l.try_acquire().expect("five permits")).collect();
        assert!(l.try_acquire().is_none());
        drop(held);
        assert_eq!(l.permits.available_permits(), 5);
        assert!(l.acquire(Duration::from_millis(10)).await.is_some());
    }
}
