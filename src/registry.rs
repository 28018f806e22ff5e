//! The ack registry: what a leased pop handed out, so that an ack can resolve
//! a transactionId to its offset without asking PostgreSQL.
//!
//! Shared state of two paths, so it lives beside both rather than inside
//! either: the claim path (`pop`) records each leased batch as it renders
//! it, and the commit path (`ack`) reads it to resolve offsets and forgets a
//! batch when its lease is released. It only resolves; whether a lease is
//! live is decided in PostgreSQL, under the cursor row's lock.
//!
//! Keyed by leaseId, then partition: the batch's transactionIds and offsets,
//! and its queue's name (so that a plain ack needs no lookup to name it).
//! Bounded in memory (oldest batches are forgotten first); a miss is never an
//! error, because the transaction index in PostgreSQL is the fallback (an ack
//! arriving at another broker, or after a restart, still resolves).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

struct Batch {
    offsets: HashMap<String, i64>,
    /// Shared with every ack group that resolves through the batch: naming
    /// the queue costs an ack a reference count, not an allocation.
    queue: Arc<str>,
    bytes: usize,
}

/// What the registry knows of one (lease, partition) batch for an ack group.
#[derive(Debug, PartialEq)]
pub struct Known {
    /// Per transactionId asked about, its offset if the batch holds it.
    pub offsets: Vec<Option<i64>>,
    /// The batch's queue, when the batch is known.
    pub queue: Option<Arc<str>>,
}

/// `order` lists batches oldest first for eviction. A batch released by its
/// ack leaves a stale key behind (removing it from the middle would cost a
/// search); stale keys are skipped by eviction and swept out once they
/// outnumber the live batches, so the queue stays within twice the live
/// count. Without the sweep it grew by one key per leased batch forever,
/// because acks keep `bytes` under the cap and eviction never ran.
#[derive(Default)]
struct Inner {
    leases: HashMap<String, HashMap<i64, Batch>>,
    order: VecDeque<(String, i64)>,
    bytes: usize,
    /// Batches held (entries of `leases`' inner maps).
    live: usize,
}

/// Stale keys tolerated before a sweep, besides one per live batch.
const SWEEP_SLACK: usize = 64;

pub struct AckRegistry {
    inner: Mutex<Inner>,
    cap_bytes: usize,
}

/// Rough cost of one entry beyond its transactionId: map slot, offset, order.
const ENTRY_OVERHEAD: usize = 48;

impl AckRegistry {
    pub fn new(cap_bytes: usize) -> AckRegistry {
        AckRegistry { inner: Mutex::new(Inner::default()), cap_bytes }
    }

    /// Records a leased batch of partition `pid` in `queue`.
    pub fn record(&self, lease: &str, pid: i64, queue: &str, entries: Vec<(String, i64)>) {
        if lease.is_empty() || entries.is_empty() {
            return;
        }
        let bytes: usize = queue.len() + entries.iter().map(|(t, _)| t.len() + ENTRY_OVERHEAD).sum::<usize>();
        let mut inner = self.inner.lock().expect("registry lock poisoned");
        while inner.bytes + bytes > self.cap_bytes {
            let Some((l, p)) = inner.order.pop_front() else { break };
            inner.forget(&l, p);
        }
        if bytes > self.cap_bytes {
            return;
        }
        inner.forget(lease, pid);
        inner.bytes += bytes;
        inner.live += 1;
        inner.leases.entry(lease.to_string()).or_default().insert(pid, Batch { offsets: entries.into_iter().collect(), queue: Arc::from(queue), bytes });
        inner.order.push_back((lease.to_string(), pid));
        inner.sweep();
    }

    /// The offset of `txn` in the batch `lease` holds on `pid`, if known.
    pub fn resolve(&self, lease: &str, pid: i64, txn: &str) -> Option<i64> {
        self.resolve_many(lease, pid, std::iter::once(txn)).offsets[0]
    }

