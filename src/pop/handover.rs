//! Lease handover: an ack that ends a lease hands the partition's next
//! messages to a pop of the same group parked on this broker, in the ack's
//! own row update (`queen.ack_completed_many_v2`, migration 0028).
//!
//! Why it exists: with more workers than partitions (the clients' default
//! loop of `pop batch 1` + one ack per message), most pops are parked while
//! a few hold the leases. Each message used to cost two transactions, the
//! ack that released the lease and a claim that took it again, and every
//! release woke all the parked pops of the queue to race for one partition.
//! A handover is the claim the next pop would have made, written by the ack
//! that frees the partition: one statement, in a commit the ack already
//! shares with its neighbours, and one parked pop answered, the others left
//! asleep.
//!
//! The shape: parked pops stand in a first-come queue per (queue, group)
//! with the lease id they minted; an ack takes one before its statement and,
//! after the commit, gives it the claimed span (or puts it back at the head
//! of the queue when PostgreSQL did not hand over: the lease did not end, the
//! queue gates its messages, the next segment is gone). Nothing is answered
//! before the commit. A pop that gives up (deadline, shutdown) leaves the
//! queue; if an ack has already taken it, it waits for that ack's answer,
//! which may be a claim it must deliver. A pop whose client hung up meanwhile
//! cannot take its claim: the ack returns that lease at once
//! (`queen.lease_return_v1`) and wakes the queue.
//!
//! Only what a claim would give the same pop is handed over: a wildcard,
//! leased, long-polling pop, of a queue without windowBuffer or
//! delayedProcessing (PostgreSQL checks the gates again), the next offsets
//! inside one segment, at most the pop's batch.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::claim::ClaimResult;
use super::frames::FrameCache;
use super::wake::WakeGates;

/// (queue, consumer group).
type Key = (String, String);

const RETURN_SQL: &str = "SELECT queen.lease_return_v1($1, $2, $3)";

/// The parked pops waiting for a handover, per (queue, group).
pub struct Handover {
    waiting: Mutex<HashMap<Key, VecDeque<Waiter>>>,
    next_id: AtomicU64,
    /// Woken when a handed lease comes back unused.
    wake: Arc<WakeGates>,
    /// Decompressed segments: a handover whose next message is in one asks
    /// PostgreSQL not to ship the blob.
    pub frames: FrameCache,
    /// Pop maintenance: pops answer empty, so no ack takes one.
    paused: AtomicBool,
}

/// A parked pop as an ack sees it: the lease to write and the claim's size.
pub struct Waiter {
    id: u64,
    pub lease_id: String,
    /// The pop's `leaseTime` (<= 0: the queue's).
    pub lease_seconds: i32,
    pub batch: i32,
    /// A `QPF1` pop ships stored blobs as they are: its claim needs the
    /// blob even when the broker holds the segment decompressed.
    pub ships_blobs: bool,
    reply: oneshot::Sender<ClaimResult>,
    /// Set by the pop when it stops waiting: an ack that holds it then must
    /// not put it back in line (the pop would wait for an answer forever).
    leaving: Arc<AtomicBool>,
}

impl Waiter {
    /// Gives the claim to its pop; the claim comes back when the pop is gone.
    pub fn deliver(self, claimed: ClaimResult) -> Result<(), ClaimResult> {
        self.reply.send(claimed)
    }
}

/// A pop's place in the queue, held while it is parked.
pub struct Ticket<'a> {
    handover: &'a Handover,
    key: Key,
    id: u64,
    leaving: Arc<AtomicBool>,
    pub answer: oneshot::Receiver<ClaimResult>,
}

impl Handover {
    pub fn new(wake: Arc<WakeGates>, frame_cache_bytes: usize) -> Handover {
        Handover {
            waiting: Mutex::default(),
            next_id: AtomicU64::new(1),
            wake,
            frames: FrameCache::new(frame_cache_bytes),
            paused: AtomicBool::new(false),
        }
    }

