//! The push coalescer: concurrent pushes to one partition become one segment
//! write.
//!
//! Each (queue, partition) with pending work has a *lane*: a queue of entries
//! (chunks of requests) and at most one flusher task. The flusher takes as many
//! entries as fit the frame and byte bounds, compresses them into one segment,
//! and hands it to the group committer (`push::group`), which writes it with
//! what other lanes have ready. While that write is in flight new entries
//! pile up behind it and go out together in the next write, so batching
//! grows with load on its own; an idle lane's first write also waits up to
//! `hold` for company. Lanes never wait on each other, and a lane disappears
//! from the map as soon as it has nothing left to write, so memory follows
//! the partitions being written right now, not all of them.
//!
//! An entry's sender learns its outcome only after COMMIT: that is what makes
//! a `201` mean durable.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::{oneshot, Notify};
use uuid::Uuid;

use super::dedup::{load_key, DedupCache, Known, Segment};
use super::group::GroupCommitter;
use super::segment::{append_segment, append_with_memory, keeps_no_window, originals, PushError, MemorySegment, SegmentWrite};
use crate::db::DbError;
use crate::config::CoalesceConfig;
use crate::log::{compress_frames, decompress_frames, FrameReader, TxnHasher, SEGMENT_LIMIT};

/// Number of independent lane maps; a push locks one shard briefly.
const SHARDS: usize = 16;
/// Bound on dedup re-tries of one batch (each retry drops at least one item).
const MAX_ATTEMPTS: usize = 8;


/// One message of an entry, with where its encoded frame sits (an empty
/// range in a bare entry, see [`Entry`]). Its transactionId travels as its
/// index hash, which is all the lane needs.
#[derive(Debug, Clone)]
pub struct EntryItem {
    pub txn_hash: i64,
    pub message_id: Uuid,
    pub frame: Range<usize>,
}

/// One segment of [`Coalescer::write_many_in`]: encoded frames for
/// (queue, partition) and their transactionIds' hashes.
pub struct InSegment<'a> {
    pub queue: &'a str,
    pub partition: &'a str,
    pub hashes: &'a [i64],
    pub frames: &'a [u8],
    /// Set only when every id of the segment was minted by the broker just
    /// now (no earlier message can hold one): the partition's id and last
    /// offset as the caller's transaction read them. The dedup check is
    /// then skipped: PostgreSQL is told the memory covers the partition up
    /// to that offset, and the memory is told nothing (it catches up on
    /// the partition's next write). A tail that moved since is only slower:
    /// PostgreSQL checks what it no longer covers.
    pub tail: Option<(i64, i64)>,
}

/// What became of one pushed message.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Queued { message_id: Uuid, partition_id: i64, offset: i64 },
    /// Already in the partition: `message_id` is the original's (nil when it
    /// can no longer be known, e.g. its segment was removed by retention).
    Duplicate { message_id: Uuid, partition_id: i64 },
}

impl Outcome {
    pub fn message_id(&self) -> Uuid {
        match self {
            Outcome::Queued { message_id, .. } | Outcome::Duplicate { message_id, .. } => *message_id,
        }
    }
    pub fn partition_id(&self) -> i64 {
        match self {
            Outcome::Queued { partition_id, .. } | Outcome::Duplicate { partition_id, .. } => *partition_id,
        }
    }
}


type Reply = oneshot::Sender<Result<Vec<Outcome>, Arc<PushError>>>;

/// A chunk of one request bound for one partition: frames encoded back to back.
struct Entry {
    items: Vec<EntryItem>,
    frames: Vec<u8>,
    /// The client's own compressed frames (`QPB1` flag 8), stored as they
    /// came when nothing of the entry is dropped; `frames` is the fallback.
    /// A bare entry (prepacked, `frames` empty) has its frames recovered
    /// from the blob in that case, which only a duplicate causes.
    prepacked: Option<Vec<u8>>,
    reply: Reply,
    queued: Instant,
}

#[derive(Default)]
struct LaneState {
    pending: VecDeque<Entry>,
    frames: usize,
    bytes: usize,
    flushing: bool,
}

struct Lane {
    key: (String, String),
    state: Mutex<LaneState>,
    full: Notify,
}

