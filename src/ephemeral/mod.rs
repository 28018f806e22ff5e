//! Ephemeral queues (issue 33, API.md §2.10): queues that live in this
//! broker process's memory and nowhere else. They are for data that is
//! worthless after a crash and must be cheap (presence, progress, cache
//! invalidations, fan-out of live events): a push, a pop and an ack are a
//! lock, a ring operation and a wake-up, and never reach PostgreSQL. Not the
//! contents, not the configuration: a restart brings back nothing, and the
//! ids a pop handed out before it answer `stale` (they carry the process's
//! epoch).
//!
//! What is bounded, and by whom: each queue by its own `maxLength` and
//! `maxBytes` (what a full queue does is its `policy`: refuse with 429 or
//! drop its oldest), and all of them together by `QUEEN_EPHEMERAL_MAX_MB`,
//! which no set of queues can pass (503). A message's cost counts its
//! payload and a fixed overhead ([`queue::MESSAGE_OVERHEAD`]).
//!
//! Shared state is a map of queues behind a `std::sync::RwLock` (taken for
//! writing only to create or remove a queue) and each queue's state behind
//! its own `std::sync::Mutex`, held for a ring operation and never across an
//! await. A waiting pop parks on its queue's [`tokio::sync::Notify`], which
//! every push wakes, and also wakes when one of its group's leases ends.

pub mod options;
pub mod queue;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

pub use options::{Options, Policy};
pub use queue::{Delivered, Outcome, Refusal, QUEUE_MODE};
use queue::QueueState;

/// The broker-wide settings (`QUEEN_EPHEMERAL_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct EphemeralConfig {
    pub enabled: bool,
    /// The budget of all queues together, in bytes.
    pub max_bytes: u64,
    /// A new queue's bounds.
    pub defaults: Options,
    /// A queue created by a push or pop (not configured) that is empty and
    /// unused this long is removed; a group unused this long stops holding
    /// its queue's ring.
    pub idle: Duration,
}

/// Counts a waiting pop for as long as it lives (also when the request is
/// dropped mid-wait).
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One queue: its state and the gate its waiting pops park on.
struct Queue {
    state: Mutex<QueueState>,
    wake: tokio::sync::Notify,
}

/// Every ephemeral queue of this broker.
pub struct Ephemeral {
    /// This process's incarnation, in every message id.
    epoch: u64,
    config: EphemeralConfig,
    queues: RwLock<HashMap<String, Arc<Queue>>>,
    /// Bytes queued in all queues (the broker-wide budget's account).
    used: AtomicU64,
    generations: AtomicU64,
    /// Pops waiting now (`parkedPops` in the listing): what a wake-up test
    /// waits for, and what an operator reads to see waiting consumers.
    parked: AtomicU64,
}

