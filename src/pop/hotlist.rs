//! The hot-list: per (queue, group), a ring of partitions believed to have
//! pending data, so a pop asks PostgreSQL only about those.
//!
//! Pushes feed it; each pop checks candidates out, and settles each with the
//! claim's verdict: delivered, leased by someone else, or deferred go back to
//! the tail (they may have more, or redeliver when a lease expires), empty
//! ones leave, unvisited ones go back to the head. A push that lands on a
//! checked-out partition marks it dirty, so a stale "empty" verdict cannot
//! strand it. A periodic reseed from SQL catches what the ring cannot see
//! (pushes through other brokers). Checked-out candidates a dropped pop never
//! settled are put back by the guard's `Drop`.
//!
//! A push costs the same however many groups read the queue: it writes one
//! entry to the queue's [`Feed`], and each ring catches up with the feed
//! when it is next used (a pop's plan, checkout or settle), taking every
//! partition pushed since once, however often it was pushed. Walking every
//! ring at every push made one queue with 1,000 consumer groups spend a
//! fifth of the broker's CPU in this module and push 12 % slower
//! (docs/PERFORMANCE.md, issue 51). Rings with a pop waiting for a
//! candidate ([`HotList::await_return`]) are the exception: a push catches
//! them up at once, so the wait ends as it did before.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// What the claim said about one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Claimed,
    /// Claimed by an autoAck pop up to the partition's last offset as the
    /// claim read it (`0035_claim_reports_the_tail.sql`): nothing is left,
    /// and the partition leaves the ring as an empty one does.
    Drained,
    Busy,
    Deferred,
    Empty,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Member {
    Ready,
    Out { dirty: bool },
}

struct Ring {
    ready: VecDeque<(i64, Arc<str>)>,
    members: HashMap<i64, Member>,
    /// Messages believed pending per member: counted from pushes while the
    /// member is known to have started empty; `None` once that is not known
    /// (reseeded, or claimed and possibly left with more).
    estimates: HashMap<i64, Option<u64>>,
    last_reseed: Option<Instant>,
    /// This ring's current reseed interval: the configured one ±25 %, drawn
    /// afresh at every reseed, so rings created together (a fleet of
    /// consumers starting at once) do not all fall due in the same instant.
    period: Duration,
    /// Fired whenever a candidate becomes ready (a settle puts one back, a
    /// push or a reseed adds one): pops that found every member checked out
    /// wait for it (see `await_return`).
    refilled: Arc<Notify>,
    /// Set while the first contact that made this ring registers the group
    /// and reads its first seed (see [`Seeding`]); fired when it is done.
    seeding: Option<Arc<Notify>>,
    /// The last claim filled its batch from its first partition: the next
    /// one asks for a single partition's claim (see `Checkout::deep`).
    deep: bool,
    /// Messages a claim found per partition, each claim weighing half (`None`
    /// until a claim spanned several partitions): a pop checks out about as
    /// many candidates as its batch needs (see [`HotList::checkout_sized`]).
    depth: Option<f64>,
    /// When a pop last planned or checked out on this ring: a ring no pop
    /// has used for [`RING_IDLE`] is dropped ([`HotList::evict_idle`]).
    last_used: Instant,
    /// Where the next reseed's window starts: past this partition name (""
    /// = the queue's first). A reseed reads `QUEEN_MAINTENANCE_WINDOW`
    /// partitions of the queue, so a larger queue is walked over several
    /// reseeds (`claim::pending_partitions_window`).
    reseed_after: String,
    /// Every feed entry below this sequence number has been applied.
    seen: u64,
    /// Per partition, the feed's running total when this ring last applied
    /// it: the next catch-up counts what was pushed since from it.
    totals: HashMap<i64, u64>,
}

/// What the pushes of one queue left for its rings: per partition, its
/// latest push's sequence number and a running count of messages, and the
/// partitions in the order of their latest push, so a ring catches up by
/// reading the entries past its own `seen` (each partition once). Entries
/// every ring has applied are dropped at the reseeder's tick
/// ([`HotList::evict_idle`]); a feed that reaches [`FEED_CAP`] (rings no pop
/// uses) catches every ring up and starts empty.
#[derive(Default)]
struct Feed {
    next: u64,
    latest: HashMap<i64, Fed>,
    order: BTreeMap<u64, i64>,
}

/// One partition's entry in a [`Feed`].
struct Fed {
    /// Its latest push.
    seq: u64,
    /// The push that created the entry: `total` counts from there.
    born: u64,
    total: u64,
    name: Arc<str>,
}

/// Most partitions a queue's feed holds before it catches every ring up.
const FEED_CAP: usize = 65_536;

impl Feed {
    fn push(&mut self, pid: i64, partition: &str, count: u64) {
        let seq = self.next;
        self.next += 1;
        match self.latest.get_mut(&pid) {
            Some(f) => {
                self.order.remove(&f.seq);
                f.seq = seq;
                f.total += count;
            }
            None => {
                self.latest.insert(pid, Fed { seq, born: seq, total: count, name: Arc::from(partition) });
            }
        }
        self.order.insert(seq, pid);
    }

    /// Applies to `r` every partition pushed since it last caught up.
    fn sync(&self, r: &mut Ring) {
        if r.seen >= self.next {
            return;
        }
        for pid in self.order.range(r.seen..).map(|(_, pid)| *pid) {
            let f = &self.latest[&pid];
            // Exact when the entry began after the ring's last catch-up, or
            // the ring saw its total then; otherwise (a ring newer than the
            // entry) unknown.
            let since = if f.born >= r.seen { Some(f.total) } else { r.totals.get(&pid).map(|t| f.total - t) };
            r.apply(pid, &f.name, since);
            r.totals.insert(pid, f.total);
        }
        r.seen = self.next;
    }