/// Most queues whose dedup window is remembered: short-lived queues (a fresh
/// name per job) would otherwise grow the map for the broker's whole life.
const KNOWN_WINDOWS: usize = 10_000;

/// One shard of the lanes, by (queue, partition).
type LaneMap = HashMap<(String, String), Arc<Lane>>;

struct Inner {
    shards: Vec<Mutex<LaneMap>>,
    /// Each queue's dedup window as PostgreSQL last reported it (absent = not
    /// yet known; treated as "dedup on"). Kept by queue, not by lane: a lane
    /// goes as soon as its partition is idle, and a window learned once saves
    /// every later segment of the queue a check (see `append_segment`).
    windows: Mutex<HashMap<String, i32>>,
    group: GroupCommitter,
    /// The dedup windows of the partitions this broker writes: every write
    /// to a queue with a window is checked here first (`push::dedup`).
    dedup: DedupCache,
    cfg: CoalesceConfig,
    /// Which queues seal their payloads: every push path reaches the log
    /// through this coalescer, so this is where it learns (`PushPlan`).
    encryption: Arc<crate::crypto::Encryption>,
    /// The database's transactionId hasher, read once on first use (a
    /// broker may boot before its database answers).
    hasher: tokio::sync::OnceCell<TxnHasher>,
    pool: Pool,
    flushers: AtomicUsize,
    idle: Notify,
}

/// The per-partition write coalescer. Cheap to clone.
#[derive(Clone)]
pub struct Coalescer {
    inner: Arc<Inner>,
}

