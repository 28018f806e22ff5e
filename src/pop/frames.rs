//! Decompressed segments kept for the next pop of the same segment.
//!
//! Why: a segment is one zstd frame holding up to thousands of messages, and
//! a pop that takes one of them (the clients' default `batch(1)`) had to
//! decompress all of it, and PostgreSQL had to ship all of it, once per
//! message: at 1,000-message segments about 100 µs of broker CPU per message
//! went to decompressing frames it then skipped. A consumer reads a
//! segment front to back, so what one pop decompressed is what the next pop
//! of that partition needs.
//!
//! The shape: a map from (partition, base offset) to the decompressed frames
//! and where each frame starts, bounded in bytes, oldest insert evicted
//! first. Segments never change once committed (offsets are never reused),
//! so an entry is never stale; it is dropped when a pop delivers the
//! segment's last message or when the budget needs room. Only partly
//! delivered segments are kept: a pop that takes a whole segment decodes it
//! as before and caches nothing. The lease handover (`pop::handover`) asks
//! PostgreSQL not to ship a blob the broker holds here.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::log::{decompress_frames, SEGMENT_LIMIT};

/// One segment's frames, decompressed, with each frame's start.
pub struct Decoded {
    pub frames: Vec<u8>,
    starts: Vec<u32>,
}

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Decoded({} frames, {} bytes)", self.starts.len(), self.frames.len())
    }
}

impl Decoded {
    /// Decompresses a stored blob and finds its frames (length-prefixed).
    pub fn decode(blob: &[u8]) -> Result<Decoded, String> {
        let frames = decompress_frames(blob, SEGMENT_LIMIT).map_err(|e| e.to_string())?;
        let mut starts = Vec::new();
        let mut pos = 0usize;
        while pos < frames.len() {
            let len = frames
                .get(pos..pos + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                .ok_or_else(|| format!("truncated frame length at byte {pos}"))?;
            starts.push(pos as u32);
            pos = pos.checked_add(4 + len).filter(|&end| end <= frames.len()).ok_or_else(|| format!("frame at byte {pos} runs past the segment"))?;
        }
        Ok(Decoded { frames, starts })
    }

    /// Frames in the segment.
    pub fn count(&self) -> usize {
        self.starts.len()
    }

    /// The frames from the `idx`-th on (empty past the end).
    pub fn from(&self, idx: usize) -> &[u8] {
        match self.starts.get(idx) {
            Some(&start) => &self.frames[start as usize..],
            None => &[],
        }
    }

    fn size(&self) -> usize {
        self.frames.len() + self.starts.len() * 4 + 64
    }
}

#[derive(Default)]
struct Inner {
    entries: HashMap<(i64, i64), (Arc<Decoded>, i64)>,
    /// Insertion order, for eviction; may name entries already dropped.
    order: VecDeque<(i64, i64)>,
    /// The newest cached segment of each partition: (base, end offset).
    newest: HashMap<i64, (i64, i64)>,
    bytes: usize,
}

/// The bounded cache of decompressed segments.
pub struct FrameCache {
    inner: Mutex<Inner>,
    budget: usize,
}

impl FrameCache {
    /// `budget`: most bytes held (0 turns the cache off).
    pub fn new(budget: usize) -> FrameCache {
        FrameCache { inner: Mutex::default(), budget }
    }

    /// The frames of segment (`pid`, `base`): cached, or decompressed from
    /// `blob` and cached when `keep` (the segment is only partly delivered).
    pub fn frames(&self, pid: i64, base: i64, msg_count: usize, blob: &[u8], keep: bool) -> Result<Arc<Decoded>, String> {
        if let Some(d) = self.get(pid, base) {
            return Ok(d);
        }
        if blob.is_empty() {
            return Err("the segment was neither shipped nor cached".into());
        }
        let decoded = Arc::new(Decoded::decode(blob)?);
        if keep && self.budget > 0 {
            self.insert(pid, base, base + msg_count as i64 - 1, decoded.clone());
        }
        Ok(decoded)
    }

    /// The cached segment (`pid`, `base`), if held.
    pub fn get(&self, pid: i64, base: i64) -> Option<Arc<Decoded>> {
        self.lock().entries.get(&(pid, base)).map(|(d, _)| d.clone())
    }

    /// The cached segment of `pid` holding `offset`: its base and frames.
    pub fn covering(&self, pid: i64, offset: i64) -> Option<(i64, Arc<Decoded>)> {
        let inner = self.lock();
        let &(base, end) = inner.newest.get(&pid)?;
        if offset < base || offset > end {
            return None;
        }
        inner.entries.get(&(pid, base)).map(|(d, _)| (base, d.clone()))
    }

