//! Claim sharing: pops of batch 1 that reach the broker while such a claim
//! is in flight go to PostgreSQL together, in one statement and one
//! transaction (`queen.pop_list_shared_v3`, migrations 0048–0050), and each
//! is answered with its own claim.
//!
//! Why: the clients' default loop is pop batch 1 + ack per message. Over
//! 100 partitions with 32 consumers every pop was a claim statement and a
//! commit of its own (1.13 PostgreSQL commits per message, `pop_list_v1`
//! three quarters of PostgreSQL's time), while acks already shared their
//! commits (`ack::share`). The queueing is `db::share`'s: a lone pop claims
//! at once, with no timer, and at most `QUEEN_POP_CLAIM_WRITERS` shared
//! claims run at once, each holding one claim permit (`db::limiter`) and one
//! connection for all of its pops instead of one each.
//!
//! Each pop is a slot with the candidates the ring checked out for it alone
//! (no two slots share a partition), its own parameters and its own lease
//! id: every slot's first candidate is claimed in one set-based statement,
//! and a slot with budget left goes on through the per-partition list
//! (`pop_list_v2`), so each slot gets what that list would give it alone. A
//! pop that finds itself alone sends the per-partition list's own claim
//! (`claim::claim_candidates`): the shared statement's larger plan costs
//! more to start than one slot's work.
//!
//! What a failure means: no permit in time, or no connection while
//! PostgreSQL is up, is the pool's busy answer for every pop of the batch,
//! as it was for each alone; anything else (the statement failed, or
//! PostgreSQL is gone) sends every pop to claim alone, as before sharing, so
//! each meets its own error. Nothing was claimed by the failed statement: it
//! was one transaction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::oneshot;

use super::claim::{self, ClaimResult, ClaimSlot, Held};
use super::handover::Handover;
use super::params::PopParams;
use crate::db::limiter::AdaptiveLimiter;
use crate::db::share::{Share, Shared};

/// Most pops one shared claim carries.
const MAX_SLOTS: usize = 64;

/// What a pop learns from the share.
pub enum Outcome {
    /// Its claim, made in the shared transaction (possibly nothing claimed).
    Claimed(ClaimResult),
    /// No claim permit, or no connection, in time: `PopError::Pool`.
    Busy,
    /// The shared claim failed: claim alone.
    Alone,
}

struct Pending {
    pids: Vec<i64>,
    params: PopParams,
    worker: String,
    held: Held,
    reply: oneshot::Sender<Outcome>,
    queued: Instant,
}

impl Shared for Pending {
    fn weight(&self) -> usize {
        1
    }
}

/// The queue of batch-1 claims waiting for a shared one.
pub struct ClaimShare {
    pool: Pool,
    handover: Arc<Handover>,
    permits: Arc<AdaptiveLimiter>,
    pool_wait: Duration,
    share: Arc<Share<Pending>>,
}

impl ClaimShare {
    /// `None` when `writers` is 0: every pop claims in its own transaction.
    pub fn new(
        pool: Pool,
        handover: Arc<Handover>,
        permits: Arc<AdaptiveLimiter>,
        pool_wait: Duration,
        writers: usize,
    ) -> Option<Arc<ClaimShare>> {
        let share = Arc::new(Share::new(writers, MAX_SLOTS));
        (writers > 0).then(|| Arc::new(ClaimShare { pool, handover, permits, pool_wait, share }))
    }

    /// Whether a pop's claim may be shared: one message (so the claim takes
    /// one partition, the per-partition list's case). A shared claim waits
    /// for the disk when any of its pops must (`claim::claim_shared`).
    pub fn takes(p: &PopParams) -> bool {
        p.batch == 1
    }

    /// Claims from `pids` for one pop, together with whatever other pops
    /// queue meanwhile.
    pub async fn claim(self: &Arc<Self>, pids: Vec<i64>, p: &PopParams, worker: &str, held: Held) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let me = self.clone();
        let pending = Pending { pids, params: p.clone(), worker: worker.to_string(), held, reply, queued: Instant::now() };
        self.share.submit(pending, move |batch| {
            let me = me.clone();
            async move { me.write(batch).await }
        });
        // A writer that panicked dropped the sender: claim alone.
        answer.await.unwrap_or(Outcome::Alone)
    }

    /// One shared claim: every pop of `batch` is answered. A pop that went
    /// away while it waited (its client hung up) cannot deliver its claim:
    /// the leases go back at once (`Handover::return_claim`), so its
    /// messages do not wait out the lease time.
    async fn write(&self, batch: Vec<Pending>) {
        let outcomes = self.claim_all(&batch).await;
        for (Pending { params, worker, reply, .. }, outcome) in batch.into_iter().zip(outcomes) {
            if let Err(Outcome::Claimed(orphan)) = reply.send(outcome) {
                self.handover.return_claim(&self.pool, orphan, &params.group, &worker);
            }
        }
    }

    async fn claim_all(&self, batch: &[Pending]) -> Vec<Outcome> {
        use crate::metrics::{stage, timed, POP_STAGE};
        for q in batch {
            stage(POP_STAGE, "share", q.queued);
        }
        let every = |o: fn() -> Outcome| batch.iter().map(|_| o()).collect();
        let Some(_permit) = timed(POP_STAGE, "permit", self.permits.acquire(self.pool_wait)).await else { return every(|| Outcome::Busy) };
        let client = match timed(POP_STAGE, "pool", self.pool.get()).await {
            Ok(c) => c,
            Err(e) => return every(if crate::db::DbError::Pool(e).unavailable() { || Outcome::Alone } else { || Outcome::Busy }),
        };
        if batch.len() > 1 {
            metrics::counter!(crate::metrics::POP_SHARED_CLAIMS).increment(batch.len() as u64);
        }
        // A lone pop sends the statement it would have sent itself, the
        // per-partition list. In isolation one slot's set-based claim costs
        // less (0.23 against 0.29 ms a call, pgbench), but in the loop it
        // does not: one consumer, 16 partitions, 0.55 against 0.37 ms a call
        // (`pg_stat_statements`), and the loop made 563 against 491 msg/s
        // (medians of three, alternating builds); 4 consumers +12 %, 16
        // +6 %, 32 the same (docs/PERFORMANCE.md).
        let claimed = match batch {
            [one] => claim::claim_candidates(&client, &one.pids, &one.params, &one.worker, true, &one.held).await.map(|r| vec![r]),
            _ => {
                let slots: Vec<ClaimSlot<'_>> =
                    batch.iter().map(|q| ClaimSlot { pids: &q.pids, p: &q.params, worker: &q.worker, held: &q.held }).collect();
                claim::claim_shared(&client, &slots).await
            }
        };
        match claimed {
            Ok(results) => results.into_iter().map(Outcome::Claimed).collect(),
            Err(e) => {
                tracing::debug!(pops = batch.len(), error = %crate::db::describe(&e), "shared claim failed; each pop claims alone");
                every(|| Outcome::Alone)
            }
        }
    }
}