    /// Drops the entries every ring has applied (`seen` the lowest ring's).
    fn trim(&mut self, seen: u64) {
        let keep = self.order.split_off(&seen);
        for pid in std::mem::replace(&mut self.order, keep).into_values() {
            self.latest.remove(&pid);
        }
    }

    fn clear(&mut self) {
        self.latest.clear();
        self.order.clear();
    }
}

/// The rings of one queue, by group, and the feed its pushes write.
#[derive(Default)]
struct QueueRings {
    groups: HashMap<String, Ring>,
    feed: Feed,
    /// Groups a pop waits on in [`HotList::await_return`]: pushes catch
    /// these rings up at once.
    waiting: HashSet<String>,
}

impl QueueRings {
    /// Catches every ring up and empties the feed.
    fn sync_all(&mut self) {
        for r in self.groups.values_mut() {
            self.feed.sync(r);
        }
        self.feed.clear();
    }

    /// Drops the feed entries every ring has applied, and the rings' totals
    /// of partitions that are neither members nor in the feed any more.
    fn trim(&mut self) {
        let Some(seen) = self.groups.values().map(|r| r.seen).min() else { return };
        self.feed.trim(seen);
        for r in self.groups.values_mut() {
            if r.totals.len() > 2 * r.members.len() + 64 {
                let (members, latest) = (&r.members, &self.feed.latest);
                r.totals.retain(|pid, _| members.contains_key(pid) || latest.contains_key(pid));
            }
        }
    }
}

/// How long a ring nobody pops stays: any pop creates a ring for its
/// (queue, group), and the pushes of a queue walk every ring of it, so
/// rings of groups that stopped consuming must not pile up. A dropped ring
/// is only a cache: the group's next pop builds it again from SQL.
pub const RING_IDLE: Duration = Duration::from_secs(15 * 60);

/// `every` scaled by a random factor in [0.75, 1.25).
fn jittered(every: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() as u64 % 10_000) as f64 / 10_000.0;
    every.mul_f64(0.75 + r * 0.5)
}

/// What a pop should do, decided before any permit or connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// First pop of this (queue, group) here: lead its first contact
    /// ([`HotList::begin_seeding`]).
    NoRing,
    /// Another pop is leading the first contact: wait for it
    /// ([`HotList::await_seeded`]).
    Seeding,
    /// Nothing believed pending and no reseed due: answer empty at once.
    NothingReady,
    /// Ask PostgreSQL; reseed the ring first if due.
    Claim { reseed: bool },
}

type Rings = HashMap<String, QueueRings>;

pub struct HotList {
    rings: Mutex<Rings>,
    reseed_every: Duration,
    /// Idle rings are reseeded by the background reseeder
    /// (`pop::reseeder`), not by the pops parked on them.
    background: std::sync::atomic::AtomicBool,
}

impl HotList {
    pub fn new(reseed_every: Duration) -> Arc<HotList> {
        Arc::new(HotList { rings: Mutex::new(HashMap::new()), reseed_every, background: Default::default() })
    }

    fn with_ring<T>(&self, queue: &str, group: &str, f: impl FnOnce(&mut Ring) -> T) -> Option<T> {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        let q = rings.get_mut(queue)?;
        let r = q.groups.get_mut(group)?;
        q.feed.sync(r);
        Some(f(r))
    }

