//! The pop path (seeds/life-of-a-pop.md): candidate selection, the claim in
//! PostgreSQL, rendering, and the long-poll wait.
//!
//! The ordering is deliberate. A hot-list pop first asks the in-memory ring
//! whether anything is believed pending, and answers empty without taking a
//! permit or a pooled connection when nothing is. Only real work takes a
//! permit (a semaphore that keeps pops from exhausting the pool) and a
//! connection, for exactly one round trip. A long-poll releases both before
//! it parks on the queue's wake gate.

pub mod claim;
pub mod cursor_seed;
pub mod frames;
pub mod handover;
pub mod hotlist;
pub mod min_wait;
pub mod params;
pub mod render;
pub mod reseeder;
pub mod settings;
pub mod share;
pub mod wake;
pub mod wheel;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::PopConfig;
use crate::db::limiter::{AdaptiveLimiter, LimitPermit};
use claim::ClaimResult;
use hotlist::{HotList, Plan, Seeding};
pub use params::{PopParams, Route, QUEUE_MODE};
use wake::WakeGates;

/// Claim permits at start: few, so the limiter's first windows measure
/// PostgreSQL unloaded; it grows from there when latency allows.
const INITIAL_PERMITS: usize = 8;
/// Fewest claim permits the limiter may leave.
const MIN_PERMITS: usize = 2;
/// How long a pop that found every ring candidate checked out waits for one
/// to come back (a claim's round trip, with room for a loaded machine), and
/// how many times it looks again.
const RETURN_WAIT: Duration = Duration::from_millis(50);
const RETURN_LOOKS: u32 = 3;
/// Claims one hot-list pop makes when its candidates keep turning out empty.
const STALE_LOOKS: u32 = 4;
/// How long a pop waits for another's first contact with its (queue, group)
/// (at 100,000 partitions about 0.5 s), and how many first contacts it
/// waits for or tries to lead before it claims through SQL by itself.
const FIRST_CONTACT_WAIT: Duration = Duration::from_secs(10);
const FIRST_CONTACT_LOOKS: u32 = 3;

/// Why a pop failed (an empty pop is not a failure).
#[derive(Debug, thiserror::Error)]
pub enum PopError {
    /// No permit or connection in time.
    #[error("pool")]
    Pool,
    /// The statement timed out and was cancelled server-side.
    #[error("pop failed")]
    Timeout,
    /// PostgreSQL is not there (`DbError::unavailable`): a retryable 503.
    #[error("pop: {0}")]
    Unavailable(crate::db::DbError),
    /// Any other database error: the seed answers 204 and discards the text
    /// (the log keeps the server's message).
    #[error("pop error: {}", crate::db::describe(.0))]
    Database(tokio_postgres::Error),
    #[error(transparent)]
    Corrupt(#[from] render::CorruptSegment),
    #[error(transparent)]
    Decrypt(#[from] render::DecryptFailed),
}

impl From<tokio_postgres::Error> for PopError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) {
            PopError::Timeout
        } else if crate::db::pg_unavailable(&e) {
            PopError::Unavailable(crate::db::DbError::from(e))
        } else {
            PopError::Database(e)
        }
    }
}

/// The pop side of the broker: shared by every pop request.
pub struct PopService {
    pool: Pool,
    cfg: PopConfig,
    pool_wait: Duration,
    pub hotlist: Arc<HotList>,
    pub wake: Arc<WakeGates>,
    /// Parked pops an ack may hand its partition to (`pop::handover`).
    pub handover: Arc<handover::Handover>,
    pub settings: Arc<settings::QueueSettings>,
    /// Revisits of partitions a visibility option hides (`pop::wheel`).
    pub wheel: Arc<wheel::Wheel>,
    registry: Arc<crate::registry::AckRegistry>,
    /// Opens encrypted payloads; with a key, framed pops answer JSON.
    encryption: Arc<crate::crypto::Encryption>,
    telemetry: Arc<crate::metrics::Telemetry>,
    /// Claims running at once; the limit follows PostgreSQL's latency.
    permits: Arc<AdaptiveLimiter>,
    /// Batch-1 claims that go to PostgreSQL together (`pop::share`); `None`
    /// with `QUEEN_POP_CLAIM_WRITERS=0`.
    claims: Option<Arc<share::ClaimShare>>,
    maintenance: AtomicBool,
    /// Flipped on shutdown: parked long-polls answer 204 at once.
    closing: tokio::sync::watch::Sender<bool>,
}

