//! The dedup window in memory: which transactionIds each partition this
//! broker writes already holds, so that a push is checked here instead of in
//! a per-message index in PostgreSQL.
//!
//! Why: the index (one random-key B-tree row per message) was two thirds of
//! PostgreSQL's cost of a push on a queue with a window, which every official
//! client's push is (docs/PERFORMANCE.md). Segments now carry their frames'
//! hashes (`0019_dedup_in_segments.sql`), and this memory holds the hashes of
//! the window's segments of each partition the broker writes.
//!
//! The memory is never the only guard. Each write tells PostgreSQL what the
//! memory covers ([`Known`]: the partition id and the last offset), and under
//! the partition lock PostgreSQL checks whatever was written after that (by
//! another broker, by a transaction, before a restart) and sends it back
//! ([`Answer::seen`]), so the memory catches up. A partition the memory does
//! not know is checked against its whole window there, once.
//!
//! A partition's entry knows:
//! * `known`: the last offset it covers; every hash of a segment at or below
//!   it that is still inside the window is in `hashes`;
//! * `hashes`: hash → offset of the message that carried it;
//! * `segments`: base offset → created_at of each segment it holds, which
//!   dates an offset, and expires the window in whole segments.
//!
//! What the memory finds is a candidate, not a verdict: one query fetches
//! the original's id and asks PostgreSQL whether it is still inside its
//! queue's window by PostgreSQL's clock and the window as it is now (it may
//! have been shortened, or retention may have removed the original). So the
//! memory needs only to keep enough: it dates hashes on its estimate of the
//! database's clock and keeps them a few seconds past the window it knows.
//! A window that has grown past what the memory kept is caught by
//! PostgreSQL: a write names the window its memory keeps, and a smaller one
//! is checked as if unknown.
//!
//! Memory follows the partitions being written: about 40 bytes per id inside
//! the window (rate × window). Past `QUEEN_DEDUP_MEMORY_ENTRIES` the
//! partitions not written for a minute are forgotten, least recent first, and
//! are checked against their whole window in PostgreSQL on their next write.
//! Partitions written within the minute are never forgotten, even past the
//! cap: forgetting a partition still being written would cost a scan of its
//! window on every write (docs/OPERATIONS.md says how to size the cap).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::db::DbError;

/// How long past its window (µs) the memory keeps a hash: it dates hashes
/// on an estimate of the database's clock, off by a write's latency or a
/// step of this host's clock.
const EDGE_US: i64 = 5_000_000;
/// A partition written this recently is never forgotten to make room.
const ACTIVE: Duration = Duration::from_secs(60);

/// What a write may tell PostgreSQL the broker already knows of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    pub pid: i64,
    pub last: i64,
    /// The window (seconds) the memory has kept hashes for.
    pub window: i32,
}

/// A stored segment: its base offset, created_at (µs since the epoch) and
/// the hashes of its frames in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub base: i64,
    pub at_us: i64,
    pub hashes: Vec<i64>,
}

/// What one write's answer tells the memory about one partition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub pid: i64,
    /// The queue's dedup window in seconds.
    pub window: i32,
    /// The partition's last offset before the write.
    pub prev: i64,
    /// The partition's first stored offset: below it retention removed
    /// segments, and their hashes with them.
    pub log_start: i64,
    /// Segments inside the window the memory did not know.
    pub seen: Vec<Segment>,
}

/// What the memory found for a batch about to be written.
#[derive(Debug, Default, PartialEq)]
pub struct Check {
    /// What the write may claim (None: the memory knows nothing).
    pub known: Option<Known>,
    /// Candidates: (index into the batch, offset of the message that held
    /// the id), to be confirmed by PostgreSQL (`segment::originals`).
    pub dups: Vec<(usize, i64)>,
}

/// One partition's window.
#[derive(Default)]
struct Window {
    pid: i64,
    known: Option<i64>,
    /// The shortest window hashes were expired with since PostgreSQL last
    /// checked the whole window: the memory is complete for that long.
    horizon: i32,
    /// Offsets below this are gone or out of the window; `hashes` may still
    /// hold some until the next sweep.
    floor: i64,
    hashes: HashMap<i64, i64>,
    /// base offset → (created_at µs, hashes it added).
    segments: BTreeMap<i64, (i64, usize)>,
    /// Entries of `hashes` known to be below `floor`.
    stale: usize,
    /// Last use (for eviction).
    used: Option<Instant>,
}