    /// Hands idle rings' reseeds to the background reseeder from now on.
    pub fn reseed_in_background(&self) {
        self.background.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether idle rings are reseeded in the background.
    pub fn background(&self) -> bool {
        self.background.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Decides what a pop does. A due reseed is handed to exactly one pop (the
    /// clock restarts now), so a herd of parked pops waking together does not
    /// all go to PostgreSQL for it. With the background reseeder on, a
    /// long-poll (`waits`) on a ring with nothing ready leaves the reseed to
    /// it (it joins every other due ring's in one query and opens the gate if
    /// it finds work); a pop that answers at once still reseeds inline.
    pub fn plan(&self, queue: &str, group: &str, waits: bool) -> Plan {
        let defer = waits && self.background();
        self.with_ring(queue, group, |r| {
            r.last_used = Instant::now();
            if r.seeding.is_some() {
                return Plan::Seeding;
            }
            let reseed = r.last_reseed.is_none_or(|t| t.elapsed() >= r.period);
            if reseed && !(defer && r.ready.is_empty()) {
                r.last_reseed = Some(Instant::now());
                r.period = jittered(self.reseed_every);
                Plan::Claim { reseed: true }
            } else if r.ready.is_empty() {
                Plan::NothingReady
            } else {
                Plan::Claim { reseed: false }
            }
        })
        .unwrap_or(Plan::NoRing)
    }

    /// Time until the ring's next reseed (zero when due or unknown).
    pub fn until_reseed(&self, queue: &str, group: &str) -> Duration {
        self.with_ring(queue, group, |r| match r.last_reseed {
            Some(t) => r.period.saturating_sub(t.elapsed()),
            None => Duration::ZERO,
        })
        .unwrap_or(Duration::ZERO)
    }

    /// Idle rings (nothing ready) whose reseed is due, at most `max`; their
    /// clocks restart now, so no pop reseeds them meanwhile.
    pub fn take_due_idle(&self, max: usize) -> Vec<(String, String)> {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        let mut due = Vec::new();
        'all: for (queue, q) in rings.iter_mut() {
            for (group, r) in q.groups.iter_mut() {
                if due.len() >= max {
                    break 'all;
                }
                if r.seeding.is_some() || r.last_reseed.is_some_and(|t| t.elapsed() < r.period) {
                    continue;
                }
                q.feed.sync(r);
                if r.ready.is_empty() {
                    r.last_reseed = Some(Instant::now());
                    r.period = jittered(self.reseed_every);
                    due.push((queue.clone(), group.clone()));
                }
            }
        }
        due
    }

    fn new_ring(&self, seeding: Option<Arc<Notify>>, seen: u64) -> Ring {
        Ring {
            reseed_after: String::new(),
            seen,
            totals: HashMap::new(),
            ready: VecDeque::new(),
            members: HashMap::new(),
            estimates: HashMap::new(),
            last_reseed: seeding.as_ref().map(|_| Instant::now()),
            period: jittered(self.reseed_every),
            refilled: Arc::new(Notify::new()),
            seeding,
            deep: false,
            depth: None,
            last_used: Instant::now(),
        }
    }

    /// Drops the rings no pop has used for `idle` (none with a candidate
    /// checked out or a first contact in flight), and the feed entries the
    /// remaining rings have all applied; how many rings.
    pub fn evict_idle(&self, idle: Duration) -> usize {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        let mut dropped = 0;
        rings.retain(|_, q| {
            q.groups.retain(|_, r| {
                let busy = r.seeding.is_some() || r.members.values().any(|m| matches!(m, Member::Out { .. }));
                let keep = busy || r.last_used.elapsed() < idle;
                dropped += usize::from(!keep);
                keep
            });
            q.trim();
            !q.groups.is_empty()
        });
        dropped
    }

    /// Rings held, of every queue and group.
    pub fn rings(&self) -> usize {
        self.rings.lock().expect("hot-list lock poisoned").values().map(|q| q.groups.len()).sum()
    }

    /// Partitions held in the queues' feeds, not yet applied by every ring
    /// (a gauge: bounded by [`FEED_CAP`] per queue).
    pub fn feed_entries(&self) -> usize {
        self.rings.lock().expect("hot-list lock poisoned").values().map(|q| q.feed.order.len()).sum()
    }

    /// Creates a ring whose first reseed is due now.
    #[cfg(test)]
    pub fn create(&self, queue: &str, group: &str) {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        let q = rings.entry(queue.to_string()).or_default();
        if !q.groups.contains_key(group) {
            let ring = self.new_ring(None, q.feed.next);
            q.groups.insert(group.to_string(), ring);
        }
    }

    /// Makes the caller the leader of the first contact of (queue, group) on
    /// this broker: the ring exists from now on (pushes meanwhile land in
    /// it), but pops wait ([`Plan::Seeding`]) until the leader has
    /// registered the group and read the first seed. One pop does that work
    /// instead of every consumer of a new group scanning all partitions at
    /// once. `None` when the ring already exists (plan again).
    pub fn begin_seeding(self: &Arc<Self>, queue: &str, group: &str) -> Option<Seeding> {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        let q = rings.entry(queue.to_string()).or_default();
        if q.groups.contains_key(group) {
            return None;
        }
        let done = Arc::new(Notify::new());
        let ring = self.new_ring(Some(done.clone()), q.feed.next);
        q.groups.insert(group.to_string(), ring);
        Some(Seeding { list: self.clone(), queue: queue.to_string(), group: group.to_string(), done, finished: false })
    }

    /// The wait for a first contact in flight, registered under the lock so
    /// its end cannot be missed; `None` when none is in flight (plan again).
    pub fn await_seeded(&self, queue: &str, group: &str) -> Option<Pin<Box<OwnedNotified>>> {
        self.with_ring(queue, group, |r| {
            r.seeding.as_ref().map(|done| {
                let mut wait = Box::pin(done.clone().notified_owned());
                wait.as_mut().enable();
                wait
            })
        })
        .flatten()
    }

    /// Forgets rings after their cursors moved behind the ring's back (a seek,
    /// a deleted group or queue): the next pop takes the SQL path and builds
    /// the ring anew. `None` matches every queue or every group.
    pub fn forget(&self, queue: Option<&str>, group: Option<&str>) {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        rings.retain(|name, q| {
            if queue.is_some_and(|want| want != name) {
                return true;
            }
            q.groups.retain(|g, _| group.is_some_and(|want| want != g));
            !q.groups.is_empty()
        });
    }

    /// `count` messages committed to partition `pid` of `queue`: one entry
    /// in the queue's feed, which every group's ring applies when next used
    /// (at once for rings a pop waits on).
    pub fn pushed(&self, queue: &str, pid: i64, partition: &str, count: u64) {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        let Some(q) = rings.get_mut(queue) else { return };
        q.feed.push(pid, partition, count);
        if !q.waiting.is_empty() {
            let QueueRings { groups, feed, waiting } = q;
            // A waiter stays listed while its ring has nothing ready and
            // members out (the state `await_return` waits in).
            waiting.retain(|g| {
                groups.get_mut(g).is_some_and(|r| {
                    feed.sync(r);
                    r.ready.is_empty() && !r.members.is_empty()
                })
            });
        }
        if q.feed.order.len() > FEED_CAP {
            q.sync_all();
        }
    }

    /// Offers a partition to every ring of `queue` again, its depth unknown
    /// (the revisit wheel: a hidden head has become visible).
    pub fn reoffer(&self, queue: &str, pid: i64, partition: &str) {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        if let Some(q) = rings.get_mut(queue) {
            let name: Arc<str> = Arc::from(partition);
            for ring in q.groups.values_mut() {
                q.feed.sync(ring);
                ring.offer(pid, &name);
                ring.estimates.insert(pid, None);
            }
        }
    }

    /// Messages believed ready to claim for (queue, group): `None` when the
    /// ring cannot say (no ring, or a ready member of unknown depth).
    pub fn estimate(&self, queue: &str, group: &str) -> Option<u64> {
        self.with_ring(queue, group, |r| {
            r.ready.iter().try_fold(0u64, |sum, (pid, _)| r.estimates.get(pid).copied().flatten().map(|n| sum + n))
        })
        .flatten()
    }

    /// Adds every partition SQL says has pending data (the tests' reseed of
    /// a whole queue; the broker reseeds a window at a time, `reseed_window`).
    #[cfg(test)]
    pub fn reseed(&self, queue: &str, group: &str, pending: Vec<(i64, String)>) {
        self.with_ring(queue, group, |r| r.reseed(pending, jittered(self.reseed_every)));
    }

    /// The rest of a first contact's seed, a chunk at a time as the group's
    /// cursors are written behind it (`pop::cursor_seed`): offered like a
    /// reseed's finds, without moving the ring's reseed clock.
    pub fn extend_seed(&self, queue: &str, group: &str, pending: Vec<(i64, String)>) {
        self.with_ring(queue, group, |r| r.offer_pending(pending));
    }

    /// Where (queue, group)'s next reseed window starts ("": no ring, or
    /// the queue's first partition).
    pub fn reseed_after(&self, queue: &str, group: &str) -> String {
        self.with_ring(queue, group, |r| r.reseed_after.clone()).unwrap_or_default()
    }

    /// A reseed of one window: adds what it found pending and moves the
    /// ring's walk on.
    pub fn reseed_window(&self, queue: &str, group: &str, found: super::claim::ReseedWindow) {
        self.with_ring(queue, group, |r| {
            r.reseed(found.pending, jittered(self.reseed_every));
            r.reseed_after = found.next_after;
        });
    }

    /// Takes up to `k` ready candidates out of the ring.
    pub fn checkout(self: &Arc<Self>, queue: &str, group: &str, k: usize) -> Checkout {
        self.checkout_sized(queue, group, k, None)
    }

    /// Takes up to `k` ready candidates out of the ring, and no more than a
    /// claim of `batch` messages is likely to need once the ring knows how
    /// many messages its claims find per partition: the batch over that
    /// depth, a quarter more, and two. The set-based claim locks every
    /// candidate's cursor row it is given up to the batch or the partition
    /// cap; a drain of 5 messages a partition with a cap of 50 locked 50 rows
    /// to claim 20, and locking about as many as it claims drained 100,000
    /// such partitions 10–25 % faster (docs/PERFORMANCE.md, issue 51).
    /// Candidates it leaves stay ready for the next pop.
    pub fn checkout_sized(self: &Arc<Self>, queue: &str, group: &str, k: usize, batch: Option<u32>) -> Checkout {
        let (taken, deep) = self
            .with_ring(queue, group, |r| {
                r.last_used = Instant::now();
                let needed = batch.zip(r.depth).map_or(usize::MAX, |(batch, depth)| {
                    let partitions = f64::from(batch) / depth.max(1.0);
                    (partitions * 1.25).ceil() as usize + 2
                });
                let n = k.min(needed).min(r.ready.len());
                let taken: Vec<(i64, Arc<str>)> = r.ready.drain(..n).collect();
                for (pid, _) in &taken {
                    r.members.insert(*pid, Member::Out { dirty: false });
                }
                (taken, r.deep)
            })
            .unwrap_or_default();
        Checkout {
            list: self.clone(),
            queue: queue.to_string(),
            group: group.to_string(),
            candidates: taken,
            deep,
            depth: None,
        }
    }

    /// Settles a pop's candidates under one lock (a pop at 100,000
    /// partitions checks out 256 and settled them one lock and one wake-up
    /// each). A verdict puts the candidate back at the tail, or drops it when
    /// it was found empty and nothing was pushed to it meanwhile; `None` puts
    /// it back at the head, so unvisited ones come in reverse order.
    fn settle_all<'a>(
        &self,
        queue: &str,
        group: &str,
        candidates: impl Iterator<Item = (i64, &'a Arc<str>, Option<Verdict>)>,
        deep: Option<bool>,
        depth: Option<f64>,
    ) {
        self.with_ring(queue, group, |r| {
            if let Some(deep) = deep {
                r.deep = deep;
            }
            if let Some(d) = depth {
                r.depth = Some(r.depth.map_or(d, |avg| (avg + d) / 2.0));
            }
            for (pid, name, verdict) in candidates {
                let dirty = matches!(r.members.get(&pid), Some(Member::Out { dirty: true }));
                match verdict {
                    Some(Verdict::Empty | Verdict::Drained) if !dirty => {
                        r.members.remove(&pid);
                        r.estimates.remove(&pid);
                    }
                    Some(v) => {
                        if matches!(v, Verdict::Claimed | Verdict::Drained | Verdict::Empty) {
                            r.estimates.insert(pid, None);
                        }
                        r.members.insert(pid, Member::Ready);
                        r.ready.push_back((pid, name.clone()));
                    }
                    None => {
                        r.members.insert(pid, Member::Ready);
                        r.ready.push_front((pid, name.clone()));
                    }
                }
            }
            if !r.ready.is_empty() {
                r.refilled.notify_waiters();
            }
        });
    }

    /// When nothing is ready but members are checked out (every member not
    /// ready is out: a ring holds no other kind), pops in flight hold the
    /// ring's candidates and will put back what they do not use within one
    /// claim. This is the wait for that, or for a push that adds a new
    /// candidate meanwhile, registered under the ring's lock so neither can
    /// be missed; `None` when there is nothing to wait for (candidates are
    /// ready, or the ring has no members at all).
    pub fn await_return(&self, queue: &str, group: &str) -> Option<Pin<Box<OwnedNotified>>> {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        let q = rings.get_mut(queue)?;
        let r = q.groups.get_mut(group)?;
        q.feed.sync(r);
        if !r.ready.is_empty() || r.members.is_empty() {
            return None;
        }
        let mut back = Box::pin(r.refilled.clone().notified_owned());
        back.as_mut().enable();
        // Pushes catch this ring up at once from now on, so one that adds a
        // candidate wakes the wait as `offer` does.
        if !q.waiting.contains(group) {
            q.waiting.insert(group.to_string());
        }
        Some(back)
    }

    /// Ready candidates across every ring (each caught up first).
    pub fn ready_total(&self) -> usize {
        let mut rings = self.rings.lock().expect("hot-list lock poisoned");
        let mut total = 0;
        for q in rings.values_mut() {
            for r in q.groups.values_mut() {
                q.feed.sync(r);
                total += r.ready.len();
            }
        }
        total
    }

    /// Ready candidates of a ring.
    pub fn ready_len(&self, queue: &str, group: &str) -> usize {
        self.with_ring(queue, group, |r| r.ready.len()).unwrap_or(0)
    }
}

impl Ring {
    fn reseed(&mut self, pending: Vec<(i64, String)>, period: Duration) {
        self.offer_pending(pending);
        self.last_reseed = Some(Instant::now());
        self.period = period;
    }

    /// Partitions SQL found pending, of unknown depth.
    fn offer_pending(&mut self, pending: Vec<(i64, String)>) {
        for (pid, name) in pending {
            if !self.members.contains_key(&pid) {
                self.estimates.insert(pid, None);
            }
            self.offer(pid, &Arc::from(name.as_str()));
        }
    }

    /// A partition pushed since the ring last caught up, `since` messages
    /// (`None`: how many is unknown).
    fn apply(&mut self, pid: i64, name: &Arc<str>, since: Option<u64>) {
        let fresh = !self.members.contains_key(&pid);
        self.offer(pid, name);
        let e = self.estimates.entry(pid).or_insert(if fresh { Some(0) } else { None });
        *e = since.and_then(|n| e.map(|m| m + n));
    }

    fn offer(&mut self, pid: i64, name: &Arc<str>) {
        match self.members.get_mut(&pid) {
            None => {
                self.members.insert(pid, Member::Ready);
                self.ready.push_back((pid, name.clone()));
                self.refilled.notify_waiters();
            }
            Some(Member::Out { dirty }) => *dirty = true,
            Some(Member::Ready) => {}
        }
    }
}

/// The lead of a first contact ([`HotList::begin_seeding`]). `finish` hands
/// the ring its first seed and lets the waiting pops in; dropped unfinished
/// (an error, a client gone), it removes the ring, so the next pop leads
/// anew, and wakes the waiters to do so.
pub struct Seeding {
    list: Arc<HotList>,
    queue: String,
    group: String,
    done: Arc<Notify>,
    finished: bool,
}

impl Seeding {
    /// Seeds the ring with `pending` and opens it. A ring that is no longer
    /// this one's (forgotten by a seek meanwhile, perhaps made anew by
    /// another first contact) is left alone: the seed may predate the seek.
    pub fn finish(mut self, pending: Vec<(i64, String)>) {
        self.finished = true;
        let period = jittered(self.list.reseed_every);
        self.list.with_ring(&self.queue, &self.group, |r| {
            if self.owns(r) {
                r.reseed(pending, period);
                r.seeding = None;
            }
        });
    }

    /// Whether `r` is the ring this first contact made.
    fn owns(&self, r: &Ring) -> bool {
        r.seeding.as_ref().is_some_and(|d| Arc::ptr_eq(d, &self.done))
    }
}

impl Drop for Seeding {
    fn drop(&mut self) {
        if !self.finished {
            let mut rings = self.list.rings.lock().expect("hot-list lock poisoned");
            if let Some(q) = rings.get_mut(&self.queue) {
                if q.groups.get(&self.group).is_some_and(|r| self.owns(r)) {
                    q.groups.remove(&self.group);
                }
                if q.groups.is_empty() {
                    rings.remove(&self.queue);
                }
            }
        }
        self.done.notify_waiters();
    }
}

/// Candidates checked out by one pop. Whatever is not settled when this is
/// dropped (the client went away mid-pop) goes back to the head of the ring.
pub struct Checkout {
    list: Arc<HotList>,
    queue: String,
    group: String,
    candidates: Vec<(i64, Arc<str>)>,
    deep: bool,
    /// Messages per partition the claim found, for the ring's average.
    depth: Option<f64>,
}

impl Checkout {
    pub fn pids(&self) -> Vec<i64> {
        self.candidates.iter().map(|(p, _)| *p).collect()
    }

    /// The candidates, with their partition names, in checkout order.
    pub fn candidates(&self) -> &[(i64, Arc<str>)] {
        &self.candidates
    }

    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    /// Whether the ring's last claim filled its batch from its first
    /// partition. A claim that takes a deep partition whole costs less as the
    /// per-partition list than as the set-based pass, which reads every
    /// candidate first and then hands it to the per-partition list anyway
    /// (docs/PERFORMANCE.md, stop 13); drains of deep partitions keep
    /// claiming that way until a claim spans several partitions again.
    pub fn deep(&self) -> bool {
        self.deep
    }

    /// Notes what a claim took from each partition, in claim order: all
    /// but the last (which the batch may have cut) say how deep partitions
    /// are, for the ring's average ([`HotList::checkout_sized`]).
    pub fn saw_spans(&mut self, spans: impl ExactSizeIterator<Item = i64>) {
        let whole = spans.len().saturating_sub(1);
        if whole > 0 {
            self.depth = Some(spans.take(whole).sum::<i64>() as f64 / whole as f64);
        }
    }

    /// Records the claim's verdicts; candidates without one were not visited
    /// and go back to the head in their original order. `deep` updates the
    /// ring's [`Checkout::deep`] (`None` leaves it).
    pub fn settle(mut self, verdicts: &HashMap<i64, Verdict>, deep: Option<bool>) {
        let candidates = std::mem::take(&mut self.candidates);
        let visited = candidates.iter().filter_map(|(pid, name)| verdicts.get(pid).map(|v| (*pid, name, Some(*v))));
        let unvisited = candidates.iter().rev().filter(|(pid, _)| !verdicts.contains_key(pid)).map(|(pid, name)| (*pid, name, None));
        self.list.settle_all(&self.queue, &self.group, visited.chain(unvisited), deep, self.depth);
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let candidates = std::mem::take(&mut self.candidates);
        if !candidates.is_empty() {
            self.list.settle_all(&self.queue, &self.group, candidates.iter().rev().map(|(pid, name)| (*pid, name, None)), None, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Arc<HotList> {
        let l = HotList::new(Duration::from_secs(3600));
        l.create("q", "g");
        l.reseed("q", "g", vec![]);
        l
    }

    #[test]
    fn a_ring_is_deep_from_the_settle_that_says_so_until_one_says_otherwise() {
        let l = list_of(3);
        let depth = |l: &Arc<HotList>| l.checkout("q", "g", 1).deep();
        assert!(!depth(&l), "a new ring");
        l.checkout("q", "g", 1).settle(&HashMap::from([(1, Verdict::Claimed)]), Some(true));
        assert!(depth(&l), "set by the settle; the checks' own checkouts, dropped, leave it");
        l.checkout("q", "g", 1).settle(&HashMap::new(), None);
        assert!(depth(&l), "None leaves it");
        l.checkout("q", "g", 2).settle(&HashMap::from([(1, Verdict::Claimed), (2, Verdict::Claimed)]), Some(false));
        assert!(!depth(&l));
    }

    #[test]
    fn without_a_ring_the_pop_takes_the_sql_path() {
        assert_eq!(HotList::new(Duration::from_secs(1)).plan("q", "g", false), Plan::NoRing);
    }

    #[test]
    fn a_new_ring_is_reseeded_first_and_an_empty_one_answers_without_sql() {
        let l = HotList::new(Duration::from_secs(3600));
        l.create("q", "g");
        assert_eq!(l.plan("q", "g", false), Plan::Claim { reseed: true });
        assert_eq!(l.plan("q", "g", false), Plan::NothingReady, "only one pop reseeds");
        l.reseed("q", "g", vec![]);
        assert_eq!(l.plan("q", "g", false), Plan::NothingReady);
    }

    #[test]
    fn pushes_feed_every_group_of_the_queue_once() {
        let l = list();
        l.create("q", "h");
        l.pushed("q", 1, "p1", 1);
        l.pushed("q", 1, "p1", 1);
        l.pushed("other", 2, "p2", 1);
        assert_eq!(l.ready_len("q", "g"), 1);
        assert_eq!(l.ready_len("q", "h"), 1);
        assert_eq!(l.plan("q", "g", false), Plan::Claim { reseed: false });
    }

    /// A ring whose members 1..=n were each pushed once, in that order.
    fn list_of(n: i64) -> Arc<HotList> {
        let l = list();
        for p in 1..=n {
            l.pushed("q", p, "p", 1);
        }
        l
    }

    #[test]
    fn verdicts_decide_who_stays() {
        let l = list_of(4);
        let c = l.checkout("q", "g", 3);
        assert_eq!(c.pids(), [1, 2, 3]);
        let verdicts = HashMap::from([(1, Verdict::Claimed), (2, Verdict::Empty)]);
        c.settle(&verdicts, None);
        // 3 was not visited: back at the head; 1 at the tail; 2 gone.
        let c = l.checkout("q", "g", 10);
        assert_eq!(c.pids(), [3, 4, 1]);
    }

    #[test]
    fn unvisited_candidates_go_back_to_the_head_in_their_order_settled_or_dropped() {
        let l = list_of(6);
        let c = l.checkout("q", "g", 5);
        c.settle(&HashMap::from([(2, Verdict::Claimed), (4, Verdict::Empty)]), None);
        let c = l.checkout("q", "g", 10);
        assert_eq!(c.pids(), [1, 3, 5, 6, 2], "1, 3, 5 unvisited at the head; 2 at the tail; 4 gone");
        drop(c); // a pop that went away settles nothing
        let c = l.checkout("q", "g", 2);
        assert_eq!(c.pids(), [1, 3]);
        assert_eq!(l.ready_len("q", "g"), 3);
    }

    #[tokio::test]
    async fn a_pop_that_finds_every_candidate_out_waits_for_them_to_come_back() {
        let l = list();
        assert!(l.await_return("q", "g").is_none(), "a ring without members has nothing to wait for");
        l.pushed("q", 1, "p1", 1);
        l.pushed("q", 2, "p2", 1);
        assert!(l.await_return("q", "g").is_none(), "candidates are ready");
        let c = l.checkout("q", "g", 10);
        assert_eq!(l.plan("q", "g", false), Plan::NothingReady);
        let back = l.await_return("q", "g").expect("both members are out");
        // Registered before the settle, so the wake is not lost.
        c.settle(&HashMap::from([(1, Verdict::Claimed)]), None);
        tokio::time::timeout(Duration::from_secs(1), back).await.expect("the settle wakes the waiter");
        assert_eq!(l.plan("q", "g", false), Plan::Claim { reseed: false });
        // Candidates that leave as empty wake nobody: there is nothing to take.
        let c = l.checkout("q", "g", 10);
        assert_eq!(c.pids(), [2, 1]);
        let back = l.await_return("q", "g").expect("out again");
        c.settle(&HashMap::from([(1, Verdict::Empty), (2, Verdict::Empty)]), None);
        assert!(tokio::time::timeout(Duration::from_millis(50), back).await.is_err());
        assert!(l.await_return("q", "g").is_none(), "and the ring is empty now");
        // A push that adds a candidate while every member is out wakes it too.
        l.pushed("q", 3, "p3", 1);
        let _c = l.checkout("q", "g", 10);
        let back = l.await_return("q", "g").expect("p3 is out");
        l.pushed("q", 4, "p4", 1);
        tokio::time::timeout(Duration::from_secs(1), back).await.expect("the push wakes the waiter");
    }

    #[test]
    fn a_push_during_checkout_survives_an_empty_verdict() {
        let l = list();
        l.pushed("q", 7, "p", 1);
        let c = l.checkout("q", "g", 1);
        l.pushed("q", 7, "p", 1);
        c.settle(&HashMap::from([(7, Verdict::Empty)]), None);
        assert_eq!(l.ready_len("q", "g"), 1);
    }

    /// A drained partition leaves the ring like an empty one, unless a push
    /// reached it while it was out; a claimed one goes back to the tail.
    #[test]
    fn a_drained_verdict_drops_a_member_unless_pushed_meanwhile() {
        let l = list_of(3);
        let c = l.checkout("q", "g", 3);
        l.pushed("q", 2, "p", 1);
        c.settle(&HashMap::from([(1, Verdict::Drained), (2, Verdict::Drained), (3, Verdict::Claimed)]), None);
        assert_eq!(l.checkout("q", "g", 10).pids(), [2, 3]);
    }

    /// Once claims have said how deep partitions are, a pop checks out
    /// about what its batch needs: 100 / 5 × 1.25 + 2 = 27 of 40.
    #[test]
    fn a_checkout_is_sized_by_the_depth_claims_found() {
        let l = list_of(40);
        assert_eq!(l.checkout_sized("q", "g", 30, Some(100)).pids().len(), 30, "no depth known yet");
        let mut c = l.checkout("q", "g", 4);
        c.saw_spans([5, 5, 5, 3].into_iter());
        c.settle(&HashMap::from([(1, Verdict::Claimed), (2, Verdict::Claimed), (3, Verdict::Claimed), (4, Verdict::Claimed)]), None);
        assert_eq!(l.checkout_sized("q", "g", 256, Some(100)).pids().len(), 27, "the cut last span is not a depth");
        assert_eq!(l.checkout_sized("q", "g", 8, Some(100)).pids().len(), 8, "never more than asked");
        let mut c = l.checkout("q", "g", 1);
        c.saw_spans([7].into_iter());
        c.settle(&HashMap::new(), None);
        assert_eq!(l.checkout_sized("q", "g", 256, Some(100)).pids().len(), 27, "one span says nothing of depth");
        assert_eq!(l.checkout_sized("q", "g", 256, None).pids().len(), 40, "no batch, no cap");
    }

    #[test]
    fn the_estimate_counts_pushes_into_known_empty_members_only() {
        let l = list();
        assert_eq!(l.estimate("q", "g"), Some(0));
        l.pushed("q", 1, "p", 3);
        l.pushed("q", 2, "p", 2);
        l.pushed("q", 1, "p", 1);
        assert_eq!(l.estimate("q", "g"), Some(6));
        // (A ring that catches up with several pushes at once takes them in
        // the order of their latest push: 2, then 1.)
        let c = l.checkout("q", "g", 2);
        c.settle(&HashMap::from([(1, Verdict::Claimed)]), None);
        assert_eq!(l.estimate("q", "g"), None, "a claimed member may hold more than we know");
        l.reseed("q", "g", vec![(9, "r".into())]);
        assert_eq!(l.estimate("q", "g"), None);
        assert_eq!(HotList::new(Duration::from_secs(1)).estimate("x", "g"), None);
    }

    #[test]
    fn a_ring_catches_up_with_the_feed_when_used_each_partition_once() {
        let l = list();
        l.create("q", "h");
        for _ in 0..1000 {
            l.pushed("q", 1, "p1", 1);
        }
        l.pushed("q", 2, "p2", 5);
        assert_eq!(l.feed_entries(), 2, "the feed holds a partition once, however often it was pushed");
        assert_eq!(l.estimate("q", "g"), Some(1005));
        assert_eq!(l.checkout("q", "g", 10).pids(), [1, 2], "in the order of their latest push");
        // h has not looked yet: the feed keeps what it has not applied.
        l.evict_idle(Duration::from_secs(3600));
        assert_eq!(l.feed_entries(), 2);
        assert_eq!(l.ready_len("q", "h"), 2);
        l.evict_idle(Duration::from_secs(3600));
        assert_eq!(l.feed_entries(), 0, "every ring applied them: trimmed");
        // A partition drained empty and pushed again is counted from zero.
        let c = l.checkout("q", "h", 10);
        c.settle(&HashMap::from([(1, Verdict::Empty), (2, Verdict::Empty)]), None);
        l.pushed("q", 1, "p1", 3);
        l.pushed("q", 1, "p1", 4);
        assert_eq!(l.estimate("q", "h"), Some(7));
    }

    #[test]
    fn a_feed_no_ring_reads_stays_bounded() {
        let l = list();
        for pid in 0..(FEED_CAP as i64 + 10) {
            l.pushed("q", pid, "p", 1);
        }
        assert!(l.feed_entries() <= FEED_CAP, "{} entries", l.feed_entries());
        assert_eq!(l.ready_len("q", "g"), FEED_CAP + 10, "nothing was lost on the way");
        assert_eq!(l.estimate("q", "g"), Some(FEED_CAP as u64 + 10));
    }

    #[test]
    fn idle_rings_go_and_busy_ones_stay() {
        let l = HotList::new(Duration::from_secs(3600));
        l.create("q", "gone");
        l.create("q", "busy");
        l.pushed("q", 7, "p", 1);
        let out = l.checkout("q", "busy", 1);
        assert_eq!(out.pids(), vec![7]);
        assert_eq!(l.evict_idle(Duration::from_secs(3600)), 0, "both were used just now");
        assert_eq!(l.evict_idle(Duration::ZERO), 1, "the idle one goes; the one with a candidate out stays");
        assert_eq!(l.rings(), 1);
        assert_eq!(l.plan("q", "gone", false), Plan::NoRing, "its next pop builds it again");
        drop(out);
        assert_eq!(l.evict_idle(Duration::ZERO), 1);
        assert_eq!(l.rings(), 0);
    }

    #[test]
    fn forgetting_drops_exactly_the_named_rings() {
        let l = list();
        l.create("q", "h");
        l.create("r", "g");
        l.forget(Some("q"), Some("g"));
        assert_eq!(l.plan("q", "g", false), Plan::NoRing);
        assert_ne!(l.plan("q", "h", false), Plan::NoRing);
        l.forget(None, Some("g"));
        assert_eq!(l.plan("r", "g", false), Plan::NoRing);
        l.forget(Some("q"), None);
        assert_eq!(l.plan("q", "h", false), Plan::NoRing);
    }

    #[test]
    fn a_dropped_checkout_puts_its_candidates_back() {
        let l = list();
        l.pushed("q", 1, "p", 1);
        l.pushed("q", 2, "p", 1);
        {
            let c = l.checkout("q", "g", 2);
            assert_eq!(l.ready_len("q", "g"), 0);
            drop(c);
        }
        assert_eq!(l.ready_len("q", "g"), 2);
        assert_eq!(l.checkout("q", "g", 1).pids(), [1], "in their original order");
    }

    #[test]
    fn reseed_times_are_spread_so_rings_created_together_do_not_fall_due_together() {
        let every = Duration::from_secs(100);
        let l = HotList::new(every);
        let mut waits = Vec::new();
        for q in 0..50 {
            let q = format!("q{q}");
            l.create(&q, "g");
            l.reseed(&q, "g", vec![]);
            waits.push(l.until_reseed(&q, "g"));
        }
        let (min, max) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
        assert!(*min >= every.mul_f64(0.74) && *max <= every.mul_f64(1.25), "{min:?}..{max:?}");
        assert!(*max - *min > every / 10, "50 rings spread over only {:?}", *max - *min);
    }

    #[test]
    fn with_the_background_reseeder_a_long_poll_leaves_an_idle_rings_reseed_to_it() {
        let l = HotList::new(Duration::from_secs(3600));
        l.reseed_in_background();
        l.create("q", "g");
        assert_eq!(l.plan("q", "g", true), Plan::NothingReady, "a parked pop does not reseed an idle ring");
        assert_eq!(l.take_due_idle(10), vec![("q".to_string(), "g".to_string())]);
        assert!(l.take_due_idle(10).is_empty(), "taken once per period");
        l.reseed("q", "g", vec![(7, "p".into())]);
        assert_eq!(l.plan("q", "g", true), Plan::Claim { reseed: false }, "what the reseed found is claimed");

        let m = HotList::new(Duration::from_secs(3600));
        m.reseed_in_background();
        m.create("q", "g");
        assert_eq!(m.plan("q", "g", false), Plan::Claim { reseed: true }, "a pop that answers at once reseeds inline");
        assert!(m.take_due_idle(10).is_empty());
    }

    #[tokio::test]
    async fn one_pop_leads_a_first_contact_and_the_others_wait_for_its_seed() {
        let l = HotList::new(Duration::from_secs(3600));
        l.reseed_in_background();
        assert_eq!(l.plan("q", "g", false), Plan::NoRing);
        let lead = l.begin_seeding("q", "g").expect("the first pop leads");
        assert!(l.begin_seeding("q", "g").is_none(), "one leader per (queue, group)");
        assert_eq!(l.plan("q", "g", false), Plan::Seeding);
        assert_eq!(l.plan("q", "g", true), Plan::Seeding);
        assert!(l.take_due_idle(10).is_empty(), "the background reseeder leaves a seeding ring alone");
        let wait = l.await_seeded("q", "g").expect("a first contact is in flight");
        // A push during the first contact is kept, beside what the seed finds.
        l.pushed("q", 9, "p9", 1);
        lead.finish(vec![(1, "p1".into()), (9, "p9".into())]);
        tokio::time::timeout(Duration::from_secs(1), wait).await.expect("finishing wakes the waiters");
        assert!(l.await_seeded("q", "g").is_none());
        assert_eq!(l.plan("q", "g", false), Plan::Claim { reseed: false }, "the seed was just read");
        assert_eq!(l.checkout("q", "g", 10).pids(), [9, 1]);
    }

    #[tokio::test]
    async fn a_first_contact_dropped_unfinished_leaves_no_ring_and_wakes_its_waiters() {
        let l = HotList::new(Duration::from_secs(3600));
        let lead = l.begin_seeding("q", "g").unwrap();
        let _other = l.begin_seeding("q", "h").unwrap();
        let wait = l.await_seeded("q", "g").unwrap();
        drop(lead);
        tokio::time::timeout(Duration::from_secs(1), wait).await.expect("the failed lead wakes the waiters");
        assert_eq!(l.plan("q", "g", false), Plan::NoRing, "the next pop leads anew");
        assert_eq!(l.plan("q", "h", false), Plan::Seeding, "another group's first contact is untouched");
        // A ring forgotten during its first contact (a seek) is not brought back.
        let lead = l.begin_seeding("q", "g").unwrap();
        l.forget(Some("q"), Some("g"));
        lead.finish(vec![(1, "p1".into())]);
        assert_eq!(l.plan("q", "g", false), Plan::NoRing);
        // Nor is one made anew meanwhile by another first contact seeded
        // or opened by the old one.
        let old = l.begin_seeding("q", "g").unwrap();
        l.forget(Some("q"), Some("g"));
        let new = l.begin_seeding("q", "g").unwrap();
        old.finish(vec![(1, "p1".into())]);
        assert_eq!(l.plan("q", "g", false), Plan::Seeding, "the new first contact is still in flight");
        new.finish(vec![(2, "p2".into())]);
        assert_eq!(l.checkout("q", "g", 10).pids(), [2]);
    }
}