impl PopService {
    pub fn new(
        pool: Pool,
        cfg: PopConfig,
        pool_size: usize,
        pool_wait: Duration,
        registry: Arc<crate::registry::AckRegistry>,
        encryption: Arc<crate::crypto::Encryption>,
    ) -> Arc<PopService> {
        // At most three quarters of the pool (the rest is for pushes and
        // acks); where in between, PostgreSQL's latency decides.
        let permits = Arc::new(AdaptiveLimiter::new(
            INITIAL_PERMITS,
            MIN_PERMITS,
            (pool_size * 3 / 4).max(1),
            cfg.adaptive_permits,
        ));
        let wake = Arc::new(WakeGates::default());
        let handover = Arc::new(handover::Handover::new(wake.clone(), cfg.frame_cache_bytes));
        let claims = share::ClaimShare::new(pool.clone(), handover.clone(), permits.clone(), pool_wait, cfg.claim_writers);
        Arc::new(PopService {
            pool,
            hotlist: HotList::new(cfg.hotlist_reseed),
            cfg,
            pool_wait,
            handover,
            wake,
            settings: Arc::new(settings::QueueSettings::default()),
            wheel: Arc::new(wheel::Wheel::default()),
            registry,
            encryption,
            telemetry: crate::metrics::Telemetry::global(),
            permits,
            claims,
            maintenance: AtomicBool::new(false),
            closing: tokio::sync::watch::channel(false).0,
        })
    }

    /// Shutdown: every parked long-poll answers now instead of at its deadline.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// How many claims may run at once right now.
    pub fn permit_limit(&self) -> usize {
        self.permits.limit()
    }

    pub fn config(&self) -> &PopConfig {
        &self.cfg
    }

    /// Pop maintenance: while on, every pop answers empty at once.
    pub fn set_maintenance(&self, on: bool) {
        self.maintenance.store(on, Ordering::SeqCst);
        // No pop is answered with messages meanwhile, handed over included.
        self.handover.pause(on);
    }

    pub fn maintenance(&self) -> bool {
        self.maintenance.load(Ordering::SeqCst)
    }

    /// `count` messages committed to (queue, partition): feed the rings,
    /// mark the gate.
    pub fn pushed(&self, queue: &str, partition_id: i64, partition: &str, count: u64) {
        self.hotlist.pushed(queue, partition_id, partition, count);
        self.wake.pushed(queue);
        if let Some(t) = self.settings.get(queue) {
            if !t.delayed.is_zero() {
                self.wheel.delayed_push(queue, partition_id, partition, t.delayed);
            }
            if !t.window.is_zero() && self.cfg.hotlist {
                self.wheel.window_push(queue, partition_id, partition, t.window);
            }
        }
    }

    /// Starts the revisit wheel's task.
    pub fn spawn_wheel(&self, shutdown: tokio::sync::broadcast::Receiver<()>) {
        self.wheel.spawn(self.hotlist.clone(), self.wake.clone(), shutdown);
    }

