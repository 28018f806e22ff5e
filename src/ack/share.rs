//! Shared commits for acknowledgements: concurrent ack requests go to
//! PostgreSQL together.
//!
//! A worker loop of `pop batch 1` + one ack per message (the clients'
//! default) made every ack its own PostgreSQL commit, so thirty-two workers
//! cost thirty-two WAL flushes for thirty-two cursor moves. An ack is small
//! and its rules live in the stored functions, so requests that arrive while
//! a write is in flight can simply be applied as one batch: their items are
//! put side by side and given to [`AckService::ack_now`] once, which groups
//! them by (partition, group, lease), locks the cursor rows in partition
//! order and applies each group with the same statements and the same
//! fencing as a single request's batch. The answers are split back by
//! request, each with its own items' outcomes, after COMMIT: nothing is
//! answered before it is durable.
//!
//! The queueing is `db::share`'s: at most `QUEEN_ACK_GROUP_WRITERS` shared
//! writes are in flight, a lone ack goes out at once, and there is no
//! timer. A shared write that fails
//! for a reason other than an outage is tried again request by request, so a
//! request that makes PostgreSQL refuse fails only itself; an outage (or a
//! pool with no connection to lend) fails every request of the write with
//! the same error, since each would meet it alone.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::{AckItem, AckOutcome, AckService, Released};
use crate::db::share::Shared;
use crate::db::DbError;

/// Most items one shared write carries; a single request larger than this
/// still goes (alone).
pub const MAX_ITEMS: usize = 5_000;

/// What one request gets back.
pub type Done = (Vec<AckOutcome>, Vec<Released>);
type Reply = oneshot::Sender<Result<Done, Arc<DbError>>>;

/// One ack request waiting for a shared write.
pub struct Request {
    items: Vec<AckItem>,
    reply: Reply,
    queued: Instant,
}

impl Shared for Request {
    fn weight(&self) -> usize {
        self.items.len()
    }
}

impl AckService {
    /// Applies a request's acknowledgements in a commit shared with the
    /// requests that arrive beside it; outcomes in request order, plus the
    /// leases its acks released.
    pub async fn ack(&self, items: &[AckItem]) -> Result<Done, Arc<DbError>> {
        let (reply, rx) = oneshot::channel();
        let me = self.clone();
        self.share.submit(Request { items: items.to_vec(), reply, queued: Instant::now() }, move |batch| {
            let me = me.clone();
            async move { me.write(batch).await }
        });
        rx.await.unwrap_or_else(|_| Err(Arc::new(DbError::Unexpected("the shared ack write was dropped".into()))))
    }

    /// One shared write: every request's items in one batch, answered
    /// request by request.
    async fn write(&self, mut batch: Vec<Request>) {
        for r in &batch {
            crate::metrics::stage(crate::metrics::ACK_STAGE, "share", r.queued);
        }
        if batch.len() == 1 {
            let r = batch.pop().expect("one request");
            let _ = r.reply.send(self.ack_now(&r.items, false).await.map_err(Arc::new));
            return;
        }
        metrics::counter!(crate::metrics::ACK_SHARED_REQUESTS).increment(batch.len() as u64);
        let mut all = Vec::with_capacity(batch.iter().map(|r| r.items.len()).sum());
        let mut spans: Vec<Range<usize>> = Vec::with_capacity(batch.len());
        for r in &mut batch {
            let start = all.len();
            all.append(&mut r.items);
            spans.push(start..all.len());
        }
        match self.ack_now(&all, true).await {
            Ok((outcomes, released)) => {
                for (r, done) in batch.into_iter().zip(split(&all, &spans, outcomes, released)) {
                    let _ = r.reply.send(Ok(done));
                }
            }
            Err(e) if e.met_by_all() => {
                let e = Arc::new(e);
                for r in batch {
                    let _ = r.reply.send(Err(e.clone()));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, requests = batch.len(), "a shared ack write failed; applying its requests one by one");
                for (r, span) in batch.into_iter().zip(spans) {
                    let _ = r.reply.send(self.ack_now(&all[span], false).await.map_err(Arc::new));
                }
            }
        }
    }
}