impl Coalescer {
    pub fn new(pool: Pool, cfg: CoalesceConfig, encryption: Arc<crate::crypto::Encryption>) -> Coalescer {
        Coalescer {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                windows: Mutex::new(HashMap::new()),
                group: GroupCommitter::new(pool.clone(), cfg.group_writers),
                dedup: DedupCache::new(cfg.dedup_entries),
                cfg,
                encryption,
                hasher: tokio::sync::OnceCell::new(),
                pool,
                flushers: AtomicUsize::new(0),
                idle: Notify::new(),
            }),
        }
    }

    /// The configured bounds, so callers can chunk requests to fit.
    pub fn config(&self) -> &CoalesceConfig {
        &self.inner.cfg
    }

    /// The broker's encryption state (which queues seal their payloads).
    pub fn encryption(&self) -> &Arc<crate::crypto::Encryption> {
        &self.inner.encryption
    }

    /// The database's transactionId hasher ([`TxnHasher`]), read from
    /// `queen.dedup_key` on a pooled connection the first time.
    pub async fn hasher(&self) -> Result<&TxnHasher, DbError> {
        self.inner.hasher().await
    }

    /// [`Coalescer::hasher`] read, the first time, on the caller's own
    /// connection (a transaction holding it must not wait for another).
    pub async fn hasher_in(&self, client: &impl deadpool_postgres::GenericClient) -> Result<&TxnHasher, DbError> {
        self.inner.hasher.get_or_try_init(|| load_key(client)).await
    }

    /// The broker's dedup memory.
    pub fn dedup(&self) -> &DedupCache {
        &self.inner.dedup
    }

    /// Compresses `frames` into one segment and appends it to (queue,
    /// partition) inside the caller's transaction `client` (a transaction
    /// bundle, a timer tick), which commits it with its other work. Checked
    /// against the dedup memory like a lane's write; the memory learns only
    /// what others committed before (the segment itself may still roll
    /// back), and catches up with it on the partition's next write.
    pub async fn write_in(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        queue: &str,
        partition: &str,
        hashes: &[i64],
        frames: &[u8],
    ) -> Result<SegmentWrite, DbError> {
        let mut written = self.write_many_in(client, &[InSegment { queue, partition, hashes, frames, tail: None }]).await?;
        written.pop().ok_or_else(|| DbError::Unexpected("push_segments_of_queues_v1 answered nothing".into()))
    }

    /// [`Coalescer::write_in`] for segments of different partitions (one
    /// each): those of queues with a dedup window, or several of any, in
    /// one call of `queen.push_segments_of_queues_v1`, a round trip for
    /// all of them. Each segment's outcome, in order.
    pub async fn write_many_in(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        segments: &[InSegment<'_>],
    ) -> Result<Vec<SegmentWrite>, DbError> {
        let blobs: Vec<Vec<u8>> = segments.iter().map(|s| compress_frames(s.frames, self.inner.cfg.zstd_level)).collect();
        let windows: Vec<Option<i32>> = {
            let known = self.inner.windows.lock().expect("windows lock poisoned");
            segments.iter().map(|s| known.get(s.queue).copied()).collect()
        };
        if let ([s], [window]) = (segments, windows.as_slice()) {
            if keeps_no_window(*window) {
                return Ok(vec![append_segment(client, s.queue, s.partition, s.hashes, &blobs[0]).await?]);
            }
        }
        let dedup = &self.inner.dedup;
        let mut out: Vec<Option<SegmentWrite>> = segments.iter().map(|_| None).collect();
        let mut checks = Vec::with_capacity(segments.len());
        for (n, (s, window)) in segments.iter().zip(&windows).enumerate() {
            if let Some((pid, last)) = s.tail {
                checks.push(Some(Known { pid, last, window: i32::MAX }));
                continue;
            }
            let check = window.filter(|w| *w > 0).map(|w| dedup.check(s.queue, s.partition, w, s.hashes)).unwrap_or_default();
            if let (Some(known), false) = (check.known, check.dups.is_empty()) {
                let candidates: Vec<(i64, i64)> = check.dups.iter().map(|&(i, off)| (off, s.hashes[i])).collect();
                let ids = originals(client, known.pid, &candidates, self.hasher_in(client).await?).await?;
                let dups: Vec<(usize, Uuid)> = check.dups.iter().zip(ids).filter_map(|(d, id)| id.map(|id| (d.0, id))).collect();
                if !dups.is_empty() {
                    out[n] = Some(SegmentWrite::Duplicates { partition_id: known.pid, window: window.unwrap_or(1), dups });
                }
            }
            checks.push(check.known);
        }
        let calls: Vec<usize> = (0..segments.len()).filter(|&n| out[n].is_none()).collect();
        let memory: Vec<MemorySegment> = calls
            .iter()
            .map(|&n| {
                let s = &segments[n];
                MemorySegment { queue: s.queue, partition: s.partition, hashes: s.hashes, blob: &blobs[n], known: checks[n] }
            })
            .collect();
        if !memory.is_empty() {
            let appended = append_with_memory(client, &memory).await?;
            for (&n, a) in calls.iter().zip(appended) {
                if segments[n].tail.is_none() {
                    dedup.absorb(segments[n].queue, segments[n].partition, checks[n], &a.answer, None);
                }
                out[n] = Some(a.write);
            }
        }
        out.into_iter().map(|w| w.ok_or_else(|| DbError::Unexpected("a segment was left unwritten".into()))).collect()
    }

    /// Queues a chunk for (queue, partition) and returns where its outcome
    /// will arrive. Synchronous on purpose: a request enqueues every chunk
    /// before awaiting any, so its chunks can share segments.
    pub fn submit(
        &self,
        queue: &str,
        partition: &str,
        items: Vec<EntryItem>,
        frames: Vec<u8>,
        prepacked: Option<Vec<u8>>,
    ) -> oneshot::Receiver<Result<Vec<Outcome>, Arc<PushError>>> {
        let (reply, rx) = oneshot::channel();
        let key = (queue.to_string(), partition.to_string());
        let shard = &self.inner.shards[shard_of(&key)];
        let mut map = shard.lock().expect("lane map lock poisoned");
        let lane = map
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Lane { key, state: Mutex::new(LaneState::default()), full: Notify::new() }))
            .clone();
        let mut st = lane.state.lock().expect("lane lock poisoned");
        st.frames += items.len();
        st.bytes += frames.len();
        st.pending.push_back(Entry { items, frames, prepacked, reply, queued: Instant::now() });
        if st.frames >= self.inner.cfg.max_frames || st.bytes >= self.inner.cfg.max_bytes {
            lane.full.notify_one();
        }
        if !st.flushing {
            st.flushing = true;
            self.inner.flushers.fetch_add(1, Ordering::SeqCst);
            let inner = self.inner.clone();
            let lane = lane.clone();
            tokio::spawn(async move { inner.run_lane(lane).await });
        }
        rx
    }

    /// Waits until every lane has written what it holds (shutdown), at most
    /// `deadline`.
    pub async fn drain(&self, deadline: Duration) {
        let _ = tokio::time::timeout(deadline, async {
            while self.inner.flushers.load(Ordering::SeqCst) > 0 {
                let notified = self.inner.idle.notified();
                if self.inner.flushers.load(Ordering::SeqCst) == 0 {
                    break;
                }
                let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
            }
        })
        .await;
    }
}