    /// Serves one pop request: `Ok(None)` means answer 204; the bool says
    /// whether the body is `QPF1` frames rather than JSON.
    pub async fn pop(&self, route: &Route, p: &PopParams) -> Result<Option<(Vec<u8>, bool)>, PopError> {
        if self.maintenance() {
            return Ok(None);
        }
        let deadline = Instant::now() + if p.wait { p.timeout } else { Duration::ZERO };
        // One lease id per request, shared by every partition it claims.
        let lease_id = if p.auto_ack { String::new() } else { Uuid::now_v7().to_string() };
        let top_queue = match route {
            Route::Wildcard { queue } | Route::Specific { queue, .. } => queue.as_str(),
            Route::Discovery { .. } => "",
        };
        let gate = match route {
            Route::Discovery { .. } => self.wake.discovery(),
            Route::Wildcard { queue } | Route::Specific { queue, .. } => self.wake.queue(queue),
        };
        let mut attempt = 0u32;
        let mut closing = self.closing.subscribe();
        let mut held = false;
        // A claim an ack made for this pop while it was parked (`handover`).
        let mut handed: Option<ClaimResult> = None;
        // This pop's place in the handover line, kept across its re-checks
        // so that a re-check does not send it to the back.
        let mut ticket: Option<Box<handover::Ticket<'_>>> = None;
        let mut first = true;
        loop {
            if let (Route::Wildcard { queue }, false, None) = (route, held, &handed) {
                if p.wait && p.batch > 1 {
                    if let Some(window) = self.settings.min_pop_wait(queue) {
                        let pending = || self.pending(queue, &p.group, p.batch);
                        // Boxed, as the claim below: a parked pop should not carry it.
                        held = Box::pin(min_wait::hold_for_a_fuller_batch(&gate, p.batch, window, deadline, pending)).await;
                    }
                }
            }
            // Listen before looking, so a push between the look and the wait wakes us.
            let woken = gate.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Boxed: the claim path's state is most of this future's size,
            // and a parked pop (10,000 of them on an idle broker) should not
            // carry it while it sleeps.
            let (result, ring_idle) = match handed.take() {
                Some(claimed) => (claimed, false),
                // Pops of this group already wait here for an ack to hand
                // them a partition: a new one joins the line first (its
                // claim would find the partitions they found leased).
                None if first && self.joins_the_line(route, p) => (ClaimResult::default(), false),
                None => {
                    if !first && self.maintenance() {
                        // Pop maintenance began while this pop was parked.
                        return Box::pin(self.stop_waiting(&mut ticket, &lease_id, &p.group)).await;
                    }
                    let found = Box::pin(self.attempt(route, p, &lease_id)).await;
                    // A long-poll that found no claim slot or connection in
                    // time has not failed: the database is busy (a thousand
                    // groups woken by one push), not gone. It looks again on
                    // its re-check schedule until its own deadline, so
                    // overload shows as latency, not as 500s that send the
                    // clients into their error backoff.
                    let found = match found {
                        Err(PopError::Pool) if p.wait && Instant::now() < deadline => {
                            metrics::counter!(crate::metrics::POP_BUSY_LOOKS).increment(1);
                            Ok((ClaimResult::default(), false))
                        }
                        other => other,
                    };
                    let claimed_itself = found.as_ref().is_ok_and(|(r, _)| !r.claimed.is_empty()) || found.is_err();
                    if claimed_itself {
                        // Out of the line; an ack that took it meanwhile
                        // made a claim this pop cannot answer: returned.
                        if let Some(extra) = Box::pin(self.leave_line(&mut ticket)).await {
                            self.handover.return_claim(&self.pool, extra, &p.group, &lease_id);
                        }
                    }
                    found?
                }
            };
            first = false;
            for h in &result.hidden {
                self.wheel.deferred(&h.queue, h.partition_id, &h.partition, h.visible_at);
            }
            // A broker with an encryption key answers JSON even when frames
            // are asked for: a stored frame may carry an envelope, which the
            // client cannot open (API.md §3.4), and frames ship unopened.
            let ring = self.encryption.ring();
            if p.frames && ring.is_none() {
                // Frames skip decoding entirely, so the ack registry has
                // nothing to learn: acks resolve through the index.
                if let Some(body) = render::render_frames(&result.claimed, top_queue, &lease_id, p) {
                    self.count_delivery(&result);
                    return Ok(Some((body, true)));
                }
            } else if let Some(rendered) = match render::render(&result.claimed, top_queue, &lease_id, p, ring, &self.handover.frames) {
                Ok(r) => r,
                Err(e) => {
                    if let PopError::Decrypt(d) = &e {
                        tracing::warn!(partition_id = d.partition_id, offset = d.offset, error = %d.error,
                                       current_key = %ring.map(|r| r.current_id().to_string()).unwrap_or_else(|| "none".into()),
                                       "pop: an encrypted payload did not open; answering 500, nothing is committed");
                    }
                    if p.auto_ack {
                        // Boxed, like the claim: a parked pop should not carry it.
                        Box::pin(self.undo_auto_ack(&result.claimed, &p.group)).await;
                    }
                    return Err(e);
                }
            } {
                for b in rendered.batches {
                    self.registry.record(&lease_id, b.partition_id, b.queue, b.entries);
                }
                self.count_delivery(&result);
                return Ok(Some((rendered.body, false)));
            }
            let now = Instant::now();
            if now >= deadline || self.maintenance() || *closing.borrow() {
                if let Some(claimed) = Box::pin(self.leave_line(&mut ticket)).await {
                    // An ack handed it a claim as it was leaving: answer it.
                    handed = Some(claimed);
                    continue;
                }
                return Ok(None);
            }
            // A ring with nothing ready learns of local pushes through the gate
            // (listened to before looking, so none is missed) and of anything
            // else only at its reseed: re-checking sooner would find nothing, so
            // such a pop sleeps until the reseed instead of on the backoff.
            // With the background reseeder, the ring's reseed opens the gate
            // when it finds something: such a pop sleeps until its deadline.
            let pause = match (ring_idle, route) {
                (true, _) if self.hotlist.background() => deadline - now,
                (true, Route::Wildcard { queue }) => self.hotlist.until_reseed(queue, &p.group).max(self.cfg.wait_initial),
                _ => wake::backoff_interval(attempt, &self.cfg),
            }
            .min(deadline - now);
            // In the handover line before it counts as parked.
            if ticket.is_none() {
                ticket = self.handover_ticket(route, p, &lease_id);
            }
            let _parked = Parked::new(&self.telemetry);
            let answer = async {
                match ticket.as_mut() {
                    Some(t) => Some((&mut t.answer).await.ok()),
                    None => std::future::pending().await,
                }
            };
            let closed = tokio::select! {
                answered = answer => {
                    // Answered (a claim) or let go by an ack (none): either
                    // way its place in line is gone.
                    handed = answered.flatten();
                    ticket = None;
                    attempt = 0;
                    false
                }
                _ = &mut woken => {
                    attempt = 0;
                    false
                }
                _ = tokio::time::sleep(pause) => {
                    attempt += 1;
                    false
                }
                _ = closing.changed() => true,
            };
            if closed && handed.is_none() {
                return Box::pin(self.stop_waiting(&mut ticket, &lease_id, &p.group)).await;
            }
        }
    }