/// The outcomes of a shared write, back to the requests they belong to: each
/// request's own, indexed within it, and the released leases of the
/// partitions and leases it named (a lease two requests named goes to the
/// first, so a queue is woken once).
fn split(all: &[AckItem], spans: &[Range<usize>], outcomes: Vec<AckOutcome>, released: Vec<Released>) -> Vec<Done> {
    let mut done: Vec<Done> = spans.iter().map(|s| (Vec::with_capacity(s.len()), Vec::new())).collect();
    let mut outcomes = outcomes.into_iter();
    for (k, span) in spans.iter().enumerate() {
        for o in outcomes.by_ref().take(span.len()) {
            done[k].0.push(AckOutcome { index: o.index - span.start, ..o });
        }
    }
    if released.is_empty() {
        return done;
    }
    // Which request first named each (partition, lease): one pass over the
    // items (looking each release up among all of them parsed every
    // partition id once per release, 2 % of the broker's CPU in a drain of
    // 100,000 partitions).
    let mut first: HashMap<(i64, &str), usize> = HashMap::with_capacity(released.len());
    for (k, span) in spans.iter().enumerate() {
        for i in &all[span.clone()] {
            if let Ok(pid) = i.partition_id.trim().parse::<i64>() {
                first.entry((pid, i.lease_id.as_deref().unwrap_or_default())).or_insert(k);
            }
        }
    }
    for rel in released {
        let k = first.get(&(rel.partition_id, rel.lease_id.as_str())).copied().unwrap_or(0);
        done[k].1.push(rel);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ack::AckStatus;

    fn item(txn: &str, pid: &str, lease: &str) -> AckItem {
        AckItem {
            transaction_id: txn.into(),
            partition_id: pid.into(),
            status: AckStatus::Completed,
            error: None,
            lease_id: Some(lease.into()),
            group: "g".into(),
        }
    }

    fn outcome(index: usize, txn: &str) -> AckOutcome {
        AckOutcome {
            index,
            transaction_id: txn.into(),
            success: true,
            error: None,
            lease_released: false,
            dlq: false,
            noop: false,
            queue: None,
        }
    }

    #[test]
    fn outcomes_and_releases_go_back_to_their_own_request() {
        let all = vec![item("a", "1", "L1"), item("b", "2", "L2"), item("c", "2", "L2"), item("d", "3", "L3")];
        let spans = vec![0..1, 1..3, 3..4];
        let outcomes = all.iter().enumerate().map(|(i, it)| outcome(i, &it.transaction_id)).collect();
        let released = vec![
            Released { lease_id: "L3".into(), partition_id: 3, queue: None },
            Released { lease_id: "L2".into(), partition_id: 2, queue: None },
        ];
        let done = split(&all, &spans, outcomes, released);
        let ids = |d: &Done| d.0.iter().map(|o| (o.index, o.transaction_id.clone())).collect::<Vec<_>>();
        assert_eq!(ids(&done[0]), vec![(0, "a".to_string())]);
        assert_eq!(ids(&done[1]), vec![(0, "b".to_string()), (1, "c".to_string())]);
        assert_eq!(ids(&done[2]), vec![(0, "d".to_string())]);
        assert!(done[0].1.is_empty());
        assert_eq!(done[1].1.iter().map(|r| r.partition_id).collect::<Vec<_>>(), vec![2]);
        assert_eq!(done[2].1.iter().map(|r| r.partition_id).collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn a_release_two_requests_named_goes_to_the_first_and_an_unnamed_one_to_request_zero() {
        let all = vec![item("a", "1", "L1"), item("b", " 2", "L2"), item("c", "2", "L2"), item("d", "2", "L9")];
        let spans = vec![0..1, 1..2, 2..4];
        let outcomes = all.iter().enumerate().map(|(i, it)| outcome(i, &it.transaction_id)).collect();
        let released = vec![
            Released { lease_id: "L2".into(), partition_id: 2, queue: None },
            Released { lease_id: "L9".into(), partition_id: 2, queue: None },
            Released { lease_id: "L7".into(), partition_id: 7, queue: None },
        ];
        let done = split(&all, &spans, outcomes, released);
        let leases = |d: &Done| d.1.iter().map(|r| r.lease_id.clone()).collect::<Vec<_>>();
        assert_eq!(leases(&done[0]), vec!["L7".to_string()], "named by no request: the first");
        assert_eq!(leases(&done[1]), vec!["L2".to_string()], "named by requests 1 and 2: request 1");
        assert_eq!(leases(&done[2]), vec!["L9".to_string()]);
    }
}