impl Ephemeral {
    pub fn new(config: EphemeralConfig) -> Ephemeral {
        // The low 64 bits of a v7 uuid: the start's milliseconds cannot
        // repeat across restarts, the random bits make two brokers differ.
        let (_, low) = uuid::Uuid::now_v7().as_u64_pair();
        let high = uuid::Uuid::now_v7().as_u64_pair().0 >> 16;
        Ephemeral {
            epoch: (high << 20) ^ (low & 0xf_ffff),
            config,
            queues: RwLock::new(HashMap::new()),
            used: AtomicU64::new(0),
            generations: AtomicU64::new(1),
            parked: AtomicU64::new(0),
        }
    }

    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The bytes held by the queues whose stored names `of` picks (a
    /// tenant's: `tenancy::quota`).
    pub fn held_by(&self, of: impl Fn(&str) -> bool) -> u64 {
        let queues: Vec<Arc<Queue>> = self.queues.read().expect("ephemeral map").iter().filter(|(k, _)| of(k)).map(|(_, q)| q.clone()).collect();
        queues.iter().map(|q| q.state.lock().expect("ephemeral queue").bytes).sum()
    }

    /// The stored names `of` picks.
    pub fn names_of(&self, of: impl Fn(&str) -> bool) -> Vec<String> {
        self.queues.read().expect("ephemeral map").keys().filter(|k| of(k)).cloned().collect()
    }

    fn get(&self, name: &str) -> Option<Arc<Queue>> {
        self.queues.read().expect("ephemeral map").get(name).cloned()
    }

    fn get_or_create(&self, name: &str) -> Arc<Queue> {
        if let Some(q) = self.get(name) {
            return q;
        }
        let mut map = self.queues.write().expect("ephemeral map");
        map.entry(name.to_string())
            .or_insert_with(|| {
                let generation = self.generations.fetch_add(1, Ordering::Relaxed);
                Arc::new(Queue {
                    state: Mutex::new(QueueState::new(self.config.defaults.clone(), generation, Instant::now())),
                    wake: tokio::sync::Notify::new(),
                })
            })
            .clone()
    }

    fn free(&self, bytes: u64) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Moves the broker-wide account by a queue's change of footprint
    /// (messages and bookkeeping) from `before` to `after`.
    fn account(&self, before: u64, after: u64) {
        if after > before {
            self.used.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.free(before - after);
        }
    }

    /// Declares `name` with `options` applied over its current bounds (a
    /// new queue's are the defaults); `Err((field, problem))` changes
    /// nothing.
    pub fn configure(&self, name: &str, options: &Map<String, Value>) -> Result<Value, (String, String)> {
        // Validate before creating, so a refused configure leaves no queue.
        let current = self.get(name).map(|q| q.state.lock().expect("ephemeral queue").options.clone());
        let created = current.is_none();
        let applied = current.unwrap_or_else(|| self.config.defaults.clone()).apply(options, self.config.max_bytes)?;
        let q = self.get_or_create(name);
        let mut s = q.state.lock().expect("ephemeral queue");
        s.options = applied;
        s.declared = true;
        Ok(json!({"queue": crate::tenancy::shown(name), "configured": true, "created": created, "options": s.options.to_json()}))
    }

    /// Drops every message of `name`; how many.
    pub fn reset(&self, name: &str) -> usize {
        let Some(q) = self.get(name) else { return 0 };
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let mut s = q.state.lock().expect("ephemeral queue");
        let before = s.footprint();
        let (dropped, _) = s.reset(generation);
        self.account(before, s.footprint());
        dropped
    }

    /// Removes `name` with its contents, cursors and configuration.
    pub fn delete(&self, name: &str) -> bool {
        let Some(q) = self.queues.write().expect("ephemeral map").remove(name) else { return false };
        let footprint = q.state.lock().expect("ephemeral queue").footprint();
        self.free(footprint);
        for reason in ["full", "ttl", "retries"] {
            let mut labels = crate::tenancy::queue_labels(name);
            labels.push(metrics::Label::new("reason", reason));
            metrics::counter!("queen_ephemeral_dropped_total", labels.clone()).absolute(0);
        }
        let labels = crate::tenancy::queue_labels(name);
        metrics::gauge!("queen_ephemeral_depth", labels.clone()).set(0.0);
        metrics::gauge!("queen_ephemeral_bytes", labels.clone()).set(0.0);
        q.wake.notify_waiters();
        true
    }

    /// Queues `payloads` on `partition` of `name`, all or none.
    pub fn push(&self, name: &str, partition: &str, payloads: Vec<Arc<RawValue>>) -> Result<usize, Refusal> {
        let q = self.get_or_create(name);
        let n = payloads.len();
        {
            let mut s = q.state.lock().expect("ephemeral queue");
            let now = Instant::now();
            let expired = s.expire(now);
            self.free(expired);
            let planned = s.plan_push(partition, &payloads);
            let (need, drop) = match planned {
                Ok(plan) => plan,
                Err(refusal) => {
                    s.counters.refused += 1;
                    return Err(refusal);
                }
            };
            // The broker-wide budget: reserve what the push needs beyond
            // what it frees, or refuse before changing anything.
            let cap = self.config.max_bytes;
            if self.used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| (u + need <= cap).then_some(u + need)).is_err() {
                s.counters.refused += 1;
                return Err(Refusal::MemoryFull);
            }
            let before = s.footprint();
            s.push(partition, payloads, drop, now);
            // What was reserved becomes what the push really changed.
            self.account(before + need, s.footprint());
        }
        q.wake.notify_waiters();
        Ok(n)
    }