    /// Leaves the handover line: a claim an ack made for this pop as it
    /// left, if any.
    async fn leave_line(&self, ticket: &mut Option<Box<handover::Ticket<'_>>>) -> Option<ClaimResult> {
        match ticket.take() {
            Some(t) => (*t).leave().await,
            None => None,
        }
    }

    /// A parked pop that must answer empty now (shutdown, maintenance): a
    /// claim handed to it while it left is returned, not delivered.
    async fn stop_waiting(
        &self,
        ticket: &mut Option<Box<handover::Ticket<'_>>>,
        lease_id: &str,
        group: &str,
    ) -> Result<Option<(Vec<u8>, bool)>, PopError> {
        if let Some(extra) = self.leave_line(ticket).await {
            self.handover.return_claim(&self.pool, extra, group, lease_id);
        }
        Ok(None)
    }

    fn joins_the_line(&self, route: &Route, p: &PopParams) -> bool {
        match route {
            Route::Wildcard { queue } => self.handover_suits(queue, p) && self.handover.queued(queue, &p.group),
            _ => false,
        }
    }

    fn handover_suits(&self, queue: &str, p: &PopParams) -> bool {
        !p.auto_ack && p.wait && !self.settings.get(queue).is_some_and(|t| !t.window.is_zero() || !t.delayed.is_zero())
    }

