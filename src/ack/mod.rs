//! The commit path: an ack is an offset commit (API.md §2.3).
//!
//! Each transactionId is resolved to its offset (the registry a leased pop
//! filled, then the transaction index, then the segments around the group's
//! cursor: a queue without a dedup window keeps no index), acks are grouped by
//! (partition, lease), and each group is applied by one call to `queen.ack_v2`,
//! where the lease check, implicit acks, clamping, the retry budget and the
//! DLQ live; only the plain groups (a live lease, every item completed) are
//! applied together by `queen.ack_completed_many_v1`, which implements that
//! one case of the rules.
//!
//! The fence (issue 25, docs/DECISIONS.md): an ack that names a lease moves a
//! cursor only while that lease is the partition's live lease for its group.
//! Both statements test it under the cursor row's lock, and nothing in the
//! broker (the registry included) ever decides it: the registry only
//! resolves offsets. [`Fence`] says what a lease that is not live means for
//! an ack below the cursor.
//! The broker's part beyond resolution is the DLQ snapshot: only it can
//! decode the head message out of its segment.

mod share;
pub mod transaction;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::db::DbError;
use crate::log::{decompress_frames, FrameReader, SEGMENT_LIMIT};
use crate::log::legacy_index_hash;
use crate::pop::claim::{ClaimResult, ClaimedPartition, SegmentSlice};
use crate::pop::frames::Decoded;
use crate::pop::handover::{Handover, Waiter};
use crate::registry::{self, AckRegistry};

/// What an ack says about its message, normalized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    Completed,
    Failed,
    Retry,
    Dlq,
}

impl AckStatus {
    /// Absent → completed; completed/success/acked/ok → completed; retry;
    /// dlq; anything else → failed.
    pub fn normalize(status: Option<&str>) -> AckStatus {
        let Some(s) = status.map(str::trim) else { return AckStatus::Completed };
        let is = |word: &str| s.eq_ignore_ascii_case(word);
        if s.is_empty() || is("completed") || is("success") || is("acked") || is("ok") {
            AckStatus::Completed
        } else if is("retry") {
            AckStatus::Retry
        } else if is("dlq") {
            AckStatus::Dlq
        } else {
            AckStatus::Failed
        }
    }

    fn as_sql(self) -> &'static str {
        match self {
            AckStatus::Completed => "completed",
            AckStatus::Failed => "failed",
            AckStatus::Retry => "retry",
            AckStatus::Dlq => "dlq",
        }
    }
}

/// One acknowledgement as received.
#[derive(Debug, Clone)]
pub struct AckItem {
    pub transaction_id: String,
    pub partition_id: String,
    pub status: AckStatus,
    pub error: Option<String>,
    pub lease_id: Option<String>,
    pub group: String,
}

/// How strictly an ack's lease is checked against a message the cursor has
/// already passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Plain acks (`/ack`, `/ack/batch`): a completed ack below the cursor is
    /// an idempotent retry, `success:true, noop:true`, whatever its lease.
    BelowCursorIsNoop,
    /// Transactions: every ack proves its lease is live, also below the
    /// cursor, so that a zombie's bundle cannot commit its pushes.
    Always,
}

/// The answer for one acknowledgement.
#[derive(Debug, Clone, PartialEq)]
pub struct AckOutcome {
    pub index: usize,
    pub transaction_id: String,
    pub success: bool,
    pub error: Option<String>,
    pub lease_released: bool,
    pub dlq: bool,
    pub noop: bool,
    /// The queue of the acknowledged message, when it resolved to one.
    pub queue: Option<String>,
}

/// A lease released by an ack: the partition may have something to redeliver.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Released {
    pub lease_id: String,
    pub partition_id: i64,
    pub queue: Option<String>,
}

pub const UNRESOLVABLE: &str =
    "unresolvable: transaction not in the ack window (hash purged or never pushed); if leased, the message redelivers";

const ACK_SQL: &str = "SELECT * FROM queen.ack_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";
const INDEX_SQL: &str =
    "SELECT txn_hash, msg_offset FROM queen.txn_index WHERE partition_id = $1 AND txn_hash = ANY ($2)";