fn shard_of(key: &(String, String)) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() as usize) % SHARDS
}

/// Encoded frames back to back, and each one's byte range in them.
type Unpacked = (Vec<u8>, Vec<Range<usize>>);

/// A bare entry's frames, re-encoded from its blob, with each one's range:
/// the frames `push_items` would have encoded, since the items were read
/// from exactly these.
fn unpack(blob: &[u8], items: usize) -> Result<Unpacked, Arc<PushError>> {
    let unreadable = |e: String| Arc::new(PushError::Unreadable(e));
    let raw = decompress_frames(blob, SEGMENT_LIMIT).map_err(|e| unreadable(e.to_string()))?;
    let mut out = Vec::with_capacity(raw.len());
    let mut ranges = Vec::with_capacity(items);
    for f in FrameReader::new(&raw) {
        let start = out.len();
        f.map_err(|e| unreadable(format!("{e:?}")))?.encode_into(&mut out).map_err(|e| unreadable(e.to_string()))?;
        ranges.push(start..out.len());
    }
    if ranges.len() != items {
        return Err(unreadable(format!("{} frames for {items} items", ranges.len())));
    }
    Ok((out, ranges))
}

impl Inner {
    async fn run_lane(self: Arc<Self>, lane: Arc<Lane>) {
        let mut first = true;
        loop {
            if first && !self.cfg.hold.is_zero() {
                let below = {
                    let st = lane.state.lock().expect("lane lock poisoned");
                    st.frames < self.cfg.max_frames && st.bytes < self.cfg.max_bytes
                };
                if below {
                    let _ = tokio::time::timeout(self.cfg.hold, lane.full.notified()).await;
                }
            }
            first = false;
            let (mut batch, window) = self.take_batch(&lane);
            if batch.is_empty() {
                // Re-check under the map lock, which every submit takes first, so
                // an entry cannot slip in between this check and the removal.
                let mut map = self.shards[shard_of(&lane.key)].lock().expect("lane map lock poisoned");
                let mut st = lane.state.lock().expect("lane lock poisoned");
                if st.pending.is_empty() {
                    st.flushing = false;
                    if map.get(&lane.key).is_some_and(|l| Arc::ptr_eq(l, &lane)) {
                        map.remove(&lane.key);
                    }
                    drop(st);
                    drop(map);
                    if self.flushers.fetch_sub(1, Ordering::SeqCst) == 1 {
                        self.idle.notify_waiters();
                    }
                    return;
                }
                continue;
            }
            // A prepacked entry travels alone; its blob moves into the write.
            let prepacked = batch.first_mut().and_then(|e| e.prepacked.take());
            match self.write(&lane.key, &batch, prepacked, window).await {
                Ok((outcomes, window)) => {
                    let mut windows = self.windows.lock().expect("windows lock poisoned");
                    if windows.get(&lane.key.0) != Some(&window) {
                        if windows.len() >= KNOWN_WINDOWS {
                            windows.clear(); // a hint: relearned one write per queue
                        }
                        windows.insert(lane.key.0.clone(), window);
                    }
                    drop(windows);
                    for (entry, outcome) in batch.into_iter().zip(outcomes) {
                        let _ = entry.reply.send(Ok(outcome));
                    }
                }
                Err(e) => {
                    static FAILED: crate::telemetry::Throttle = crate::telemetry::Throttle::new(5_000);
                    if !e.database_unreachable() {
                        tracing::warn!(queue = %lane.key.0, partition = %lane.key.1, error = %e, "segment write failed");
                    } else if let Some(skipped) = FAILED.admit() {
                        tracing::warn!(queue = %lane.key.0, partition = %lane.key.1, error = %e, skipped, "segment write failed: the database is unavailable");
                    }
                    for entry in batch {
                        let _ = entry.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Takes entries up to the bounds (always at least one). A prepacked
    /// entry travels alone: its blob is its segment.
    fn take_batch(&self, lane: &Lane) -> (Vec<Entry>, Option<i32>) {
        let mut st = lane.state.lock().expect("lane lock poisoned");
        let (mut frames, mut bytes) = (0, 0);
        let mut batch: Vec<Entry> = Vec::new();
        while let Some(e) = st.pending.front() {
            let fits = frames + e.items.len() <= self.cfg.max_frames && bytes + e.frames.len() <= self.cfg.max_bytes;
            let alone = e.prepacked.is_some() || batch.first().is_some_and(|b| b.prepacked.is_some());
            if !batch.is_empty() && (!fits || alone) {
                break;
            }
            frames += e.items.len();
            bytes += e.frames.len();
            batch.push(st.pending.pop_front().expect("front exists"));
        }
        st.frames -= frames;
        st.bytes -= bytes;
        for e in &batch {
            crate::metrics::stage(crate::metrics::PUSH_STAGE, "lane", e.queued);
        }
        drop(st);
        let window = self.windows.lock().expect("windows lock poisoned").get(&lane.key.0).copied();
        (batch, window)
    }

    /// See [`Coalescer::hasher`].
    async fn hasher(&self) -> Result<&TxnHasher, DbError> {
        self.hasher.get_or_try_init(|| async { load_key(&self.pool.get().await?).await }).await
    }

    /// Writes one batch as one segment (more round trips only when PostgreSQL
    /// reports cross-request duplicates). Returns each entry's outcomes and the
    /// queue's dedup window.
    async fn write(
        &self,
        key: &(String, String),
        batch: &[Entry],
        mut prepacked: Option<Vec<u8>>,
        window: Option<i32>,
    ) -> Result<(Vec<Vec<Outcome>>, i32), Arc<PushError>> {
        // Merge equal transactionIds of different requests in this batch: the
        // first wins, unless the queue keeps no dedup window at all.
        let mut leader_of: HashMap<(usize, usize), (usize, usize)> = HashMap::new();
        let mut survivors: Vec<(usize, usize)> = Vec::new();
        let mut seen: HashMap<i64, (usize, usize)> = HashMap::new();
        for (e, entry) in batch.iter().enumerate() {
            for (i, item) in entry.items.iter().enumerate() {
                if window != Some(0) {
                    if let Some(&leader) = seen.get(&item.txn_hash) {
                        leader_of.insert((e, i), leader);
                        continue;
                    }
                    seen.insert(item.txn_hash, (e, i));
                }
                survivors.push((e, i));
            }
        }
        let mut outcomes: Vec<Vec<Option<Outcome>>> = batch.iter().map(|e| vec![None; e.items.len()]).collect();
        let mut window_seen = window.unwrap_or(1);
        let bare = batch.len() == 1 && batch[0].frames.is_empty() && prepacked.is_some();
        let mut recovered: Option<(Vec<u8>, Vec<Range<usize>>)> = None;
        let mut attempts = 0;
        while !survivors.is_empty() {
            attempts += 1;
            if attempts > MAX_ATTEMPTS {
                return Err(Arc::new(PushError::Lost));
            }
            let mut hashes: Vec<i64> = survivors.iter().map(|&(e, i)| batch[e].items[i].txn_hash).collect();
            // What the dedup memory already holds is answered here, with the
            // original's id; the rest goes to PostgreSQL with what the memory
            // covers, and PostgreSQL checks what it does not.
            let check = window.filter(|w| *w > 0).map(|w| self.dedup.check(&key.0, &key.1, w, &hashes)).unwrap_or_default();
            let known = check.known;
            if let (Some(known), false) = (known, check.dups.is_empty()) {
                let candidates: Vec<(i64, i64)> = check.dups.iter().map(|&(i, off)| (off, hashes[i])).collect();
                let hasher = self.hasher().await.map_err(|e| Arc::new(PushError::Db(e)))?;
                let ids = self.group.originals(known.pid, &candidates, hasher).await.map_err(|e| Arc::new(PushError::Db(e)))?;
                // A candidate PostgreSQL does not confirm is a new message.
                let confirmed = check.dups.iter().zip(ids).filter_map(|(&(n, _), id)| id.map(|id| (n, id)));
                settle_duplicates(&mut survivors, &mut outcomes, confirmed, known.pid);
                if survivors.is_empty() {
                    break;
                }
                hashes = survivors.iter().map(|&(e, i)| batch[e].items[i].txn_hash).collect();
            }
            // The client's blob holds exactly these frames only while nothing
            // has been dropped (merged or refused as a duplicate); otherwise
            // the survivors' frames are gathered and compressed here.
            let whole = attempts == 1 && batch.len() == 1 && survivors.len() == batch[0].items.len();
            let blob = match prepacked.take() {
                Some(blob) if whole => {
                    if bare {
                        prepacked = Some(blob.clone()); // a duplicate would need its frames back
                    }
                    blob
                }
                unused => {
                    if bare && recovered.is_none() {
                        let packed = unused.as_deref().ok_or_else(|| Arc::new(PushError::Unreadable("no blob".into())))?;
                        recovered = Some(unpack(packed, batch[0].items.len())?);
                    }
                    let frame = |e: usize, i: usize| match &recovered {
                        Some((raw, ranges)) => &raw[ranges[i].clone()],
                        None => &batch[e].frames[batch[e].items[i].frame.clone()],
                    };
                    let mut frames = Vec::with_capacity(survivors.iter().map(|&(e, i)| frame(e, i).len()).sum());
                    for &(e, i) in &survivors {
                        frames.extend_from_slice(frame(e, i));
                    }
                    compress_frames(&frames, self.cfg.zstd_level)
                }
            };
            let appended = self.group.write(&key.0, &key.1, hashes.clone(), blob, window, known).await?;
            if let Some(at_us) = appended.at_us {
                self.dedup.observe_clock(at_us);
            }
            let own = match (&appended.write, appended.at_us) {
                (SegmentWrite::Written { base_offset, .. }, Some(at_us)) => Some(Segment { base: *base_offset, at_us, hashes }),
                _ => None,
            };
            self.dedup.absorb(&key.0, &key.1, known, &appended.answer, own.as_ref());
            match appended.write {
                SegmentWrite::Written { partition_id, base_offset, window } => {
                    window_seen = window;
                    for (n, &(e, i)) in survivors.iter().enumerate() {
                        let message_id = batch[e].items[i].message_id;
                        outcomes[e][i] = Some(Outcome::Queued { message_id, partition_id, offset: base_offset + n as i64 });
                    }
                    break;
                }
                SegmentWrite::Duplicates { partition_id, window, dups } => {
                    window_seen = window;
                    settle_duplicates(&mut survivors, &mut outcomes, dups, partition_id);
                }
            }
        }
        for (&(e, i), &(le, li)) in &leader_of {
            let leader = outcomes[le][li].clone().expect("every survivor has an outcome");
            outcomes[e][i] = Some(Outcome::Duplicate { message_id: leader.message_id(), partition_id: leader.partition_id() });
        }
        let outcomes =
            outcomes.into_iter().map(|v| v.into_iter().map(|o| o.expect("every item has an outcome")).collect()).collect();
        Ok((outcomes, window_seen))
    }
}

/// Answers the survivors at `dups` (index into `survivors`, original id) as
/// duplicates of `partition_id` and drops them from the batch.
fn settle_duplicates(
    survivors: &mut Vec<(usize, usize)>,
    outcomes: &mut [Vec<Option<Outcome>>],
    dups: impl IntoIterator<Item = (usize, Uuid)>,
    partition_id: i64,
) {
    let mut dropped = vec![false; survivors.len()];
    for (n, message_id) in dups {
        let (e, i) = survivors[n];
        outcomes[e][i] = Some(Outcome::Duplicate { message_id, partition_id });
        dropped[n] = true;
    }
    let mut n = 0;
    survivors.retain(|_| {
        n += 1;
        !dropped[n - 1]
    });
}