    /// A place in the handover queue for a parked pop that an ack's claim
    /// would suit (`handover`): a leased wildcard pop of a queue whose
    /// messages no visibility option holds back.
    fn handover_ticket(&self, route: &Route, p: &PopParams, lease_id: &str) -> Option<Box<handover::Ticket<'_>>> {
        let Route::Wildcard { queue } = route else { return None };
        if !self.handover_suits(queue, p) {
            return None;
        }
        // A QPF1 answer ships the stored blobs; with an encryption key the
        // broker answers JSON instead (see `pop`).
        let ships_blobs = p.frames && self.encryption.ring().is_none();
        // Boxed: a parked pop's future stays small (the test below).
        Some(Box::new(self.handover.park(queue, &p.group, lease_id, p.lease_seconds.unwrap_or(0), p.batch, ships_blobs)))
    }

    /// An autoAck claim commits its cursors in PostgreSQL before the broker
    /// opens a segment; when the answer then fails (an envelope that does not
    /// open, a corrupt segment), nothing reached the client, so each cursor
    /// is put back where it was. Only if it still stands where the claim
    /// left it: a later pop of the same group that moved it on keeps its
    /// move, and those messages are gone for the group as with any autoAck.
    /// A leased claim needs none of this: its lease lapses.
    async fn undo_auto_ack(&self, claimed: &[claim::ClaimedPartition], group: &str) {
        let pids: Vec<i64> = claimed.iter().map(|c| c.partition_id).collect();
        let firsts: Vec<i64> = claimed.iter().map(|c| c.first).collect();
        let lasts: Vec<i64> = claimed.iter().map(|c| c.last).collect();
        let undo = async {
            let client = self.pool.get().await.map_err(|e| e.to_string())?;
            client
                .execute(
                    "UPDATE queen.consumers c
                     SET committed = u.first - 1, total_consumed = c.total_consumed - (u.last - u.first + 1)
                     FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS u (pid, first, last)
                     WHERE c.partition_id = u.pid AND c.consumer_group = $4 AND c.committed = u.last",
                    &[&pids, &firsts, &lasts, &group],
                )
                .await
                .map_err(|e| e.to_string())
        };
        match undo.await {
            Ok(n) => tracing::warn!(group, partitions = n, "autoAck pop failed after its claim; its cursors are put back"),
            Err(e) => tracing::error!(group, error = %e, "autoAck pop failed after its claim and its cursors could not be put back"),
        }
    }

    /// Counts delivered messages per queue and their delivery lag (age of
    /// their segment at delivery).
    fn count_delivery(&self, result: &ClaimResult) {
        let now = chrono::Utc::now();
        for c in &result.claimed {
            let n: usize = c.segments.iter().map(|s| s.take).sum();
            self.telemetry.popped(&c.queue, n as u64);
            for s in &c.segments {
                let lag = (now - s.created_at).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6;
                self.telemetry.delivered(lag, s.take);
            }
        }
    }

    /// How many messages `group` could claim from `queue`, counted up to
    /// `batch`: the ring's count when it has one, else PostgreSQL's (one
    /// statement on a pooled connection, no permit: it claims nothing).
    /// `None` when neither can say.
    async fn pending(&self, queue: &str, group: &str, batch: i32) -> Option<u64> {
        if self.cfg.hotlist {
            if let Some(n) = self.hotlist.estimate(queue, group) {
                return Some(n);
            }
        }
        let client = self.connection().await.ok()?;
        claim::pending_count(&client, queue, group, batch).await.ok()
    }

    /// Ready candidates across every ring (a gauge).
    pub fn hotlist_ready(&self) -> usize {
        self.hotlist.ready_total()
    }

    /// One look for work: at most one claim round trip. The flag says the
    /// answer came from a ring with nothing ready (no SQL at all).
    async fn attempt(&self, route: &Route, p: &PopParams, worker: &str) -> Result<(ClaimResult, bool), PopError> {
        if let Route::Wildcard { queue } = route {
            if self.cfg.hotlist {
                let (mut looks, mut contacts) = (0, 0);
                loop {
                    return match self.hotlist.plan(queue, &p.group, p.wait) {
                        Plan::NothingReady => {
                            looks += 1;
                            if looks <= RETURN_LOOKS && self.candidates_came_back(queue, &p.group).await {
                                continue;
                            }
                            Ok((ClaimResult::default(), true))
                        }
                        Plan::Claim { reseed } => Ok((self.claim_from_ring(queue, p, worker, reseed).await?, false)),
                        Plan::NoRing if contacts < FIRST_CONTACT_LOOKS => {
                            contacts += 1;
                            match self.hotlist.begin_seeding(queue, &p.group) {
                                Some(seeding) => Ok((self.first_contact(queue, p, worker, seeding).await?, false)),
                                None => continue,
                            }
                        }
                        Plan::Seeding if contacts < FIRST_CONTACT_LOOKS => {
                            contacts += 1;
                            if let Some(done) = self.hotlist.await_seeded(queue, &p.group) {
                                let _ = tokio::time::timeout(FIRST_CONTACT_WAIT, done).await;
                            }
                            continue;
                        }
                        // A first contact that keeps failing or taking too
                        // long: this pop claims through SQL by itself.
                        Plan::NoRing | Plan::Seeding => Ok((self.claim_sql(route, p, worker, false).await?, false)),
                    };
                }
            }
            return Ok((self.claim_sql(route, p, worker, true).await?, false));
        }
        Ok((self.claim_sql(route, p, worker, false).await?, false))
    }

    /// Nothing ready and every candidate checked out by pops in flight (four
    /// consumers of ten partitions met this on 30 % of their pops): what
    /// those leave comes back within a claim, so wait for it (or a push that
    /// adds one) instead of answering empty or parking while work is there.
    /// True when candidates came back in time.
    async fn candidates_came_back(&self, queue: &str, group: &str) -> bool {
        match self.hotlist.await_return(queue, group) {
            Some(back) => tokio::time::timeout(RETURN_WAIT, back).await.is_ok(),
            None => false,
        }
    }

    /// The first pop of (queue, group) on this broker, while the group's
    /// other pops wait for it (`Plan::Seeding`): one call registers the group
    /// and reads the ring's first seed (`first_contact_v2`; a new group
    /// reading everything gets one chunk of cursors and seed, and a task
    /// walks the rest: `pop::cursor_seed`); then the others are let in and
    /// this pop claims from the ring like them. Before, every consumer of a
    /// new group took the SQL path at once: each waited for the one seeding
    /// the cursors, then scanned every partition for candidates (114 ms each
    /// at 100,000 partitions), and the ring's first reseed scanned them all
    /// once more. Four consumers were all served after 0.53-0.60 s, now
    /// after 0.27-0.30 s; thirty-two after 1.6-1.8 s, now 0.39-0.43 s.
    async fn first_contact(&self, queue: &str, p: &PopParams, worker: &str, seeding: Seeding) -> Result<ClaimResult, PopError> {
        let _permit = self.permit().await?;
        let client = self.connection().await?;
        let chunk = self.cfg.cursor_seed_chunk;
        let (mut pending, mut rest) = claim::first_contact(&client, queue, p, chunk).await?;
        // A first chunk with fewer partitions holding messages than this pop
        // could take (their first partitions empty, or a small chunk): walk on
        // here until it has them, so the first pop does not answer short
        // while messages wait further on.
        let wanted = usize::try_from(if p.partitions > 0 { p.batch.min(p.partitions) } else { p.batch }).unwrap_or(1);
        while pending.len() < wanted {
            let Some(after) = rest.take() else { break };
            let (more, next) = claim::seed_cursors(&client, queue, &p.group, &after, chunk).await?;
            pending.extend(more);
            rest = next;
        }
        seeding.finish(pending);
        if let Some(after) = rest {
            self.spawn_cursor_seed(queue.to_string(), p.group.clone(), after);
        }
        self.claim_ring_on(&client, queue, p, worker).await
    }

    async fn claim_from_ring(&self, queue: &str, p: &PopParams, worker: &str, reseed: bool) -> Result<ClaimResult, PopError> {
        // A batch-1 pop queues for a shared claim, which takes the permit
        // and the connection for all of its pops (`pop::share`).
        if let Some(share) = self.claims.as_ref().filter(|_| !reseed && share::ClaimShare::takes(p) && !self.windowed(queue)) {
            return self.claim_ring_loop(Via::Share(share), queue, p, worker).await;
        }
        let _permit = self.permit().await?;
        let client = self.connection().await?;
        if reseed {
            let ring = [(queue.to_string(), p.group.clone())];
            let after = [self.hotlist.reseed_after(queue, &p.group)];
            if let Some(found) = claim::pending_partitions_window(&client, &ring, &after, self.cfg.hotlist_reseed_window).await?.pop() {
                self.hotlist.reseed_window(queue, &p.group, found);
            }
        }
        self.claim_ring_on(&client, queue, p, worker).await
    }

    /// Claims from the ring's candidates on a connection the caller holds
    /// (with a permit).
    async fn claim_ring_on(
        &self,
        client: &deadpool_postgres::Client,
        queue: &str,
        p: &PopParams,
        worker: &str,
    ) -> Result<ClaimResult, PopError> {
        if self.windowed(queue) {
            return self.claim_window_ring(client, queue, p, worker).await;
        }
        self.claim_ring_loop(Via::Client(client), queue, p, worker).await
    }

    /// The segments of `pids` this broker holds decompressed, which their
    /// claim need not ship: none for a pop that forwards stored blobs (`QPF1`
    /// frames without an encryption key), nor for a set-based claim, which
    /// ships every segment (`claim::of_one_partition`).
    fn held(&self, pids: &[i64], p: &PopParams, deep: bool) -> claim::Held {
        if (p.frames && self.encryption.ring().is_none()) || !claim::of_one_partition(deep, p, pids.len()) {
            return claim::Held::default();
        }
        claim::Held::of(&self.handover.frames, pids)
    }

    /// Whether `queue` holds partitions back for a `windowBuffer` (the
    /// broker times the hold: `claim_window_ring`).
    fn windowed(&self, queue: &str) -> bool {
        self.settings.get(queue).is_some_and(|t| !t.window.is_zero())
    }

    /// The ring's claim loop: check candidates out, claim them (on the
    /// caller's connection, or in a shared claim), settle them with the ring.
    async fn claim_ring_loop(&self, via: Via<'_>, queue: &str, p: &PopParams, worker: &str) -> Result<ClaimResult, PopError> {
        let mut looks = 0;
        loop {
            let batch = u32::try_from(p.batch).ok();
            let mut checkout = self.hotlist.checkout_sized(queue, &p.group, p.ring_candidates(), batch);
            if checkout.is_empty() {
                return Ok(ClaimResult::default());
            }
            let (pids, deep) = (checkout.pids(), checkout.deep());
            let mut result = match via {
                Via::Client(client) => claim::claim_candidates(client, &pids, p, worker, deep, &self.held(&pids, p, deep)).await?,
                Via::Share(share) => match share.claim(pids.clone(), p, worker, self.held(&pids, p, deep)).await {
                    share::Outcome::Claimed(r) => r,
                    share::Outcome::Busy => return Err(PopError::Pool),
                    share::Outcome::Alone => {
                        let _permit = self.permit().await?;
                        let client = self.connection().await?;
                        claim::claim_candidates(&client, &pids, p, worker, deep, &self.held(&pids, p, deep)).await?
                    }
                },
            };
            checkout.saw_spans(result.claimed.iter().map(|c| c.last - c.first + 1));
            let deep = match result.claimed.as_slice() {
                [] => None,
                [only] => Some(only.last - only.first + 1 >= i64::from(p.batch)),
                _ => Some(false),
            };
            if p.auto_ack {
                // The cursor moved to where the claim stopped: one that took
                // the partition to its last offset left nothing behind.
                for c in result.claimed.iter().filter(|c| c.tail.is_some_and(|tail| c.last >= tail)) {
                    result.verdicts.insert(c.partition_id, hotlist::Verdict::Drained);
                }
            }
            checkout.settle(&result.verdicts, deep);
            // Candidates that were all empty (consumed elsewhere, or the
            // ring's knowledge was stale) have just left the ring, and ones
            // leased by other consumers went to its tail; what is still ready
            // may hold work, so look again before answering empty (a pop of
            // three partitions, two of them leased, answered 204 while the
            // third waited: the model-based test of the commit path found it).
            looks += 1;
            let stale = result.claimed.is_empty()
                && !result.verdicts.is_empty()
                && result.verdicts.values().all(|v| matches!(v, hotlist::Verdict::Empty | hotlist::Verdict::Busy));
            if !stale || looks >= STALE_LOOKS || self.hotlist.ready_len(queue, &p.group) == 0 {
                return Ok(result);
            }
        }
    }

    /// The hot-list claim of a windowBuffer queue: the broker times the hold
    /// (`pop::wheel`). A candidate still held is passed over (back to the
    /// ring, deferred) unless what is pending already fills the batch; the
    /// others are claimed one at a time with the SQL debounce skipped, and a
    /// claim closes the partition's window.
    async fn claim_window_ring(
        &self,
        client: &deadpool_postgres::Client,
        queue: &str,
        p: &PopParams,
        worker: &str,
    ) -> Result<ClaimResult, PopError> {
        let checkout = self.hotlist.checkout(queue, &p.group, p.ring_candidates());
        let mut result = ClaimResult::default();
        if checkout.is_empty() {
            return Ok(result);
        }
        let held: Vec<bool> = checkout.candidates().iter().map(|(pid, _)| self.wheel.window_held(queue, *pid)).collect();
        let full = held.iter().any(|h| *h) && claim::pending_count(client, queue, &p.group, p.batch).await? >= p.batch as u64;
        let (mut left, mut claimed) = (p.batch, 0);
        for ((pid, name), held) in checkout.candidates().iter().zip(held) {
            if left <= 0 || (p.partitions > 0 && claimed >= p.partitions) {
                break; // unvisited: back at the ring's head
            }
            if held && !full {
                result.verdicts.insert(*pid, hotlist::Verdict::Deferred);
                continue;
            }
            let one = claim::claim_window(client, *pid, queue, name, p, worker, left).await?;
            for c in &one.claimed {
                left -= (c.last - c.first + 1) as i32;
                claimed += 1;
                self.wheel.window_claimed(queue, c.partition_id);
            }
            result.absorb(one);
        }
        checkout.settle(&result.verdicts, None);
        Ok(result)
    }

    /// Permits are always taken before connections (as `claim_from_ring`
    /// does), never the other way round: a pop that held a connection while
    /// queueing for a permit left connections idle in PostgreSQL while
    /// permit holders queued for connections, and 10,000 first contacts at
    /// once turned that into a storm of `500 pool` (docs/PERFORMANCE.md).
    async fn claim_sql(&self, route: &Route, p: &PopParams, worker: &str, probe: bool) -> Result<ClaimResult, PopError> {
        if probe {
            if let Route::Wildcard { queue } = route {
                // The cheap pending probe, before a permit: a queue that
                // exists and has nothing for this group skips the scan. With
                // work to do, claim on the same connection if a permit is
                // free at once; otherwise give the connection back first.
                let client = self.connection().await?;
                if claim::has_pending(&client, queue, &p.group).await? == Some(false) {
                    return Ok(ClaimResult::default());
                }
                if let Some(_permit) = self.permits.try_acquire() {
                    return Ok(claim::claim_route(&client, route, p, worker).await?);
                }
            }
        }
        let _permit = self.permit().await?;
        let client = self.connection().await?;
        Ok(claim::claim_route(&client, route, p, worker).await?)
    }

    async fn permit(&self) -> Result<LimitPermit<'_>, PopError> {
        crate::metrics::timed(crate::metrics::POP_STAGE, "permit", self.permits.acquire(self.pool_wait)).await.ok_or(PopError::Pool)
    }

    async fn connection(&self) -> Result<deadpool_postgres::Client, PopError> {
        crate::metrics::timed(crate::metrics::POP_STAGE, "pool", self.pool.get()).await.map_err(|e| {
            let e = crate::db::DbError::Pool(e);
            if e.unavailable() { PopError::Unavailable(e) } else { PopError::Pool }
        })
    }
}