    /// A parked pop joins the queue of (queue, group).
    pub fn park(&self, queue: &str, group: &str, lease_id: &str, lease_seconds: i32, batch: i32, ships_blobs: bool) -> Ticket<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let key = (queue.to_string(), group.to_string());
        let leaving = Arc::new(AtomicBool::new(false));
        let waiter = Waiter { id, lease_id: lease_id.to_string(), lease_seconds, batch, ships_blobs, reply, leaving: leaving.clone() };
        self.lock().entry(key.clone()).or_default().push_back(waiter);
        Ticket { handover: self, key, id, leaving, answer }
    }

    /// The longest-waiting pop of (queue, group) whose client is still
    /// there, taken out of the queue for one ack.
    pub fn take(&self, queue: &str, group: &str) -> Option<Waiter> {
        if self.paused.load(Ordering::SeqCst) {
            return None;
        }
        let mut waiting = self.lock();
        let key = (queue.to_string(), group.to_string());
        let line = waiting.get_mut(&key)?;
        let mut found = None;
        while let Some(w) = line.pop_front() {
            if !w.reply.is_closed() {
                found = Some(w);
                break;
            }
        }
        if line.is_empty() {
            waiting.remove(&key);
        }
        found
    }

    /// Pop maintenance on or off: while on, acks hand nothing over.
    pub fn pause(&self, on: bool) {
        self.paused.store(on, Ordering::SeqCst);
    }

    /// Whether pops of (queue, group) stand parked here: they found nothing
    /// to claim, so a new pop joins them instead of claiming partitions
    /// they found leased (it looks for itself at its first re-check).
    pub fn queued(&self, queue: &str, group: &str) -> bool {
        self.lock().get(&(queue.to_string(), group.to_string())).is_some_and(|line| line.iter().any(|w| !w.reply.is_closed()))
    }

    /// An ack that did not hand over puts its pop back where it stood; a
    /// pop that stopped waiting meanwhile is let go (its answer: none).
    pub fn put_back(&self, queue: &str, group: &str, waiter: Waiter) {
        let mut waiting = self.lock();
        // Checked under the lock the leaving pop's removal takes after
        // setting the flag: either it sees the flag here, or it finds the
        // waiter back in line and removes it.
        if waiter.reply.is_closed() || waiter.leaving.load(Ordering::SeqCst) {
            return;
        }
        waiting.entry((queue.to_string(), group.to_string())).or_default().push_front(waiter);
    }

    /// Ends, now, a lease handed to a pop that cannot answer it (gone, or
    /// answering something else), so its messages wait for no lease time,
    /// and wakes the queue's parked pops. Only if the partition still has
    /// that lease (`queen.lease_return_v1`); nothing was delivered under it.
    pub fn return_lease(self: &Arc<Self>, pool: &deadpool_postgres::Pool, queue: String, group: String, pid: i64, lease: String) {
        let (pool, handover) = (pool.clone(), self.clone());
        tokio::spawn(async move {
            let back = async {
                let client = pool.get().await.map_err(crate::db::DbError::Pool)?;
                let stmt = client.prepare_cached(RETURN_SQL).await?;
                Ok::<bool, crate::db::DbError>(client.query_one(&stmt, &[&pid, &group, &lease]).await?.get(0))
            };
            match back.await {
                Ok(_) => handover.wake.pushed(&queue),
                Err(e) => tracing::warn!(partition_id = pid, error = %e,
                                         "a handed lease its pop could not answer was not returned; it lapses at its expiry"),
            }
        });
    }

    /// [`Handover::return_lease`] for every partition of a handed claim.
    pub fn return_claim(self: &Arc<Self>, pool: &deadpool_postgres::Pool, claimed: ClaimResult, group: &str, lease: &str) {
        for c in claimed.claimed {
            self.return_lease(pool, c.queue, group.to_string(), c.partition_id, lease.to_string());
        }
    }

    /// Pops waiting, across every queue (tests and gauges).
    pub fn waiting(&self) -> usize {
        self.lock().values().map(VecDeque::len).sum()
    }

    fn remove(&self, key: &Key, id: u64) -> bool {
        let mut waiting = self.lock();
        let Some(line) = waiting.get_mut(key) else { return false };
        let before = line.len();
        line.retain(|w| w.id != id);
        let removed = line.len() < before;
        if line.is_empty() {
            waiting.remove(key);
        }
        removed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, VecDeque<Waiter>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Ticket<'_> {
    /// The pop stops waiting. If an ack has taken it meanwhile, that ack's
    /// answer is awaited: a claim made for this pop is this pop's to deliver.
    pub async fn leave(mut self) -> Option<ClaimResult> {
        self.leaving.store(true, Ordering::SeqCst);
        if self.handover.remove(&self.key, self.id) {
            return None;
        }
        (&mut self.answer).await.ok()
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        // A pop dropped while parked (its client hung up) leaves the queue;
        // one an ack has already taken is returned by that ack.
        self.leaving.store(true, Ordering::SeqCst);
        self.handover.remove(&self.key, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handover() -> Handover {
        Handover::new(Arc::new(WakeGates::default()), 0)
    }

    #[tokio::test]
    async fn pops_are_taken_first_come_and_put_back_at_the_head() {
        let h = handover();
        let a = h.park("q", "g", "La", 0, 1, false);
        let b = h.park("q", "g", "Lb", 30, 5, false);
        let _other = h.park("q", "other", "Lc", 0, 1, false);
        let first = h.take("q", "g").expect("a waits");
        assert_eq!((first.lease_id.as_str(), first.lease_seconds, first.batch), ("La", 0, 1));
        h.put_back("q", "g", first);
        assert_eq!(h.take("q", "g").unwrap().lease_id, "La");
        assert_eq!(h.take("q", "g").unwrap().lease_id, "Lb");
        assert!(h.take("q", "g").is_none());
        drop((a, b));
        assert_eq!(h.waiting(), 1, "only the other group's pop is left");
    }

    #[tokio::test]
    async fn a_pop_that_leaves_after_being_taken_gets_the_acks_answer() {
        let h = handover();
        let t = h.park("q", "g", "L", 0, 1, false);
        let w = h.take("q", "g").unwrap();
        let leaving = tokio::spawn(async move { w.deliver(ClaimResult::default()).is_ok() });
        assert!(t.leave().await.is_some(), "the claim made for it reaches it");
        assert!(leaving.await.unwrap());
        let t = h.park("q", "g", "L2", 0, 1, false);
        assert!(t.leave().await.is_none(), "not taken: it just leaves");
        assert_eq!(h.waiting(), 0);
    }

    /// The long-poll that never answered (found by the benchmark): a pop
    /// leaving while an ack holds it, the ack not handing over and putting
    /// it back. The pop must be let go, not wait in line for ever.
    #[tokio::test]
    async fn a_pop_leaving_while_an_ack_holds_it_is_not_put_back() {
        let h = handover();
        let t = h.park("q", "g", "L", 0, 1, false);
        let w = h.take("q", "g").unwrap();
        let leaving = tokio::time::timeout(std::time::Duration::from_secs(5), t.leave());
        let ack = async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            h.put_back("q", "g", w);
        };
        let (left, ()) = tokio::join!(leaving, ack);
        assert!(left.expect("the pop did not stay stuck").is_none(), "no claim for it");
        assert_eq!(h.waiting(), 0, "nothing left in line");
    }

    #[tokio::test]
    async fn a_dropped_pop_leaves_the_queue_and_cannot_be_delivered_to() {
        let h = handover();
        let t = h.park("q", "g", "L", 0, 1, false);
        let w = h.take("q", "g").unwrap();
        drop(t);
        assert!(w.deliver(ClaimResult::default()).is_err(), "the ack learns the pop is gone");
        let t = h.park("q", "g", "L2", 0, 1, false);
        drop(t);
        assert!(h.take("q", "g").is_none());
    }
}