    /// [`AckRegistry::resolve`] for many transactionIds of one (lease,
    /// partition): one lock and one batch lookup for a whole ack group.
    pub fn resolve_many<'a>(&self, lease: &str, pid: i64, txns: impl Iterator<Item = &'a str>) -> Known {
        let inner = self.inner.lock().expect("registry lock poisoned");
        match inner.leases.get(lease).and_then(|parts| parts.get(&pid)) {
            Some(batch) => Known {
                offsets: txns.map(|t| batch.offsets.get(t).copied()).collect(),
                queue: Some(Arc::clone(&batch.queue)),
            },
            None => Known { offsets: txns.map(|_| None).collect(), queue: None },
        }
    }

    /// The queue (stored name) of the batch `lease` holds on `pid`, if known.
    pub fn queue_of(&self, lease: &str, pid: i64) -> Option<Arc<str>> {
        let inner = self.inner.lock().expect("registry lock poisoned");
        inner.leases.get(lease).and_then(|parts| parts.get(&pid)).map(|b| Arc::clone(&b.queue))
    }

    /// Every partition this broker knows `lease` covers.
    pub fn partitions_of(&self, lease: &str) -> Option<Vec<i64>> {
        let inner = self.inner.lock().expect("registry lock poisoned");
        inner.leases.get(lease).map(|m| m.keys().copied().collect())
    }

    /// The lease on `pid` was released: its batch is no longer needed.
    pub fn release(&self, lease: &str, pid: i64) {
        self.inner.lock().expect("registry lock poisoned").forget(lease, pid);
    }

    pub fn bytes(&self) -> usize {
        self.inner.lock().expect("registry lock poisoned").bytes
    }
}

impl Inner {
    fn forget(&mut self, lease: &str, pid: i64) {
        if let Some(parts) = self.leases.get_mut(lease) {
            if let Some(b) = parts.remove(&pid) {
                self.bytes -= b.bytes;
                self.live -= 1;
            }
            if parts.is_empty() {
                self.leases.remove(lease);
            }
        }
        // The order queue keeps a stale key; see `sweep`.
    }

    /// Drops the stale keys of `order` once they outnumber the live batches
    /// (plus a slack): amortized constant work per recorded batch.
    fn sweep(&mut self) {
        if self.order.len() <= 2 * self.live + SWEEP_SLACK {
            return;
        }
        let leases = &self.leases;
        self.order.retain(|(l, p)| leases.get(l).is_some_and(|m| m.contains_key(p)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_batch_resolves_until_released() {
        let r = AckRegistry::new(1 << 20);
        r.record("L", 7, "q", vec![("a".into(), 10), ("b".into(), 11)]);
        assert_eq!(r.resolve("L", 7, "b"), Some(11));
        assert_eq!(r.resolve("L", 8, "b"), None);
        assert_eq!(
            r.resolve_many("L", 7, ["b", "x", "a"].into_iter()),
            Known { offsets: vec![Some(11), None, Some(10)], queue: Some("q".into()) }
        );
        assert_eq!(r.resolve_many("M", 7, ["a"].into_iter()), Known { offsets: vec![None], queue: None });
        assert_eq!(r.partitions_of("L"), Some(vec![7]));
        r.release("L", 7);
        assert_eq!(r.resolve("L", 7, "a"), None);
        assert_eq!(r.bytes(), 0);
        assert_eq!(r.partitions_of("L"), None);
    }

    #[test]
    fn released_batches_do_not_pile_up_in_the_eviction_order() {
        let r = AckRegistry::new(1 << 30);
        r.record("held", 1, "", vec![("h".into(), 0)]);
        for i in 0..10_000 {
            let lease = format!("L{i}");
            r.record(&lease, 2, "", vec![("a".into(), i)]);
            r.release(&lease, 2);
        }
        let inner = r.inner.lock().unwrap();
        assert_eq!(inner.live, 1);
        assert!(inner.order.len() <= 2 * inner.live + SWEEP_SLACK + 1, "{} keys for 1 live batch", inner.order.len());
        drop(inner);
        assert_eq!(r.resolve("held", 1, "h"), Some(0), "the live batch survives every sweep");
        // Past the cap the oldest live batch still goes first.
        let small = AckRegistry::new(2 * (ENTRY_OVERHEAD + 1));
        small.record("A", 1, "", vec![("a".into(), 0)]);
        for i in 0..100 {
            let lease = format!("T{i}");
            small.record(&lease, 1, "", vec![("t".into(), i)]);
            small.release(&lease, 1);
        }
        small.record("B", 1, "", vec![("b".into(), 1)]);
        small.record("C", 1, "", vec![("c".into(), 2)]);
        assert_eq!(small.resolve("A", 1, "a"), None, "A was the oldest");
        assert_eq!((small.resolve("B", 1, "b"), small.resolve("C", 1, "c")), (Some(1), Some(2)));
    }

    #[test]
    fn the_oldest_batches_are_forgotten_past_the_cap() {
        let r = AckRegistry::new(3 * (ENTRY_OVERHEAD + 1));
        r.record("L1", 1, "", vec![("a".into(), 0), ("b".into(), 1)]);
        r.record("L2", 1, "", vec![("c".into(), 2), ("d".into(), 3)]);
        assert_eq!(r.resolve("L1", 1, "a"), None, "evicted");
        assert_eq!(r.resolve("L2", 1, "d"), Some(3));
        assert!(r.bytes() <= 3 * (ENTRY_OVERHEAD + 1));
    }
}