/// Where a ring's claim goes: a connection the pop holds, or a shared claim.
#[derive(Clone, Copy)]
enum Via<'a> {
    Client(&'a deadpool_postgres::Client),
    Share(&'a Arc<share::ClaimShare>),
}

/// Counts a long-poll as parked for as long as this lives.
struct Parked<'a>(&'a crate::metrics::Telemetry);

impl<'a> Parked<'a> {
    fn new(t: &'a crate::metrics::Telemetry) -> Self {
        t.parked.fetch_add(1, Ordering::Relaxed);
        Parked(t)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.parked.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    /// A parked long-poll is this future: 10,000 of them are an idle
    /// broker's memory, so the claim path's state is boxed out of it (it was
    /// 2.5 KB with the state inline, docs/PERFORMANCE.md).
    #[tokio::test]
    async fn a_parked_pop_carries_no_claim_state() {
        let cfg = crate::config::Config::from_lookup(|_| None).unwrap();
        let manager =
            deadpool_postgres::Manager::from_config(tokio_postgres::Config::new(), tokio_postgres::NoTls, Default::default());
        let pool = deadpool_postgres::Pool::builder(manager).max_size(2).build().unwrap();
        let registry = std::sync::Arc::new(crate::registry::AckRegistry::new(1 << 20));
        let pops = super::PopService::new(pool, cfg.pop.clone(), 4, std::time::Duration::from_secs(1), registry, Default::default());
        let route = super::Route::Wildcard { queue: "q".into() };
        let params = super::params::PopParams::parse(&[], &cfg.pop).unwrap();
        let parked = pops.pop(&route, &params);
        assert!(std::mem::size_of_val(&parked) < 1024, "pop future is {} bytes", std::mem::size_of_val(&parked));
    }
}