/// What neither the registry nor the index resolves is looked for in the
/// segments around the group's cursor (`queen.ack_span_v1`): this many
/// offsets below it and past it (or up to the leased batch's end).
const SPAN_SLACK: i32 = 1_000;
/// How often a multi-partition ack transaction is tried when PostgreSQL
/// breaks a deadlock by aborting it (nothing of it was applied).
const DEADLOCK_ATTEMPTS: u32 = 3;
/// Plain groups go here even one at a time: ack_v2 walks its items in
/// PL/pgSQL and answers a row each (1.26 ms of PostgreSQL for one partition's
/// 500 acks, docs/PERFORMANCE.md, stop 13), where this is one update per group.
/// With the lease handover's arrays (migration 0028, `pop::handover`).
const PLAIN_SQL: &str = "SELECT * FROM queen.ack_completed_many_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
const SPAN_SQL: &str = "SELECT o_base_offset, o_blob FROM queen.ack_span_v1($1, $2, $3)";
const SEGMENT_SQL: &str = "SELECT base_offset, created_at, blob FROM queen.segments
     WHERE partition_id = $1 AND base_offset <= $2 ORDER BY base_offset DESC LIMIT 1";

/// The acks of one (partition, group, lease), their offsets resolved:
/// one `ack_v2` call's worth.
struct AckGroup {
    pid: i64,
    group: String,
    lease: String,
    /// Indexes into the request's items, in request order.
    idxs: Vec<usize>,
    offsets: Vec<Option<i64>>,
    /// The queue, when the ack registry knew the batch.
    queue: Option<std::sync::Arc<str>>,
}

/// The head message of a dead-lettering ack, decoded from its segment.
#[derive(Debug, Default)]
struct Snapshot {
    offset: Option<i64>,
    message_id: Option<Uuid>,
    transaction_id: Option<String>,
    trace_id: Option<Uuid>,
    producer_sub: Option<String>,
    payload: Option<String>,
    /// The payload's envelope when the message is encrypted: a dead letter
    /// keeps it sealed, and `payload` is then None.
    sealed: Option<Vec<u8>>,
    created_at: Option<DateTime<Utc>>,
}

/// The commit side of the broker. Cheap to clone: a shared write runs on
/// its own task with a clone (`share`).
#[derive(Clone)]
pub struct AckService {
    pool: Pool,
    pub registry: Arc<AckRegistry>,
    share: Arc<crate::db::share::Share<share::Request>>,
    /// Parked pops an ack that ends a lease may hand the partition to.
    handover: Arc<Handover>,
}

/// A claim an ack made for a parked pop, delivered after the commit.
struct Handed {
    waiter: Waiter,
    queue: String,
    group: String,
    pid: i64,
    claimed: ClaimResult,
}

impl AckService {
    /// `writers`: most shared ack writes in flight (`QUEEN_ACK_GROUP_WRITERS`).
    pub fn new(pool: Pool, registry: Arc<AckRegistry>, writers: usize, handover: Arc<Handover>) -> AckService {
        AckService { pool, registry, share: Arc::new(crate::db::share::Share::new(writers, share::MAX_ITEMS)), handover }
    }

