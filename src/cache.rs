//! A broker's copy of per-queue settings that any broker may change: what
//! the pop timings and the encrypted-queue set share.
//!
//! A `/configure` on this broker changes the copy at once (after its commit);
//! a reload every `QUEEN_CACHE_REFRESH_INTERVAL_MS` brings changes made
//! through other brokers. The one rule that needs a home: a reload whose
//! query may predate a local change must not undo it. Every local change
//! counts a generation, a reload notes the generation before its query, and
//! it replaces the copy only when the count has not moved; otherwise the
//! next reload agrees with the local change. Most brokers configure few
//! queues this way, so a lookup on an empty copy is one atomic load.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// What a copy can hold: a map or a set, empty or not.
pub trait Collection: Default {
    fn is_empty(&self) -> bool;
}

impl<K: Hash + Eq, V> Collection for HashMap<K, V> {
    fn is_empty(&self) -> bool {
        HashMap::is_empty(self)
    }
}

impl<K: Hash + Eq> Collection for HashSet<K> {
    fn is_empty(&self) -> bool {
        HashSet::is_empty(self)
    }
}

/// The copy, its generation, and whether it holds anything.
#[derive(Default)]
pub struct Reloaded<T> {
    any: AtomicBool,
    value: Mutex<T>,
    generation: AtomicU64,
}

impl<T: Collection> Reloaded<T> {
    /// `f` on the copy; `None` without a lock when the copy is empty.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> Option<R>) -> Option<R> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        f(&self.value.lock().expect("cache lock poisoned"))
    }

    /// A local change, effective at once.
    pub fn change(&self, f: impl FnOnce(&mut T)) {
        let mut value = self.value.lock().expect("cache lock poisoned");
        self.generation.fetch_add(1, Ordering::SeqCst);
        f(&mut value);
        self.any.store(!value.is_empty(), Ordering::Relaxed);
    }

    /// Where a reload starts: pass it back with what the reload read.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The reloaded copy, unless a local change came after `since`.
    pub fn replace_unless_changed(&self, since: u64, fresh: T) {
        let mut value = self.value.lock().expect("cache lock poisoned");
        if self.generation.load(Ordering::SeqCst) == since {
            self.any.store(!fresh.is_empty(), Ordering::Relaxed);
            *value = fresh;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_that_started_before_a_local_change_does_not_undo_it() {
        let c: Reloaded<HashSet<&str>> = Reloaded::default();
        assert_eq!(c.read(|s| Some(s.len())), None, "empty: no lock, nothing");
        let since = c.generation();
        c.change(|s| {
            s.insert("configured-here");
        });
        c.replace_unless_changed(since, HashSet::new()); // read before the change
        assert_eq!(c.read(|s| Some(s.contains("configured-here"))), Some(true));
        let since = c.generation();
        c.replace_unless_changed(since, HashSet::from(["from-another-broker"]));
        assert_eq!(c.read(|s| Some(s.contains("from-another-broker"))), Some(true));
        assert_eq!(c.read(|s| Some(s.contains("configured-here"))), Some(false), "a later reload is the truth");
    }
}