impl Window {
    /// Drops whole segments older than `cutoff_us`, and sweeps the map once
    /// enough of it is stale.
    fn expire(&mut self, cutoff_us: i64) {
        while let Some((&base, &(at, n))) = self.segments.first_key_value() {
            if at >= cutoff_us {
                break;
            }
            self.segments.remove(&base);
            self.stale += n;
            self.floor = self.floor.max(self.segments.first_key_value().map_or(base + n as i64, |(&b, _)| b));
        }
        if self.stale > 0 && self.stale * 2 >= self.hashes.len() {
            let floor = self.floor;
            self.hashes.retain(|_, off| *off >= floor);
            self.stale = 0;
        }
    }

    /// Forgets what lies below `log_start` (removed by retention).
    fn raise_floor(&mut self, log_start: i64) {
        if log_start <= self.floor {
            return;
        }
        self.floor = log_start;
        let gone: Vec<i64> = self.segments.range(..log_start).map(|(&b, _)| b).collect();
        for b in gone {
            if let Some((_, n)) = self.segments.remove(&b) {
                self.stale += n;
            }
        }
    }

    fn add(&mut self, seg: &Segment) {
        if seg.base < self.floor || self.segments.contains_key(&seg.base) {
            return;
        }
        for (i, &h) in seg.hashes.iter().enumerate() {
            let off = seg.base + i as i64;
            self.hashes.entry(h).and_modify(|o| *o = (*o).max(off)).or_insert(off);
        }
        self.segments.insert(seg.base, (seg.at_us, seg.hashes.len()));
    }
}

/// Each (queue, partition)'s window.
type Windows = HashMap<(String, String), Arc<Mutex<Window>>>;