    /// Takes up to `batch` messages of `name` for `group`; with `wait`, parks
    /// until some arrive (or a lease of the group ends) or the wait is over.
    pub async fn pop(&self, name: &str, group: &str, partition: Option<&str>, batch: usize, commit: bool, wait: Option<Duration>) -> Vec<Delivered> {
        let q = self.get_or_create(name);
        let started = Instant::now();
        let deadline = wait.map(|w| started + w);
        loop {
            let notified = q.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = Instant::now();
            let (got, next_expiry, window_until) = {
                let mut s = q.state.lock().expect("ephemeral queue");
                let before = s.footprint();
                // A window buffer holds a waiting pop back until it can fill
                // `count` or the window has passed.
                let window = s.options.window_buffer.filter(|_| deadline.is_some());
                let held = window.and_then(|w| {
                    let until = started + Duration::from_millis(w.ms);
                    let want = w.count.min(batch);
                    (now < until && s.ready(group, partition, want, now) < want).then_some(until)
                });
                let answer = if held.is_some() {
                    (Vec::new(), None, held)
                } else {
                    let (got, next) = s.pop(self.epoch, group, partition, batch, commit, now);
                    (got, next, None)
                };
                self.account(before, s.footprint());
                answer
            };
            if !got.is_empty() {
                return got;
            }
            let Some(deadline) = deadline else { return got };
            if now >= deadline {
                return got;
            }
            let mut until = deadline;
            for t in [next_expiry, window_until].into_iter().flatten() {
                until = until.min(t.max(now + Duration::from_millis(1)));
            }
            {
                let _parked = Waiting::new(&self.parked);
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(until.into()) => {}
                }
            }
            if window_until.is_some() && Instant::now() >= deadline {
                // The last look takes what there is.
                let mut s = q.state.lock().expect("ephemeral queue");
                let before = s.footprint();
                let (got, _) = s.pop(self.epoch, group, partition, batch, commit, Instant::now());
                self.account(before, s.footprint());
                return got;
            }
        }
    }

    /// Acks (`true`) or nacks (`false`) messages of `name` delivered to
    /// `group`; one outcome each, in order. `None`: no such queue (every id
    /// of it is stale).
    pub fn ack(&self, name: &str, group: &str, acks: &[(&str, bool)]) -> Vec<Outcome> {
        let Some(q) = self.get(name) else { return vec![Outcome::Stale; acks.len()] };
        let (outcomes, redelivered) = {
            let mut s = q.state.lock().expect("ephemeral queue");
            let now = Instant::now();
            let before = s.footprint();
            let outcomes: Vec<Outcome> = acks.iter().map(|(id, settle)| s.ack(self.epoch, group, id, *settle, now)).collect();
            self.account(before, s.footprint());
            let redelivered = outcomes.contains(&Outcome::Redelivered);
            (outcomes, redelivered)
        };
        if redelivered {
            q.wake.notify_waiters();
        }
        outcomes
    }

    fn describe(name: &str, s: &QueueState) -> Value {
        let c = &s.counters;
        json!({
            "queue": crate::tenancy::shown(name),
            "declared": s.declared,
            "depth": s.length,
            "bytes": s.bytes,
            "partitions": s.partitions().map(|(p, depth, bytes)| json!({"partition": p, "depth": depth, "bytes": bytes})).collect::<Vec<_>>(),
            "groups": s.groups().into_iter().map(|(g, pending, leased)| json!({
                "group": if g == QUEUE_MODE { Value::Null } else { Value::String(g) },
                "pending": pending, "inFlight": leased})).collect::<Vec<_>>(),
            "options": s.options.to_json(),
            "counters": {"pushed": c.pushed, "delivered": c.delivered, "acked": c.acked, "refused": c.refused,
                         "dropped": {"full": c.dropped_full, "ttl": c.dropped_ttl, "retries": c.dropped_retries}},
        })
    }

    /// `GET /api/v1/ephemeral/queues`: every queue, or with tenancy on
    /// (`tenant` given) the tenant's.
    pub fn list(&self, enabled: bool, tenant: Option<crate::tenancy::Tenant>) -> Value {
        let queues: Vec<(String, Arc<Queue>)> = self
            .queues
            .read()
            .expect("ephemeral map")
            .iter()
            .filter(|(k, _)| tenant.is_none_or(|t| t.owns(k)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut out: Vec<Value> = queues
            .iter()
            .map(|(name, q)| {
                let s = q.state.lock().expect("ephemeral queue");
                json!({"queue": crate::tenancy::shown(name), "declared": s.declared, "depth": s.length, "bytes": s.bytes,
                       "partitions": s.partitions().count(), "groups": s.groups().len(), "options": s.options.to_json()})
            })
            .collect();
        out.sort_by(|a, b| a["queue"].as_str().cmp(&b["queue"].as_str()));
        json!({"queues": out, "enabled": enabled, "usedBytes": self.used_bytes(), "maxBytes": self.config.max_bytes,
               "parkedPops": self.parked.load(Ordering::Relaxed)})
    }

    /// `GET /api/v1/ephemeral/queues/{queue}/depth`; None: no such queue.
    pub fn depth(&self, name: &str) -> Option<Value> {
        let q = self.get(name)?;
        let s = q.state.lock().expect("ephemeral queue");
        Some(Self::describe(name, &s))
    }

    /// The sweeper's pass (once a second): drops what outlived its TTL,
    /// forgets idle groups, removes idle undeclared empty queues, and sets
    /// the Prometheus gauges and counters of every queue.
    pub fn sweep(&self) {
        let now = Instant::now();
        let queues: Vec<(String, Arc<Queue>)> =
            self.queues.read().expect("ephemeral map").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut idle = Vec::new();
        for (name, q) in queues {
            let s = &mut *q.state.lock().expect("ephemeral queue");
            let before = s.footprint();
            s.expire(now);
            s.forget_idle_groups(self.config.idle, now);
            s.forget_idle_partitions(self.config.idle, now);
            self.account(before, s.footprint());
            if !s.declared && s.length == 0 && now.saturating_duration_since(s.last_used) >= self.config.idle {
                idle.push(name.clone());
            }
            let c = s.counters;
            let labels = crate::tenancy::queue_labels(&name);
            let with_reason = |reason: &'static str| {
                let mut l = labels.clone();
                l.push(metrics::Label::new("reason", reason));
                l
            };
            metrics::gauge!("queen_ephemeral_depth", labels.clone()).set(s.length as f64);
            metrics::gauge!("queen_ephemeral_bytes", labels.clone()).set(s.bytes as f64);
            metrics::counter!("queen_ephemeral_dropped_total", with_reason("full")).absolute(c.dropped_full);
            metrics::counter!("queen_ephemeral_dropped_total", with_reason("ttl")).absolute(c.dropped_ttl);
            metrics::counter!("queen_ephemeral_dropped_total", with_reason("retries")).absolute(c.dropped_retries);
            metrics::counter!("queen_ephemeral_refused_total", labels.clone()).absolute(c.refused);
        }
        if !idle.is_empty() {
            let mut map = self.queues.write().expect("ephemeral map");
            for name in idle {
                // Still idle and empty under the write lock (a push may have come).
                let gone = map.get(&name).is_some_and(|q| {
                    let s = q.state.lock().expect("ephemeral queue");
                    !s.declared && s.length == 0 && now.saturating_duration_since(s.last_used) >= self.config.idle
                });
                if gone {
                    if let Some(q) = map.remove(&name) {
                        // Its bookkeeping (groups, partitions) goes with it.
                        self.free(q.state.lock().expect("ephemeral queue").footprint());
                    }
                }
            }
        }
        metrics::gauge!("queen_ephemeral_used_bytes").set(self.used_bytes() as f64);
    }
}