    /// The newest cached segment of `pid`: its base and frames.
    pub fn newest(&self, pid: i64) -> Option<(i64, Arc<Decoded>)> {
        let inner = self.lock();
        let &(base, _) = inner.newest.get(&pid)?;
        inner.entries.get(&(pid, base)).map(|(d, _)| (base, d.clone()))
    }

    /// A pop delivered the segment's last message: no reader of this
    /// partition's group needs it next.
    pub fn done(&self, pid: i64, base: i64) {
        let mut inner = self.lock();
        if let Some((d, _)) = inner.entries.remove(&(pid, base)) {
            inner.bytes -= d.size();
            if inner.newest.get(&pid).is_some_and(|&(b, _)| b == base) {
                inner.newest.remove(&pid);
            }
        }
    }

    /// Bytes held now (a gauge, and tests).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn insert(&self, pid: i64, base: i64, end: i64, decoded: Arc<Decoded>) {
        let size = decoded.size();
        if size > self.budget {
            return;
        }
        let mut inner = self.lock();
        if inner.entries.contains_key(&(pid, base)) {
            return;
        }
        while inner.bytes + size > self.budget {
            let Some(key) = inner.order.pop_front() else { break };
            if let Some((d, _)) = inner.entries.remove(&key) {
                inner.bytes -= d.size();
                if inner.newest.get(&key.0).is_some_and(|&(b, _)| b == key.1) {
                    inner.newest.remove(&key.0);
                }
            }
        }
        inner.bytes += size;
        inner.entries.insert((pid, base), (decoded, end));
        inner.order.push_back((pid, base));
        if inner.newest.get(&pid).is_none_or(|&(b, _)| b <= base) {
            inner.newest.insert(pid, (base, end));
        }
        // The order list may name dropped entries; keep it from growing
        // past a few times the live ones.
        if inner.order.len() > 4 * inner.entries.len() + 64 {
            let Inner { order, entries, .. } = &mut *inner;
            order.retain(|k| entries.contains_key(k));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::FrameReader;

    fn segment(n: usize) -> Vec<u8> {
        let mut frames = Vec::new();
        for i in 0..n {
            let (txn, payload) = (format!("t{i}"), format!("{i}"));
            let frame = crate::log::Frame {
                message_id: uuid::Uuid::now_v7(),
                trace_id: None,
                transaction_id: &txn,
                producer_sub: None,
                encrypted: false,
                payload: payload.as_bytes(),
            };
            frame.encode_into(&mut frames).unwrap();
        }
        crate::log::compress_frames(&frames, 3)
    }

    #[test]
    fn frames_are_found_from_any_index_and_cached_only_when_kept() {
        let blob = segment(5);
        let cache = FrameCache::new(1 << 20);
        let d = cache.frames(7, 100, 5, &blob, false).unwrap();
        assert_eq!(d.count(), 5);
        let third = FrameReader::new(d.from(2)).next().unwrap().unwrap();
        assert_eq!(third.transaction_id, "t2");
        assert!(d.from(5).is_empty());
        assert_eq!(cache.bytes(), 0, "a whole-segment delivery caches nothing");
        cache.frames(7, 100, 5, &blob, true).unwrap();
        assert!(cache.bytes() > 0);
        assert!(cache.frames(7, 100, 5, &[], false).is_ok(), "served from the cache without a blob");
        assert_eq!(cache.covering(7, 104).map(|(b, _)| b), Some(100));
        assert!(cache.covering(7, 105).is_none());
        cache.done(7, 100);
        assert_eq!(cache.bytes(), 0);
        assert!(cache.frames(7, 100, 5, &[], false).is_err(), "gone, and no blob to decode");
    }

    #[test]
    fn the_budget_evicts_the_oldest_segments() {
        let blob = segment(50);
        let one = Decoded::decode(&blob).unwrap().size();
        let cache = FrameCache::new(one * 2);
        for base in [0, 50, 100] {
            cache.frames(1, base, 50, &blob, true).unwrap();
        }
        assert!(cache.get(1, 0).is_none(), "the oldest made room");
        assert!(cache.get(1, 50).is_some() && cache.get(1, 100).is_some());
        assert!(cache.bytes() <= one * 2);
        assert_eq!(FrameCache::new(0).frames(1, 0, 50, &blob, true).map(|d| d.count()).unwrap(), 50);
    }
}