    /// Applies acknowledgements now, on a connection of its own (requests
    /// come here through [`AckService::ack`], which puts concurrent ones
    /// together); outcomes come back in item order, plus the leases the
    /// acks released.
    ///
    /// Acks of several partitions commit together, in one statement or one
    /// transaction: each `ack_v2` call on its own was one commit, one WAL
    /// flush, so a batch over 50 partitions cost 50 flushes in a row
    /// (docs/PERFORMANCE.md, 100,000 partitions). The cursor rows are locked in partition order (see
    /// `ack_on`) and pops skip locked rows, so concurrent batches queue rather
    /// than deadlock; a deadlock with another kind of writer is retried.
    ///
    /// A batch whose items are all `completed` and carry their lease needs
    /// no transaction, whether it is one request's or several requests'
    /// (`together`, `ack::share`): its groups are plain, one statement per
    /// consumer group (atomic on its own, one commit), and should a later
    /// statement fail (the `ack_v2` of a group the plain one left, a lease
    /// that expired), sending the request again finds the committed part
    /// below the cursor and answers it `noop`, a success. Without the
    /// transaction a one-request ack of 20 partitions (a pop of 100 over
    /// partitions of 5 messages) saves its BEGIN and COMMIT round trips:
    /// 0.25–0.45 ms of its 3 ms at 100,000 partitions (docs/PERFORMANCE.md).
    /// Acks without a lease go through `ack_v2` one group at a time, so they
    /// keep the transaction that makes them one commit. One request's acks
    /// of one partition need none either (each statement is all-or-nothing
    /// for its group, and a request's groups are independent). Otherwise (a
    /// nack among acks of several partitions) a nack changes state that a
    /// retry would not find again (a released lease), so the batch takes one
    /// transaction and a failure applies nothing. A deadlock is retried
    /// either way.
    async fn ack_now(&self, items: &[AckItem], together: bool) -> Result<(Vec<AckOutcome>, Vec<Released>), DbError> {
        let mut client = crate::metrics::timed(crate::metrics::ACK_STAGE, "pool", self.pool.get()).await?;
        let since = std::time::Instant::now();
        let first = items.first().map(|i| i.partition_id.as_str());
        let bare = items.iter().all(|i| i.status == AckStatus::Completed && i.lease_id.as_deref().is_some_and(|l| !l.is_empty()))
            || (!together && items.iter().all(|i| Some(i.partition_id.as_str()) == first));
        let mut attempt = 1;
        loop {
            let done = if bare {
                // Every statement commits on its own here: a claim an ack
                // made for a parked pop is durable when the call returns.
                let mut handed = Vec::new();
                let done = self.ack_with(&client, items, Fence::BelowCursorIsNoop, Some(&mut handed)).await;
                self.deliver(handed);
                done
            } else {
                let tx = client.transaction().await?;
                match self.ack_on(&tx, items, Fence::BelowCursorIsNoop).await {
                    Ok(done) => tx.commit().await.map(|()| done).map_err(DbError::from),
                    Err(e) => Err(e),
                }
            };
            match done {
                Err(DbError::Pg(e)) if attempt < DEADLOCK_ATTEMPTS && e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) => {
                    attempt += 1;
                }
                other => {
                    crate::metrics::stage(crate::metrics::ACK_STAGE, "write", since);
                    return other;
                }
            }
        }
    }

    /// The same on a caller's connection (transactions run it inside theirs,
    /// with [`Fence::Always`]).
    pub async fn ack_on(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        items: &[AckItem],
        fence: Fence,
    ) -> Result<(Vec<AckOutcome>, Vec<Released>), DbError> {
        self.ack_with(client, items, fence, None).await
    }

    /// Gives each handed claim to its pop; a pop that is gone gets its lease
    /// returned at once, so the messages wait for no lease time.
    fn deliver(&self, handed: Vec<Handed>) {
        for Handed { waiter, queue, group, pid, claimed } in handed {
            let lease = waiter.lease_id.clone();
            if waiter.deliver(claimed).is_ok() {
                metrics::counter!(crate::metrics::POP_HANDOVERS).increment(1);
                continue;
            }
            self.handover.return_lease(&self.pool, queue, group, pid, lease);
        }
    }

    /// [`AckService::ack_on`], handing partitions to parked pops when
    /// `hand` collects the claims (only where each statement commits on its
    /// own: the caller delivers them after the commit).
    async fn ack_with(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        items: &[AckItem],
        fence: Fence,
        hand: Option<&mut Vec<Handed>>,
    ) -> Result<(Vec<AckOutcome>, Vec<Released>), DbError> {
        let mut outcomes: Vec<Option<AckOutcome>> = vec![None; items.len()];
        let mut released = Vec::new();
        // Group by (partition, group, lease), keeping request order inside
        // (a batch's acks come partition by partition, see push::Slots).
        let mut groups: Vec<((i64, String, String), Vec<usize>)> = Vec::new();
        let mut slots = crate::push::Slots::default();
        for (i, item) in items.iter().enumerate() {
            let Ok(pid) = item.partition_id.trim().parse::<i64>() else {
                outcomes[i] = Some(failure(i, item, UNRESOLVABLE));
                continue;
            };
            let lease = item.lease_id.as_deref().unwrap_or_default();
            let g = slots.slot((pid, item.group.as_str(), lease), || {
                groups.push(((pid, item.group.clone(), lease.to_string()), Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i);
        }
        // Partition order is the lock order of cursor rows (stable: a
        // partition's groups keep request order).
        groups.sort_by_key(|((pid, _, _), _)| *pid);
        let mut resolved = Vec::with_capacity(groups.len());
        for ((pid, group, lease), idxs) in groups {
            let (offsets, queue) = self.resolve(client, pid, &group, &lease, &idxs, items).await?;
            resolved.push(AckGroup { pid, group, lease, idxs, offsets, queue });
        }
        // Plain groups commit in one statement; every other group (and a
        // plain one it did not apply) goes through ack_v2, all at once:
        // pipelined on the connection, sent in partition order, one round
        // trip instead of one per partition.
        let mut plain = self.apply_plain(client, &resolved, items, hand).await?;
        let full: Vec<&AckGroup> =
            resolved.iter().enumerate().filter(|(k, _)| !plain.contains_key(k)).map(|(_, g)| g).collect();
        metrics::counter!(crate::metrics::ACK_GROUPS, "path" => "bulk").increment(plain.len() as u64);
        metrics::counter!(crate::metrics::ACK_GROUPS, "path" => "each").increment(full.len() as u64);
        let mut applied =
            futures_util::future::try_join_all(full.into_iter().map(|g| self.apply(client, g, items, fence))).await?.into_iter();
        for (k, AckGroup { pid, lease, idxs, .. }) in resolved.into_iter().enumerate() {
            let mut handed = false;
            let (lease_released, queue) = match plain.remove(&k) {
                Some((lease_released, queue, to_pop)) => {
                    handed = to_pop;
                    for &i in &idxs {
                        let o = AckOutcome {
                            index: i,
                            transaction_id: items[i].transaction_id.clone(),
                            success: true,
                            error: None,
                            lease_released,
                            dlq: false,
                            noop: false,
                            queue: queue.clone(),
                        };
                        outcomes[i] = Some(o);
                    }
                    (lease_released, queue)
                }
                None => {
                    let rows = applied.next().expect("one ack_v2 answer per group not applied in bulk");
                    let (mut lease_released, mut queue) = (false, None::<String>);
                    for row in rows {
                        let i = idxs[row.get::<_, i32>("o_index") as usize];
                        let o = AckOutcome {
                            index: i,
                            transaction_id: items[i].transaction_id.clone(),
                            success: row.get("o_success"),
                            error: row.get("o_error"),
                            lease_released: row.get("o_lease_released"),
                            dlq: row.get("o_dlq"),
                            noop: row.get("o_noop"),
                            queue: row.get("o_queue"),
                        };
                        lease_released |= o.lease_released;
                        if queue.is_none() {
                            queue = o.queue.clone();
                        }
                        outcomes[i] = Some(o);
                    }
                    (lease_released, queue)
                }
            };
            if lease_released {
                // The lease this group named, or whichever the row held.
                if !lease.is_empty() {
                    self.registry.release(&lease, pid);
                }
                // A partition handed to a parked pop has nothing for the
                // others: waking them would only send them to find it busy.
                if !handed {
                    released.push(Released { lease_id: lease, partition_id: pid, queue });
                }
            }
        }
        Ok((outcomes.into_iter().map(|o| o.expect("every ack has an outcome")).collect(), released))
    }

    /// The plain groups (a lease, every item completed and resolved) of a
    /// batch, applied by one
    /// `queen.ack_completed_many_v1` call per consumer group: by index into
    /// `groups`, whether the lease was released and the queue. Groups the
    /// call leaves out were not touched (ack_v2 answers them). `groups` is
    /// in partition order and so are the call's arrays: the call locks the
    /// cursor rows in the order it is given them (0004_ack.sql). The queue
    /// names the registry knew spare the call a lookup per group.
    ///
    /// With `hand`, each group whose queue has a pop parked here takes one
    /// (`pop::handover`) and the call may lease the partition's next
    /// messages to it in the same update; the claims go to `hand`, the pops
    /// it did not use back to their place. The third value says a group's
    /// partition was handed over.
    async fn apply_plain(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        groups: &[AckGroup],
        items: &[AckItem],
        mut hand: Option<&mut Vec<Handed>>,
    ) -> Result<HashMap<usize, (bool, Option<String>, bool)>, DbError> {
        let mut by_group: HashMap<&str, Vec<usize>> = HashMap::new();
        for (k, g) in groups.iter().enumerate() {
            let plain = !g.lease.is_empty()
                && g.idxs.iter().all(|&i| items[i].status == AckStatus::Completed)
                && g.offsets.iter().all(Option::is_some);
            if plain {
                by_group.entry(g.group.as_str()).or_default().push(k);
            }
        }
        let mut done = HashMap::new();
        for (group, ks) in by_group {
            let pids: Vec<i64> = ks.iter().map(|&k| groups[k].pid).collect();
            let leases: Vec<&str> = ks.iter().map(|&k| groups[k].lease.as_str()).collect();
            let span = |k: usize| {
                let offsets = groups[k].offsets.iter().flatten();
                (offsets.clone().min().copied().unwrap_or(-1), offsets.max().copied().unwrap_or(-1))
            };
            let (lows, highs): (Vec<i64>, Vec<i64>) = ks.iter().map(|&k| span(k)).unzip();
            let queues: Vec<Option<&str>> = ks.iter().map(|&k| groups[k].queue.as_deref()).collect();
            let mut waiters: Vec<Option<Waiter>> = ks
                .iter()
                .map(|&k| match (&hand, groups[k].queue.as_deref()) {
                    (Some(_), Some(queue)) => self.handover.take(queue, group),
                    _ => None,
                })
                .collect();
            let next_leases: Vec<Option<&str>> = waiters.iter().map(|w| w.as_ref().map(|w| w.lease_id.as_str())).collect();
            let next_seconds: Vec<i32> = waiters.iter().map(|w| w.as_ref().map_or(0, |w| w.lease_seconds)).collect();
            let next_batch: Vec<i32> = waiters.iter().map(|w| w.as_ref().map_or(0, |w| w.batch)).collect();
            // The segment of the next message, when this broker holds it
            // decompressed: PostgreSQL need not ship it.
            let cached: Vec<Option<(i64, Arc<Decoded>)>> = waiters
                .iter()
                .zip(&pids)
                .zip(&highs)
                .map(|((w, &pid), &hi)| w.as_ref().filter(|w| !w.ships_blobs).and_then(|_| self.handover.frames.covering(pid, hi + 1)))
                .collect();
            let cached_base: Vec<Option<i64>> = cached.iter().map(|c| c.as_ref().map(|(base, _)| *base)).collect();
            let stmt = client.prepare_cached(PLAIN_SQL).await?;
            let args: [&(dyn ToSql + Sync); 10] =
                [&group, &pids, &leases, &lows, &highs, &queues, &next_leases, &next_seconds, &next_batch, &cached_base];
            let rows = client.query(&stmt, &args).await?;
            drop(next_leases);
            for row in rows {
                let ord = row.get::<_, i32>(0) as usize;
                let i = ord.wrapping_sub(1);
                let k = *ks
                    .get(i)
                    .ok_or_else(|| DbError::Unexpected("ack_completed_many_v2 named a group it was not given".into()))?;
                let queue: Option<String> = row.get(2);
                let first: Option<i64> = row.get(3);
                let to_pop = match (first, waiters[i].take(), hand.as_deref_mut(), queue.as_ref()) {
                    (Some(first), Some(waiter), Some(hand), Some(q)) => {
                        let base: i64 = row.get(6);
                        let blob: Option<Vec<u8>> = row.get(9);
                        let decoded = match (&blob, &cached[i]) {
                            (None, Some((b, d))) if *b == base => Some(d.clone()),
                            _ => None,
                        };
                        let segment = SegmentSlice {
                            base_offset: base,
                            start_idx: (first - base) as usize,
                            take: (row.get::<_, i64>(4) - first + 1) as usize,
                            msg_count: row.get::<_, i32>(7) as usize,
                            created_at: row.get(8),
                            blob: blob.unwrap_or_default(),
                            decoded,
                        };
                        let claimed = ClaimedPartition {
                            partition_id: groups[k].pid,
                            partition: row.get(5),
                            queue: q.clone(),
                            first,
                            last: row.get(4),
                            attempt: 1,
                            tail: None,
                            segments: vec![segment],
                        };
                        let claimed = ClaimResult { claimed: vec![claimed], ..ClaimResult::default() };
                        hand.push(Handed { waiter, queue: q.clone(), group: group.to_string(), pid: groups[k].pid, claimed });
                        true
                    }
                    (_, waiter, _, _) => {
                        if let (Some(w), Some(q)) = (waiter, groups[k].queue.as_deref()) {
                            self.handover.put_back(q, group, w);
                        }
                        false
                    }
                };
                done.insert(k, (row.get(1), queue, to_pop));
            }
            // Pops whose group the call left out (ack_v2 answers it) go back too.
            for (i, w) in waiters.into_iter().enumerate().rev() {
                if let (Some(w), Some(q)) = (w, groups[ks[i]].queue.as_deref()) {
                    self.handover.put_back(q, group, w);
                }
            }
        }
        Ok(done)
    }

    /// One `ack_v2` call for a group, again with the head message's snapshot
    /// when the call asks for one (a dead-lettering ack).
    async fn apply(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        g: &AckGroup,
        items: &[AckItem],
        fence: Fence,
    ) -> Result<Vec<tokio_postgres::Row>, DbError> {
        let statuses: Vec<&str> = g.idxs.iter().map(|&i| items[i].status.as_sql()).collect();
        let errors: Vec<Option<&str>> = g.idxs.iter().map(|&i| items[i].error.as_deref()).collect();
        let lease_arg: Option<&str> = (!g.lease.is_empty()).then_some(g.lease.as_str());
        let fenced = fence == Fence::Always;
        let mut snapshot = Snapshot::default();
        loop {
            let s = &snapshot;
            let args: [&(dyn ToSql + Sync); 15] = [
                &g.pid, &g.group, &lease_arg, &g.offsets, &statuses, &errors, &s.offset, &s.message_id,
                &s.transaction_id, &s.trace_id, &s.producer_sub, &s.payload, &s.sealed, &s.created_at, &fenced,
            ];
            let stmt = client.prepare_cached(ACK_SQL).await?;
            let rows = client.query(&stmt, &args).await?;
            let wants = rows.first().filter(|r| r.get::<_, i32>("o_index") == -1).map(|r| r.get::<_, i64>("o_committed"));
            match wants {
                Some(head) if snapshot.offset != Some(head) => snapshot = self.snapshot(client, g.pid, head).await?,
                Some(_) => return Err(DbError::Unexpected("ack_v2 asked twice for the same snapshot".into())),
                None => return Ok(rows),
            }
        }
    }

    /// Offsets of the group's transactionIds: the registry first, then one
    /// query of the transaction index, then the segments around the cursor.
    async fn resolve(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        pid: i64,
        group: &str,
        lease: &str,
        idxs: &[usize],
        items: &[AckItem],
    ) -> Result<(Vec<Option<i64>>, Option<std::sync::Arc<str>>), DbError> {
        let registry::Known { mut offsets, queue } =
            self.registry.resolve_many(lease, pid, idxs.iter().map(|&i| items[i].transaction_id.as_str()));
        let missing: Vec<i64> =
            idxs.iter().zip(&offsets).filter(|(_, o)| o.is_none()).map(|(&i, _)| legacy_index_hash(&items[i].transaction_id)).collect();
        if !missing.is_empty() {
            let stmt = client.prepare_cached(INDEX_SQL).await?;
            let found: HashMap<i64, i64> =
                client.query(&stmt, &[&pid, &missing]).await?.iter().map(|r| (r.get(0), r.get(1))).collect();
            for (k, &i) in idxs.iter().enumerate() {
                if offsets[k].is_none() {
                    offsets[k] = found.get(&legacy_index_hash(&items[i].transaction_id)).copied();
                }
            }
        }
        if offsets.iter().any(Option::is_none) {
            let unresolved = idxs.iter().zip(&offsets).filter(|(_, o)| o.is_none()).map(|(&i, _)| items[i].transaction_id.as_str());
            let found = self.resolve_in_span(client, pid, group, unresolved).await?;
            for (k, &i) in idxs.iter().enumerate() {
                if offsets[k].is_none() {
                    offsets[k] = found.get(items[i].transaction_id.as_str()).copied();
                }
            }
        }
        Ok((offsets, queue))
    }

    /// Offsets of `txns` among the segments around `group`'s cursor on `pid`
    /// (exact transactionIds, not hashes). A transactionId pushed twice (a
    /// queue without window) resolves to its latest offset, as the index did.
    async fn resolve_in_span<'a>(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        pid: i64,
        group: &str,
        txns: impl Iterator<Item = &'a str>,
    ) -> Result<HashMap<&'a str, i64>, DbError> {
        let wanted: std::collections::HashSet<&str> = txns.collect();
        let mut found: HashMap<&str, i64> = HashMap::new();
        let stmt = client.prepare_cached(SPAN_SQL).await?;
        for row in client.query(&stmt, &[&pid, &group, &SPAN_SLACK]).await? {
            let base: i64 = row.get(0);
            let Ok(frames) = decompress_frames(row.get::<_, &[u8]>(1), SEGMENT_LIMIT) else { continue };
            for (k, frame) in FrameReader::new(&frames).enumerate() {
                let Ok(frame) = frame else { break };
                if let Some(&txn) = wanted.get(frame.transaction_id) {
                    found.insert(txn, base + k as i64);
                }
            }
        }
        Ok(found)
    }

    async fn snapshot(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        pid: i64,
        offset: i64,
    ) -> Result<Snapshot, DbError> {
        let stmt = client.prepare_cached(SEGMENT_SQL).await?;
        let mut snap = Snapshot { offset: Some(offset), message_id: Some(Uuid::nil()), ..Snapshot::default() };
        if let Some(row) = client.query_opt(&stmt, &[&pid, &offset]).await? {
            let base: i64 = row.get(0);
            snap.created_at = Some(row.get(1));
            let blob: &[u8] = row.get(2);
            if let Ok(frames) = decompress_frames(blob, SEGMENT_LIMIT) {
                if let Some(Ok(f)) = FrameReader::new(&frames).nth((offset - base) as usize) {
                    snap.message_id = Some(f.message_id);
                    snap.transaction_id = Some(f.transaction_id.to_string());
                    snap.trace_id = f.trace_id;
                    snap.producer_sub = f.producer_sub.map(str::to_string);
                    if f.encrypted {
                        snap.sealed = Some(f.payload.to_vec());
                    } else {
                        snap.payload = Some(String::from_utf8_lossy(f.payload_json()).into_owned());
                    }
                }
            }
        }
        snap.created_at.get_or_insert_with(Utc::now);
        snap.transaction_id.get_or_insert_with(String::new);
        Ok(snap)
    }

    /// Renews every live lease of `lease_id` by `seconds` (never shortens,
    /// never revives): how many, and the earliest new expiry.
    pub async fn extend(&self, lease_id: &str, seconds: i32) -> Result<(i32, Option<DateTime<Utc>>), DbError> {
        self.extend_at(lease_id, seconds, self.registry.partitions_of(lease_id)).await
    }

    /// [`AckService::extend`] on `pids` only (None: wherever the lease is live).
    pub async fn extend_at(&self, lease_id: &str, seconds: i32, pids: Option<Vec<i64>>) -> Result<(i32, Option<DateTime<Utc>>), DbError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached("SELECT * FROM queen.lease_extend_v1($1, $2, $3)").await?;
        let row = client.query_one(&stmt, &[&lease_id, &seconds, &pids]).await?;
        Ok((row.get(0), row.get(1)))
    }

    /// The partitions where `lease_id` is live: this broker's record of the
    /// leases it gave, else the cursors that hold it.
    pub async fn lease_partitions(&self, lease_id: &str) -> Result<Vec<i64>, DbError> {
        if let Some(pids) = self.registry.partitions_of(lease_id) {
            return Ok(pids);
        }
        let client = self.pool.get().await?;
        let rows = client
            .query("SELECT DISTINCT partition_id FROM queen.consumers WHERE worker_id = $1 AND lease_expires_at > clock_timestamp()", &[&lease_id])
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

fn failure(index: usize, item: &AckItem, error: &str) -> AckOutcome {
    AckOutcome {
        index,
        transaction_id: item.transaction_id.clone(),
        success: false,
        error: Some(error.to_string()),
        lease_released: false,
        dlq: false,
        noop: false,
        queue: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_normalize_as_documented() {
        use AckStatus::*;
        for (s, want) in [
            (None, Completed),
            (Some("completed"), Completed),
            (Some("SUCCESS"), Completed),
            (Some("acked"), Completed),
            (Some("ok"), Completed),
            (Some("retry"), Retry),
            (Some("dlq"), Dlq),
            (Some("failed"), Failed),
            (Some("nope"), Failed),
            (Some(" Retry "), Retry),
            (Some("DLQ"), Dlq),
            (Some("  "), Completed),
            (Some("completedx"), Failed),
        ] {
            assert_eq!(AckStatus::normalize(s), want, "{s:?}");
        }
    }
}