/// The broker's dedup memory. Shared by every push path (`Coalescer`).
pub struct DedupCache {
    parts: Mutex<Windows>,
    /// Hashes held over all partitions.
    entries: AtomicUsize,
    cap: usize,
    /// The database's clock minus this broker's, µs, from the last write.
    skew_us: AtomicI64,
    started: Instant,
    /// When the memory last found itself over the cap with nothing idle to
    /// forget (ms since `started`, 0: never), so it does not look again on
    /// every write.
    full_since: AtomicU64,
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl DedupCache {
    pub fn new(cap: usize) -> DedupCache {
        DedupCache {
            parts: Mutex::new(HashMap::new()),
            entries: AtomicUsize::new(0),
            cap: cap.max(1),
            skew_us: AtomicI64::new(0),
            started: Instant::now(),
            full_since: AtomicU64::new(0),
        }
    }

    /// Hashes held now (the `queen_dedup_memory_entries` gauge).
    pub fn entries(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }

    /// The database's clock as this broker estimates it, µs.
    fn db_now_us(&self) -> i64 {
        now_us() + self.skew_us.load(Ordering::Relaxed)
    }

    /// Learns the database's clock from a created_at it just stamped.
    pub fn observe_clock(&self, at_us: i64) {
        self.skew_us.store(at_us - now_us(), Ordering::Relaxed);
    }

    fn window_of(&self, queue: &str, partition: &str) -> Option<Arc<Mutex<Window>>> {
        let parts = self.parts.lock().expect("dedup map lock poisoned");
        parts.get(&(queue.to_string(), partition.to_string())).cloned()
    }

    /// Which of `hashes` the partition already holds inside a window of
    /// `window` seconds, and what a write may claim to know.
    pub fn check(&self, queue: &str, partition: &str, window: i32, hashes: &[i64]) -> Check {
        let Some(w) = self.window_of(queue, partition) else { return Check::default() };
        let mut w = w.lock().expect("dedup window lock poisoned");
        w.used = Some(Instant::now());
        let before = w.hashes.len();
        let cutoff = self.db_now_us() - i64::from(window) * 1_000_000 - EDGE_US;
        w.expire(cutoff);
        w.horizon = w.horizon.min(window);
        self.entries.fetch_sub(before - w.hashes.len(), Ordering::Relaxed);
        let Some(last) = w.known else { return Check::default() };
        let mut dups = Vec::new();
        for (i, h) in hashes.iter().enumerate() {
            let Some(&off) = w.hashes.get(h).filter(|&&off| off >= w.floor) else { continue };
            if w.segments.range(..=off).next_back().is_some_and(|(_, &(at, _))| at >= cutoff) {
                dups.push((i, off));
            }
        }
        Check { known: Some(Known { pid: w.pid, last, window: w.horizon }), dups }
    }

    /// Takes a write's answer: the segments PostgreSQL sent back and, when
    /// the write committed a segment, that segment (`own`). `based_on` is
    /// what the write claimed. Only committed segments may be given here.
    pub fn absorb(&self, queue: &str, partition: &str, based_on: Option<Known>, answer: &Answer, own: Option<&Segment>) {
        if answer.window <= 0 {
            // The queue keeps no window (any more): nothing to remember.
            let gone = self.parts.lock().expect("dedup map lock poisoned").remove(&(queue.to_string(), partition.to_string()));
            if let Some(w) = gone {
                self.entries.fetch_sub(w.lock().expect("dedup window lock poisoned").hashes.len(), Ordering::Relaxed);
            }
            return;
        }
        let w = {
            let mut parts = self.parts.lock().expect("dedup map lock poisoned");
            parts.entry((queue.to_string(), partition.to_string())).or_default().clone()
        };
        let mut guard = w.lock().expect("dedup window lock poisoned");
        let w = &mut *guard;
        let before = w.hashes.len();
        if w.pid != answer.pid {
            // A new entry, or the partition was removed and created again.
            *w = Window { pid: answer.pid, ..Window::default() };
        }
        w.used = Some(Instant::now());
        // PostgreSQL checked the whole window when the write claimed
        // nothing of this partition; otherwise the segments it sent extend
        // what the memory covered only if the memory still covers what the
        // write claimed.
        // A claim past the partition's tail means the database lost writes
        // the memory saw (a failover to a standby that lagged): PostgreSQL
        // checked the whole window, and the memory starts over from it.
        let regressed = based_on.is_some_and(|k| k.pid == answer.pid && k.last > answer.prev);
        if regressed {
            *w = Window { pid: answer.pid, ..Window::default() };
        }
        let whole = regressed || based_on.is_none_or(|k| k.pid != answer.pid || k.window < answer.window);
        let contiguous = whole || based_on.is_some_and(|k| w.known.is_some_and(|last| last >= k.last));
        if whole {
            w.horizon = answer.window;
        }
        w.raise_floor(answer.log_start);
        for seg in &answer.seen {
            w.add(seg);
        }
        let mut through = answer.prev;
        if let Some(seg) = own {
            w.add(seg);
            through = seg.base + seg.hashes.len() as i64 - 1;
        }
        if contiguous {
            w.known = Some(w.known.map_or(through, |k| k.max(through)));
        }
        let after = w.hashes.len();
        drop(guard);
        if after >= before {
            let total = self.entries.fetch_add(after - before, Ordering::Relaxed) + (after - before);
            if total > self.cap {
                self.evict(queue, partition);
            }
        } else {
            self.entries.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Forgets partitions not written for `ACTIVE`, least recent first,
    /// until a quarter of the cap is free or none is left to forget.
    fn evict(&self, queue: &str, partition: &str) {
        let now = self.now_ms();
        let full = self.full_since.load(Ordering::Relaxed);
        if full != 0 && now - full < 1_000 {
            return; // looked less than a second ago and found nothing to forget
        }
        let mut parts = self.parts.lock().expect("dedup map lock poisoned");
        // (key, idle for, entries): the most idle first, this partition last.
        let mut order: Vec<((String, String), Duration, usize)> = parts
            .iter()
            .map(|(k, w)| {
                let w = w.lock().expect("dedup window lock poisoned");
                let mine = k.0 == queue && k.1 == partition;
                let idle = if mine { Duration::ZERO } else { w.used.map_or(Duration::MAX, |u| u.elapsed()) };
                (k.clone(), idle, w.hashes.len())
            })
            .collect();
        order.sort_by_key(|o| std::cmp::Reverse(o.1));
        let target = self.cap - self.cap / 4;
        // Counted afresh: a write may still hold a window forgotten earlier.
        let mut total: usize = order.iter().map(|o| o.2).sum();
        let mut forgotten = 0;
        for (key, idle, n) in order {
            if total <= target || idle < ACTIVE {
                break;
            }
            parts.remove(&key);
            total -= n;
            forgotten += 1;
        }
        self.entries.store(total, Ordering::Relaxed);
        self.full_since.store(if total > self.cap { now } else { 0 }, Ordering::Relaxed);
        static EVICTING: crate::telemetry::Throttle = crate::telemetry::Throttle::new(60_000);
        if let Some(skipped) = EVICTING.admit() {
            if total > self.cap {
                tracing::warn!(entries = total, cap = self.cap, forgotten, skipped, "dedup memory over QUEEN_DEDUP_MEMORY_ENTRIES with every partition in it written within a minute: kept, since forgetting one would cost a scan of its window per write");
            } else {
                tracing::info!(forgotten, skipped, cap = self.cap, "dedup memory full: forgot the partitions written least recently (QUEEN_DEDUP_MEMORY_ENTRIES)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(pid: i64, prev: i64, seen: Vec<Segment>) -> Answer {
        Answer { pid, window: 3600, prev, log_start: 0, seen }
    }

    fn seg(base: i64, hashes: &[i64]) -> Segment {
        Segment { base, at_us: now_us(), hashes: hashes.to_vec() }
    }

    #[test]
    fn an_unknown_partition_claims_nothing_and_finds_nothing() {
        let c = DedupCache::new(1000);
        assert_eq!(c.check("q", "p", 3600, &[1, 2]), Check::default());
    }

    #[test]
    fn a_whole_window_answer_then_own_writes_are_known() {
        let c = DedupCache::new(1000);
        c.absorb("q", "p", None, &answer(7, 9, vec![seg(0, &[10, 11]), seg(2, &[12])]), Some(&seg(10, &[13, 14])));
        let got = c.check("q", "p", 3600, &[12, 99, 14]);
        assert_eq!(got.known, Some(Known { pid: 7, last: 11, window: 3600 }));
        assert_eq!(got.dups, vec![(0, 2), (2, 11)]);
        assert_eq!(c.entries(), 5);
    }

    #[test]
    fn a_delta_extends_only_contiguous_knowledge() {
        let c = DedupCache::new(1000);
        c.absorb("q", "p", None, &answer(7, -1, vec![]), Some(&seg(0, &[1])));
        // Another writer's segment 1..=2 comes back with our write at 3.
        let k = Known { pid: 7, last: 0, window: 3600 };
        c.absorb("q", "p", Some(k), &answer(7, 2, vec![seg(1, &[2, 3])]), Some(&seg(3, &[4])));
        assert_eq!(c.check("q", "p", 3600, &[3]).known, Some(Known { pid: 7, last: 3, window: 3600 }));
        // An answer based on knowledge the memory no longer has (it was
        // forgotten and rebuilt lower) adds hashes but claims nothing more.
        let far = Known { pid: 7, last: 50, window: 3600 };
        c.absorb("q", "p", Some(far), &answer(7, 60, vec![seg(51, &[5])]), None);
        let got = c.check("q", "p", 3600, &[5]);
        assert_eq!(got.known, Some(Known { pid: 7, last: 3, window: 3600 }));
        assert_eq!(got.dups, vec![(0, 51)]);
    }

    #[test]
    fn a_memory_ahead_of_the_database_starts_over() {
        let c = DedupCache::new(1000);
        c.absorb("q", "p", None, &answer(7, -1, vec![]), Some(&seg(0, &[1, 2, 3, 4])));
        // A failover lost offsets 2 and 3: the new primary's tail is 1.
        let k = Known { pid: 7, last: 3, window: 3600 };
        c.absorb("q", "p", Some(k), &answer(7, 1, vec![seg(0, &[1, 2])]), Some(&seg(2, &[9])));
        let got = c.check("q", "p", 3600, &[1, 3, 9]);
        assert_eq!(got.known, Some(Known { pid: 7, last: 2, window: 3600 }));
        assert_eq!(got.dups, vec![(0, 0), (2, 2)], "the lost id 3 is forgotten");
    }

    #[test]
    fn a_recreated_partition_starts_over() {
        let c = DedupCache::new(1000);
        c.absorb("q", "p", None, &answer(7, -1, vec![]), Some(&seg(0, &[1, 2])));
        c.absorb("q", "p", Some(Known { pid: 7, last: 1, window: 3600 }), &answer(8, -1, vec![]), Some(&seg(0, &[3])));
        let got = c.check("q", "p", 3600, &[1, 3]);
        assert_eq!(got.known, Some(Known { pid: 8, last: 0, window: 3600 }));
        assert_eq!(got.dups, vec![(1, 0)]);
        assert_eq!(c.entries(), 1);
    }

    #[test]
    fn old_segments_leave_the_window_and_retention_takes_its_own() {
        let c = DedupCache::new(1000);
        let old = Segment { base: 0, at_us: now_us() - 3_700_000_000, hashes: vec![1, 2] };
        c.absorb("q", "p", None, &answer(7, 4, vec![old, seg(2, &[3]), seg(3, &[4, 5])]), None);
        let got = c.check("q", "p", 3600, &[1, 2, 3, 4]);
        assert_eq!(got.dups, vec![(2, 2), (3, 3)]);
        // Expired hashes stay in the map (never found) until a sweep.
        assert_eq!(c.entries(), 5);
        let mut a = answer(7, 4, vec![]);
        a.log_start = 3;
        c.absorb("q", "p", Some(Known { pid: 7, last: 4, window: 3600 }), &a, None);
        assert_eq!(c.check("q", "p", 3600, &[3, 4]).dups, vec![(1, 3)]);
    }

    #[test]
    fn hashes_are_kept_a_little_past_the_window_and_a_shorter_window_is_claimed() {
        let c = DedupCache::new(1000);
        let just_past = Segment { base: 0, at_us: now_us() - 3_601_000_000, hashes: vec![1] };
        let long_past = Segment { base: 1, at_us: now_us() - 3_700_000_000, hashes: vec![2] };
        c.absorb("q", "p", None, &answer(7, 1, vec![just_past, long_past]), Some(&seg(2, &[3])));
        let got = c.check("q", "p", 3600, &[1, 2, 3]);
        assert_eq!(got.dups, vec![(0, 0), (2, 2)], "a candidate just past the edge: PostgreSQL decides");
        // Checked with a shorter window, the memory forgets more, and says so.
        let got = c.check("q", "p", 60, &[1, 3]);
        assert_eq!(got.dups, vec![(1, 2)]);
        assert_eq!(got.known, Some(Known { pid: 7, last: 2, window: 60 }));
        // A whole-window answer restores the horizon.
        c.absorb("q", "p", got.known, &answer(7, 2, vec![]), Some(&seg(3, &[4])));
        assert_eq!(c.check("q", "p", 3600, &[]).known, Some(Known { pid: 7, last: 3, window: 3600 }));
    }

    /// Makes partition `p` look last written `ago` ago.
    fn backdate(c: &DedupCache, p: &str, ago: Duration) {
        let w = c.window_of("q", p).unwrap();
        let mut w = w.lock().unwrap();
        w.used = Instant::now().checked_sub(ago);
    }

    fn fill(c: &DedupCache, p: i64) {
        let hashes: Vec<i64> = (0..300).map(|h| h + p * 1000).collect();
        c.absorb("q", &p.to_string(), None, &answer(p, -1, vec![]), Some(&seg(0, &hashes)));
    }

    #[test]
    fn a_full_memory_forgets_idle_partitions_least_recent_first_and_never_active_ones() {
        let c = DedupCache::new(1000);
        for p in 0..3 {
            fill(&c, p);
        }
        // Every partition is active: the memory goes over its cap rather
        // than forget one still being written.
        fill(&c, 3);
        assert_eq!(c.entries(), 1200);
        assert_eq!(c.check("q", "0", 3600, &[0]).dups, vec![(0, 0)]);
        backdate(&c, "0", Duration::from_secs(120));
        backdate(&c, "1", Duration::from_secs(90));
        c.full_since.store(0, Ordering::Relaxed); // as if a second had passed
        fill(&c, 4);
        assert_eq!(c.entries(), 900, "the two idle ones, least recent first, until a quarter is free");
        assert_eq!(c.check("q", "0", 3600, &[0]), Check::default());
        assert_eq!(c.check("q", "1", 3600, &[1000]), Check::default());
        assert_eq!(c.check("q", "4", 3600, &[4000]).dups, vec![(0, 0)]);
    }

    #[test]
    fn a_queue_without_window_is_not_remembered() {
        let c = DedupCache::new(1000);
        let mut a = answer(7, -1, vec![]);
        a.window = 0;
        c.absorb("q", "p", None, &a, Some(&seg(0, &[1])));
        assert_eq!(c.entries(), 0);
    }
}

/// The database's transactionId hasher: the key migration 0025 wrote once.
pub async fn load_key(client: &impl deadpool_postgres::GenericClient) -> Result<crate::log::TxnHasher, DbError> {
    let row = client.query_one("SELECT key FROM queen.dedup_key", &[]).await?;
    let key: &[u8] = row.get(0);
    let key: &[u8; 16] = key.try_into().map_err(|_| DbError::Unexpected("queen.dedup_key.key is not 16 bytes".into()))?;
    Ok(crate::log::TxnHasher::new(key))
}
